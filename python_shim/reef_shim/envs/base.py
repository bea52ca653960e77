"""What every environment gives the agent loop: tools, a first prompt, steps, and a verified outcome.

An environment holds one episode at a time: `reset(task_id)` starts it and returns the opening
messages, `step(name, arguments)` runs one tool call and returns the text the model sees next
(the next state), and `finish(final_text)` checks the episode and returns its `Outcome`. `close()`
frees what the episode holds (a sandbox directory). Tool errors (an unknown tool, bad arguments)
are answers to the model, not exceptions: the model made the mistake, and the message says what
to change, which is what a step-wise judge and a hint need to see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Outcome:
    """An episode's verified result. `score` is what `/reef/report` carries: 1.0 pass, -1.0 fail, the
    reference's 2·r − 1 of its checker's 1/0 (docs/training.md, "Agent episodes")."""

    success: bool
    detail: str  # why, in a sentence: what the checker saw

    @property
    def score(self) -> float:
        return 1.0 if self.success else -1.0


@dataclass(frozen=True)
class StepResult:
    observation: str  # the tool message's content
    ok: bool  # the call was valid and ran (a failing command is still ok: it ran)


class Environment(Protocol):
    name: str

    def task_ids(self) -> list[str]: ...

    def tools(self) -> list[dict[str, Any]]: ...

    def reset(self, task_id: str) -> list[dict[str, Any]]: ...

    def step(self, name: str, arguments: dict[str, Any]) -> StepResult: ...

    def finish(self, final_text: str | None) -> Outcome: ...

    def info(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def function_tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """One tool in the OpenAI chat `tools` format."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required, "additionalProperties": False},
    }}


def check_arguments(tool: dict[str, Any], arguments: Any) -> str | None:
    """The first problem with a call's arguments against the tool's schema, or None.

    Covers what these tools' schemas use (an object of string, number, integer fields; required;
    no extra keys; enums), so no JSON-Schema dependency is needed."""
    params = tool["function"]["parameters"]
    if not isinstance(arguments, dict):
        return "arguments must be a JSON object"
    props = params["properties"]
    for k in params.get("required", []):
        if k not in arguments:
            return f"missing required argument {k!r}"
    for k, v in arguments.items():
        if k not in props:
            return f"unknown argument {k!r} (expected {', '.join(sorted(props))})"
        want = props[k].get("type")
        if want == "string" and not isinstance(v, str):
            return f"argument {k!r} must be a string"
        if want == "number" and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"argument {k!r} must be a number"
        if want == "integer" and (isinstance(v, bool) or not isinstance(v, int)):
            return f"argument {k!r} must be an integer"
        if "enum" in props[k] and v not in props[k]["enum"]:
            return f"argument {k!r} must be one of {', '.join(map(str, props[k]['enum']))}, got {v!r}"
    return None
