"""The rules of the rule-following PRM double: read a judge prompt, answer as a PRM would.

Reading the prompt. The judge fills `recipes/openclawrl/prompts/{score,hint}.md` (placeholders
`{{context}}`, `{{reply}}`, `{{next_role}}`, `{{next_state}}`) and sends it as one user message,
rendered by the PRM's chat template (`/generate`) or as OpenAI messages. `JudgePrompt.parse` turns
each template into a pattern (its literal text, placeholders as wildcards) and matches it inside
whatever arrived, so the wording can change without touching this file; the template whose text
matches gives the kind (score or hint). Without the templates, or when none matches, it falls
back to the section header `=== What came next (from the <role>) ===` (next state: what follows
it up to the next blank line), and failing that to the last ChatML user block; the kind is then
`hint` when the prompt mentions `[HINT_START]`.

The rules, on the next state (case-insensitive), first match wins:

| next state | score | hint vote |
| --- | --- | --- |
| a tool result that reports an error | -1 | +1, `TOOL_HINT` |
| any other tool result | +1 | -1, no hint |
| user says the file was not saved | -1 | +1, `SAVE_HINT` |
| user says the reply was empty | -1 | +1, `EMPTY_HINT` |
| user asks for the answer at the end ("still need the answer", "finish with the number") | -1 | +1, `ANSWER_HINT` |
| user complains about format: bold, lists, bullets, headings, markdown, formatting, "AI-written", chatbot | -1 | +1, `FORMAT_HINT` |
| user asks to redo / rewrite / show the calculations or steps | -1 | +1, `STEPS_HINT` |
| user says the reply was wrong | -1 | +1, `CHECK_HINT` |
| user thanks, moves on, asks to save, says `HOMEWORK_DONE` | +1 | -1, no hint (*) |
| anything else | 0 | -1, no hint |

Each hint is one of several paraphrases (`*_HINTS`), picked by a hash of the next state, so the
same prompt always gets the same text while different turns get different wordings; the format
hint names the formatting the user named (`{x}`: "headings", "bold text", ...). They are plain
instructions written for a general model: no model here was trained on them, and the judge's hint
prompt (recipes/openclawrl/prompts/hint.md) does not use them as its example. `FORMAT_HINT` and the
other `*_HINT` names are the first wording of each set.

(*) With the judge's decision table (ARCHITECTURE §2 step 5) an accepted turn then trains as an
anchor: reward +1, the plain prompt as teacher. `accept_hint` (`--accept-hint TEXT`) instead
answers `\\boxed{1}` with that hint when the accepted reply itself had no bold and no list, so
accepted plain replies train toward the hinted teacher as well.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

FORMAT_HINTS = (
    "Write the solution as ordinary sentences in one or two paragraphs, without {x}.",
    "Reply in plain prose, the way a student would write it by hand; do not use {x}.",
    "Keep the explanation to normal sentences and leave out {x}.",
    "The user wants text that does not look machine-made: plain sentences and no {x}.",
)
STEPS_HINTS = (
    "Write out every calculation step in plain sentences, like 3 × 4 = 12, and end with the answer.",
    "Show the working as sentences with each calculation written out, then give the answer.",
)
ANSWER_HINTS = (
    "End the reply with a sentence that gives the final answer as a number.",
    "Finish by stating the answer to the question in one short sentence with the number.",
)
EMPTY_HINTS = ("Give the full solution in plain sentences, showing each calculation step and the answer.",)
SAVE_HINTS = ("When the student asks to save, call save_homework with the full homework text as content.",)
CHECK_HINTS = ("Check the arithmetic of every step before giving the answer.",)
TOOL_HINTS = ('Call save_homework with JSON arguments {"content": "<the full homework text>"}.',)
# What the user may name, and how a hint names it; the order is the order a hint lists them in.
_NAMED = (
    (re.compile(r"\bbold", re.I), "bold text"),
    (re.compile(r"heading|header", re.I), "headings"),
    (re.compile(r"\blists?\b|bullet|numbered", re.I), "lists"),
    (re.compile(r"\btables?\b", re.I), "tables"),
    (re.compile(r"horizontal (?:lines?|rules?)", re.I), "horizontal lines"),
    (re.compile(r"\\boxed", re.I), "a \\boxed answer"),
    (re.compile(r"final answer", re.I), 'a "Final answer:" line'),
)


def _pick(options: tuple[str, ...], key: str) -> str:
    """One of `options`, the same one for the same `key` (a hash, not Python's salted hash())."""
    return options[int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") % len(options)]


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def format_hint(next_state: str) -> str:
    """A format hint that names what the user named (markdown formatting when they named nothing)."""
    named = [name for pattern, name in _NAMED if pattern.search(next_state)]
    return _pick(FORMAT_HINTS, next_state).format(x=_listed(named) if named else "markdown formatting")


FORMAT_HINT = FORMAT_HINTS[0].format(x="bold text or lists")
STEPS_HINT, ANSWER_HINT, EMPTY_HINT = STEPS_HINTS[0], ANSWER_HINTS[0], EMPTY_HINTS[0]
SAVE_HINT, CHECK_HINT, TOOL_HINT = SAVE_HINTS[0], CHECK_HINTS[0], TOOL_HINTS[0]

_FORMAT = re.compile(r"\bbold|\blists?\b|bullet|numbered|heading|header|markdown|formatting|\bformat\b|"
                     r"ai[- ](?:written|generated)|chatbot|\btables?\b|\\boxed|final answer", re.I)
_REDO = re.compile(r"rewrite|re-?do\b|show (?:the|your) (?:calculations|work|steps)|write out|add the steps|"
                   r"the working|calculations", re.I)
_EMPTY = re.compile(r"did(?: not|n't) write anything|still need the solution|empty reply", re.I)
_NO_ANSWER = re.compile(r"still need the answer|finish (?:it )?with the (?:final )?(?:number|answer)|"
                        r"what(?:'s| is) the answer", re.I)
_NOT_SAVED = re.compile(r"did(?: not|n't) save|don't see the file|do not see the file|not saved", re.I)
_WRONG = re.compile(r"\bwrong\b|mistake|incorrect|not (?:right|correct)|doesn't add up", re.I)
_ACCEPT = re.compile(r"thank|thanks|great|perfect|nice|got it|looks good|that's good|\bsave\b|homework_done|"
                     r"\bok(?:ay)?\b|correct|right", re.I)
_TOOL_ERROR = re.compile(r"\berror\b|\bfail|exception|not found|invalid|denied", re.I)
_BOLD = re.compile(r"\*\*[^*\n]+\*\*|__[^_\n]+__")
_LIST = re.compile(r"^\s*(?:\d+[.)]|[-*+])\s+\S", re.M)
_HEADER = re.compile(r"^=+ What came next \(from the (\w+)\) =+\n", re.M)
_CHATML_USER = re.compile(r"<\|im_start\|>user\n(.*?)(?:<\|im_end\|>|$)", re.S)
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@dataclass
class Turn:
    kind: str              # "score" | "hint"
    next_role: str         # "user" | "tool" (best guess in fallbacks)
    next_state: str
    reply: str | None      # None when the prompt could not be split into sections


def _pattern(template: str) -> re.Pattern[str]:
    parts, at = [], 0
    for m in _PLACEHOLDER.finditer(template):
        parts.append(re.escape(template[at:m.start()]))
        # Fields may hold anything; the last one is greedy up to the template's closing text.
        parts.append(f"(?P<{m.group(1)}>.*?)" if m.group(1) != "next_state" else "(?P<next_state>.*)")
        at = m.end()
    parts.append(re.escape(template[at:].rstrip()))
    return re.compile("".join(parts), re.S)


class JudgePrompt:
    def __init__(self, prompts_dir: Path | None) -> None:
        self.patterns: list[tuple[str, re.Pattern[str]]] = []
        for kind in ("hint", "score"):
            path = prompts_dir / f"{kind}.md" if prompts_dir is not None else None
            if path is not None and path.is_file():
                self.patterns.append((kind, _pattern(path.read_text(encoding="utf-8"))))

    def parse(self, text: str) -> Turn:
        text = text.replace("\r\n", "\n")
        for kind, pat in self.patterns:
            m = pat.search(text)
            if m:
                return Turn(kind, m.group("next_role") if "next_role" in pat.groupindex else "user",
                            m.group("next_state").strip(), m.group("reply") if "reply" in pat.groupindex else None)
        kind = "hint" if "[HINT_START]" in text else "score"
        headers = list(_HEADER.finditer(text))
        if headers:
            rest = text[headers[-1].end():]
            return Turn(kind, headers[-1].group(1), rest.split("\n\n", 1)[0].strip(), None)
        blocks = _CHATML_USER.findall(text)
        block = (blocks[-1] if blocks else text).strip()
        role = "tool" if "<tool_response>" in block else "user"
        return Turn(kind, role, block.split("\n\n")[-1].strip(), None)


def judge(turn: Turn, accept_hint: str | None = None) -> tuple[int, str | None, str]:
    """(score, hint or None, reason) by the table in the module docstring."""
    s = turn.next_state
    if turn.next_role == "tool" or s.lstrip().startswith("<tool_response>"):
        if _TOOL_ERROR.search(s):
            return -1, _pick(TOOL_HINTS, s), "the tool reported an error"
        return 1, None, "the tool succeeded"
    if _NOT_SAVED.search(s):
        return -1, _pick(SAVE_HINTS, s), "the student says the homework was not saved"
    if _EMPTY.search(s):
        return -1, _pick(EMPTY_HINTS, s), "the student got no solution"
    if _NO_ANSWER.search(s):
        return -1, _pick(ANSWER_HINTS, s), "the student still needs the answer"
    if _FORMAT.search(s):
        return -1, format_hint(s), "the student complains about the formatting"
    if _REDO.search(s):
        return -1, _pick(STEPS_HINTS, s), "the student asks for a redo with the steps shown"
    if _WRONG.search(s):
        return -1, _pick(CHECK_HINTS, s), "the student corrects the reply"
    if _ACCEPT.search(s):
        plain = turn.reply is not None and not _BOLD.search(turn.reply) and not _LIST.search(turn.reply)
        return 1, (accept_hint if accept_hint and plain else None), "the student accepts the reply and moves on"
    return 0, None, "the next state says nothing either way"


def answer(turn: Turn, accept_hint: str | None = None) -> str:
    """The PRM's reply text: a one-line reason and the verdict (and a hint for hint votes)."""
    score, hint, reason = judge(turn, accept_hint)
    if turn.kind == "score":
        return f"{reason[0].upper()}{reason[1:]}.\n\\boxed{{{score}}}"
    if hint is None:
        return f"{reason[0].upper()}{reason[1:]}; there is no useful hindsight.\n\\boxed{{-1}}"
    return f"[HINT_START]{hint}[HINT_END]\n\\boxed{{1}}"
