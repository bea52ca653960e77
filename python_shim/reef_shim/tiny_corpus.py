"""The built-in text the tiny model's tokenizer is trained on.

Generated, not downloaded: a fixed `random.Random` over small word lists gives the same English,
arithmetic, markdown and JSON snippets on every machine, so the trained tokenizer is byte-identical
everywhere. The mix mirrors what the tiny model sees in tests: chat prose, numbers, tool-call JSON.
"""

from __future__ import annotations

import random

CORPUS_SEED = 20260311
_SUBJECTS = ["the agent", "a user", "the model", "our team", "the server", "a student", "the teacher",
             "this tool", "the judge", "my friend", "the trainer", "every reply"]
_VERBS = ["reads", "writes", "checks", "answers", "explains", "computes", "finds", "sends", "keeps",
          "updates", "returns", "opens", "saves", "builds", "tests", "prints", "loads", "counts"]
_OBJECTS = ["the file", "a message", "the weather", "some numbers", "the result", "a short list",
            "the answer", "each token", "the config", "a new version", "the report", "the records",
            "a question", "the first line", "the last step", "an error", "the city", "the time"]
_TAILS = ["today.", "again.", "for you.", "before lunch.", "in the morning.", "quickly.", "with care.",
          "and stops.", "without errors.", "step by step.", "when asked.", "every hour."]
_WORDS = ["hello", "thanks", "please", "yes", "no", "maybe", "sure", "great", "weather", "London",
          "Paris", "Tokyo", "search", "calculator", "function", "arguments", "name", "result", "value",
          "python", "code", "list", "number", "answer", "reason", "think", "because", "therefore",
          "first", "second", "then", "finally", "question", "tool", "call", "response", "error"]
_TOOLS = ["get_weather", "search_web", "calculator", "read_file", "write_file", "run_code", "send_email"]
_KEYS = ["city", "query", "expression", "path", "content", "code", "to", "units", "limit"]


def _sentence(rng: random.Random) -> str:
    s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}"
    return s[0].upper() + s[1:]


def _math(rng: random.Random) -> str:
    a, b = rng.randint(0, 999), rng.randint(1, 99)
    op = rng.choice(["+", "-", "*", "/"])
    value = {"+": a + b, "-": a - b, "*": a * b, "/": round(a / b, 3)}[op]
    return rng.choice([f"{a} {op} {b} = {value}", f"We have {a} {op} {b}, so the answer is {value}.",
                       f"Let x = {a}. Then x {op} {b} = {value}.", f"$${a} {op} {b} = {value}$$"])


def _markdown(rng: random.Random) -> str:
    title = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3))).title()
    items = "\n".join(f"- {rng.choice(_WORDS)} {rng.choice(_WORDS)}" for _ in range(rng.randint(2, 4)))
    code = f"```python\ndef {rng.choice(_TOOLS)}(x):\n    return x {rng.choice(['+', '*'])} {rng.randint(1, 9)}\n```"
    return rng.choice([f"# {title}\n\n{items}", f"## {title}\n\n**{rng.choice(_WORDS)}**: {_sentence(rng)}",
                       f"{_sentence(rng)}\n\n{code}", f"1. {_sentence(rng)}\n2. {_sentence(rng)}",
                       f"> {_sentence(rng)}\n\n| a | b |\n|---|---|\n| {rng.randint(0, 9)} | {rng.randint(0, 9)} |"])


def _tool_json(rng: random.Random) -> str:
    key = rng.choice(_KEYS)
    val = rng.choice([f'"{rng.choice(_WORDS)}"', str(rng.randint(0, 500))])
    return f'{{"name": "{rng.choice(_TOOLS)}", "arguments": {{"{key}": {val}}}}}'


def corpus(n_docs: int = 6000) -> list[str]:
    """A deterministic list of short documents (same list on every call and machine)."""
    rng = random.Random(CORPUS_SEED)
    makers = [_sentence, _sentence, _math, _markdown, _tool_json]
    docs = []
    for _ in range(n_docs):
        parts = [rng.choice(makers)(rng) for _ in range(rng.randint(1, 4))]
        docs.append(rng.choice([" ", "\n", "\n\n"]).join(parts))
    return docs
