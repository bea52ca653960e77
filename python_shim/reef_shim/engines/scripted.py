"""Scripted replies for the `hf` engine (`--scripted-outputs FILE`): a stand-in for a policy.

A small CPU model cannot call tools, so an agent episode run with it never gets past its first
reply, and nothing in the step-wise reward path would run. With a script, a *sampled* request
(temperature at or above `GREEDY_BELOW`) whose prompt matches a rule is answered with one of that
rule's replies, forced token by token: at each position the model still runs, and the reported
logprob and top-K are the model's own for the forced token. The record then holds real token
ids and real logprobs of the served weights, so the trainer trains on them exactly as on sampled
output. Greedy requests (temperature 0) are never scripted: they show the model's own policy,
which is what an evaluation measures.

    {"rules": [{"when": ["hello reef", "exit code 0"], "replies": ["Done."]},
               {"when": ["hello reef"], "replies": ["<tool_call>...</tool_call>", "..."]}]}

The first rule all of whose `when` strings occur in the decoded prompt applies; its replies are
used in turn (round-robin, per rule, across requests), so parallel rollouts of one task get
different replies in fixed proportions. A prompt no rule matches is sampled as usual.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ScriptError(ValueError):
    """The script file is unreadable or malformed; the message names the file and the key."""


@dataclass(frozen=True)
class Rule:
    when: tuple[str, ...]
    replies: tuple[str, ...]


class Script:
    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self._next = [0] * len(rules)
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path) -> "Script":
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ScriptError(f"--scripted-outputs {path}: {e}") from None
        return cls.parse(raw, str(path))

    @classmethod
    def parse(cls, raw: Any, where: str = "script") -> "Script":
        if not isinstance(raw, dict) or set(raw) != {"rules"} or not isinstance(raw["rules"], list) or not raw["rules"]:
            raise ScriptError(f"{where}: expected an object {{\"rules\": [...]}} with at least one rule and no other key")
        rules = []
        for i, r in enumerate(raw["rules"]):
            at = f"{where}: rules[{i}]"
            if not isinstance(r, dict) or set(r) != {"when", "replies"}:
                raise ScriptError(f"{at}: expected an object with exactly the keys when and replies")
            when, replies = r["when"], r["replies"]
            if not isinstance(when, list) or not when or not all(isinstance(w, str) and w for w in when):
                raise ScriptError(f"{at}.when: expected a list of non-empty strings")
            if not isinstance(replies, list) or not replies or not all(isinstance(t, str) and t for t in replies):
                raise ScriptError(f"{at}.replies: expected a list of non-empty strings")
            rules.append(Rule(tuple(when), tuple(replies)))
        return cls(rules)

    def reply_for(self, prompt_text: str) -> str | None:
        """The next reply of the first rule matching `prompt_text`, or None (sample as usual)."""
        for i, rule in enumerate(self.rules):
            if all(w in prompt_text for w in rule.when):
                with self._lock:
                    n = self._next[i]
                    self._next[i] = n + 1
                return rule.replies[n % len(rule.replies)]
        return None


__all__ = ["Rule", "Script", "ScriptError"]
