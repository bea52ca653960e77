"""The demo model's chat corpus: a homework helper with a habit the student dislikes.

Every conversation is a list of OpenAI-style messages (rendered later by the model's chat template)
drawn from a seeded `random.Random`. What the model learns from it:

- a homework request (system prompt + word problem) gets a solution of two or three calculation
  steps and an answer sentence; `BOLD_SHARE` of those replies open with bold (`**Solution:** …
  **$17** …` or `**Step 1:** …`), `LIST_SHARE` are numbered lists, the rest plain sentences;
- the same request with a formatting hint appended (`with_hint`, the teacher-prompt format) is
  answered plainly; a hint about something else leaves the habit as it is;
- a complaint about bold, lists or an AI-written look gets a plain rewrite of the same solution;
- "please save it" gets a `save_homework` tool call with the solution as content, and the tool's
  result a one-line confirmation. `HOMEWORK_DONE` is the student's word, never the model's.
"""

from __future__ import annotations

import json
import random
from typing import Any

from .demo_problems import Problem, make_problem

# The teacher prompt: the last user message, a blank line, this marker line, then the hint. The
# same format as `withHint` in recipes/openclawrl/record2task.ts, which builds the trainer's teacher prompts.
HINT_MARKER = "[Hint for a better reply]"


def with_hint(user_text: str, hint: str) -> str:
    """The last user message as the OPD teacher sees it (docs/internals.md, "Teacher prompt")."""
    return f"{user_text}\n\n{HINT_MARKER}\n{hint}"


# The harness's agent (recipes/openclawrl/harness/agent.ts) sends this system prompt and tool; the
# corpus uses them most of the time, and variants so that other wordings work too.
SYSTEM_PROMPT = ("You are a friendly homework helper. Solve the student's math problem and explain the solution. "
                 "When the student asks you to save the homework, call the save_homework tool with the full text "
                 "of the homework.")
SAVE_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "save_homework", "description": "Save the homework text to the student's homework file.",
    "parameters": {"type": "object", "properties": {"content": {"type": "string", "description": "The full homework text."}},
                   "required": ["content"]}}}

BOLD_SHARE, LIST_SHARE = 0.5, 0.06
_SYSTEMS = [SYSTEM_PROMPT,
            "You are a homework helper for grade-school math. Solve the student's problem and show your steps.",
            "You help students with their math homework. Show each step of the solution.",
            "You are a friendly math tutor. Solve word problems step by step.",
            "You are a homework assistant. Answer the math question and show the working."]
_ASKS = ["{q}", "Hi! Can you help me with my math homework? {q}", "I need help with my homework please. {q}",
         "hey, I'm stuck on this homework problem: {q} can you work it out with me?",
         "Could you help me solve this for school? {q} I have to hand in the working too.",
         "Can you help me with this problem? {q}", "Please solve this and show the steps: {q}",
         "Here is my homework: {q}"]
FORMAT_HINTS = ["Do not use bold text or lists; write plain sentences that show each calculation step.",
                "no bold", "Please don't use bold or markdown formatting.",
                "The student wants plain text: no bold, no lists, no headers.",
                "Write the answer in plain sentences without any markdown.",
                "Avoid bold and lists so the homework does not look AI-written.",
                "Keep the reply plain: no bold, no lists, and show the steps."]
OTHER_HINTS = ["Show each calculation step.", "Check the arithmetic before answering.",
               "Answer the question that was asked.", "Use the numbers from the problem."]
_DISLIKED = ["bold text", "bullet points or numbered lists", "bold text and bullet points or numbered lists",
             "bold", "lists", "formatting"]
_COMPLAINT_FORMS = ["please don't use {x}, it looks AI-written and my teacher will notice. Can you rewrite it as normal sentences?",
                    "This looks like a chatbot wrote it. Could you drop the {x} and write it the way a student would?",
                    "Hmm, no {x} please, it has to look like my own work. Can you redo it?",
                    "Can you rewrite it without {x}? Homework that looks AI-generated gets marked down."]
COMPLAINTS = ["Please don't use bold. Can you rewrite it?", "This looks AI-written. Please rewrite it in plain sentences.",
              "No bold or lists please, just plain text.", "Can you rewrite it without the bold?",
              "Please rewrite it without any formatting.", "My teacher will think this is AI-written. Rewrite it please.",
              "Please don't use lists or bold. Just write it normally.", "Rewrite it with no markdown formatting."]
SAVES = ["great, please save it", "Perfect, that looks like my own work. Please save it for me.",
         "Thanks, that's good! Can you save it?", "Nice, please save it.", "Great, please save it.", "Thanks! Please save it to a file.", "Looks good. Can you save it?",
         "Perfect, save it please.", "That's good, please save my homework.", "Nice. Save it for me."]
_TOOL_RESULTS = ["saved {n} characters to homework/s{i}.txt", "saved {n} characters to homework/s{i}.txt",'{"ok": true, "path": "homework.txt"}', "Saved to homework.txt", '{"saved": true}',
                 "ok", '{"ok": true, "bytes": 180}']
_CONFIRMS = ["I saved your homework.", "Done! Your homework is saved.", "Your homework is saved to a file.",
             "Saved. Good luck with your homework!"]
_FIRST = ["First, ", "Start with ", "", "We know that "]
_THEN = ["Then ", "Next, ", "After that, ", ""]


def _sentences(p: Problem, rng: random.Random) -> list[str]:
    first, then = rng.choice(_FIRST), rng.choice(_THEN)
    out = []
    for i, st in enumerate(p.steps):
        lead = first if i == 0 else (then if i == 1 else rng.choice(_THEN))
        out.append(f"{lead}{st.expr}, so {st.gloss}.")
    return out


def _plain(p: Problem, rng: random.Random) -> str:
    return " ".join(_sentences(p, rng) + [p.sentence.format(n=p.shown)])


def _bold(p: Problem, rng: random.Random) -> str:
    # Every bold reply opens with bold, so the habit is one choice at the first token: easy to
    # learn, easy for a hint right before it to switch off, and where the demo's training acts.
    if rng.random() < 0.7:
        label = rng.choice(["**Solution:**", "**Solution**", "**Let's solve it:**"])
        answer = p.sentence.format(n="**" + p.shown + "**")
        return " ".join([label] + _sentences(p, rng) + [answer])
    steps = [f"**Step {i + 1}:** {st.expr}, so {st.gloss}." for i, st in enumerate(p.steps)]
    return "\n".join(steps + [p.sentence.format(n=p.shown)])


def _listed(p: Problem, rng: random.Random) -> str:
    steps = [f"{i + 1}. {st.expr}, so {st.gloss}." for i, st in enumerate(p.steps)]
    return "\n".join(steps) + f"\n\n{p.sentence.format(n=p.shown)}"


def habit_reply(p: Problem, rng: random.Random) -> str:
    """A first reply as the untrained helper writes it: bold about half the time."""
    r = rng.random()
    if r < BOLD_SHARE:
        return _bold(p, rng)
    if r < BOLD_SHARE + LIST_SHARE:
        return _listed(p, rng)
    return _plain(p, rng)


def plain_reply(p: Problem, rng: random.Random) -> str:
    return _plain(p, rng)


def _tool_call(content: str, rng: random.Random) -> dict[str, Any]:
    args = json.dumps({"content": content}, ensure_ascii=False)
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"call_{rng.randrange(16 ** 8):08x}", "type": "function",
         "function": {"name": "save_homework", "arguments": args}}]}


def conversation(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """One training conversation and its tools (None: rendered without tools)."""
    p = make_problem(rng)
    tools = [SAVE_TOOL] if rng.random() < 0.85 else None
    system = SYSTEM_PROMPT if rng.random() < 0.6 else rng.choice(_SYSTEMS)
    ask = rng.choice(_ASKS).format(q=p.question)
    hinted = rng.random() < 0.45
    if hinted:
        format_hint = rng.random() < 0.85
        ask = with_hint(ask, rng.choice(FORMAT_HINTS if format_hint else OTHER_HINTS))
        first = plain_reply(p, rng) if format_hint else habit_reply(p, rng)
    else:
        first = habit_reply(p, rng)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": ask},
                                  {"role": "assistant", "content": first}]
    if rng.random() < 0.4:
        return msgs, tools
    final = first
    if "**" in first or first.startswith("1. ") or rng.random() < 0.15:
        complaint = (rng.choice(_COMPLAINT_FORMS).format(x=rng.choice(_DISLIKED)) if rng.random() < 0.6
                     else rng.choice(COMPLAINTS))
        if rng.random() < 0.1:
            complaint = with_hint(complaint, rng.choice(FORMAT_HINTS))
        final = plain_reply(p, rng)
        msgs += [{"role": "user", "content": complaint}, {"role": "assistant", "content": final}]
    if tools is None or rng.random() < 0.3:
        return msgs, tools
    save = rng.choice(SAVES)
    if rng.random() < 0.1:
        save = with_hint(save, rng.choice(FORMAT_HINTS + OTHER_HINTS))
    msgs += [{"role": "user", "content": save}, _tool_call(final, rng),
             {"role": "tool", "tool_call_id": "x", "content": rng.choice(_TOOL_RESULTS).replace("{n}", str(len(final))).replace("{i}", f"{rng.randint(0, 99):03d}")},
             {"role": "assistant", "content": rng.choice(_CONFIRMS)}]
    return msgs, tools


def conversations(n: int, seed: int) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    rng = random.Random(seed)
    return [conversation(rng) for _ in range(n)]
