"""The agent loop: one episode of an environment, driven through the gateway's OpenAI chat API.

Each request carries the episode's session and group tags (`x-reef-tag-session`,
`x-reef-tag-group`), so the gateway groups the episode's turns as one session and parallel
rollouts of a task as one group. Every tool result goes back as a `tool` message: that is the
step's next state. When the model answers without a tool call, or `max_steps` requests were
made, the environment checks the outcome, and the loop files it with `POST /reef/report`,
referencing every receipt (`x-reef-agent-record-id`) the episode's requests returned.

Only the standard library's HTTP client is used, so a Ray worker needs nothing beyond the shim.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

from .base import Environment

log = logging.getLogger("reef_shim.envs.agent")

RECEIPT_HEADER = "x-reef-agent-record-id"


class GatewayError(RuntimeError):
    """A request to the gateway failed; `status` is the HTTP status (None: no answer at all)."""

    def __init__(self, url: str, status: int | None, body: str) -> None:
        super().__init__(f"{url}: {'no answer' if status is None else f'HTTP {status}'}: {body[:300]}")
        self.status = status
        self.body = body


@dataclass
class Step:
    """One assistant turn: its receipt, the tool calls it made and what each returned."""

    index: int
    receipt: str | None
    tool_calls: list[dict[str, Any]]  # [{name, arguments (the raw string), ok, observation}]
    content: str | None


@dataclass
class EpisodeResult:
    env: str
    task: str
    session: str
    group: str | None
    success: bool
    score: float
    detail: str
    steps: list[Step]
    receipts: list[str]
    stopped: str  # "answered" (a reply without a tool call) or "max-steps"
    info: dict[str, Any]
    report: dict[str, Any] | None = None  # the gateway's answer to the report, when one was filed
    error: str | None = None  # the gateway or the model failed mid-episode; the outcome is still checked
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def post_json(url: str, body: dict[str, Any], headers: dict[str, str], timeout_s: float) -> tuple[dict[str, Any], dict[str, str]]:
    """POSTs JSON and returns (parsed body, lower-cased headers); an HTTP error is a `GatewayError`."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
            hdrs = {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as e:
        raise GatewayError(url, e.code, e.read().decode("utf-8", "replace")) from None
    except (urllib.error.URLError, OSError) as e:
        raise GatewayError(url, None, str(e)) from None
    try:
        return json.loads(raw), hdrs
    except ValueError:
        raise GatewayError(url, 200, f"answer is not JSON: {raw[:200]!r}") from None


def _client_id(text: str) -> str:
    """The report's client id: the gateway takes 1 to 128 printable ASCII characters, no spaces."""
    return re.sub(r"[^\x21-\x7e]", "_", text)[:128]


def _parse_arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    if isinstance(raw, dict):
        return raw, None
    if not isinstance(raw, str):
        return None, "arguments must be a JSON object encoded as a string"
    try:
        args = json.loads(raw or "{}")
    except ValueError as e:
        return None, f"arguments are not valid JSON ({e.msg} at character {e.pos})"
    if not isinstance(args, dict):
        return None, "arguments must be a JSON object"
    return args, None


def run_episode(base_url: str, model: str, env: Environment, task_id: str, *, session: str, group: str | None = None,
                headers: dict[str, str] | None = None, max_steps: int = 8, timeout_s: float = 120.0,
                report: bool = True, sampling: dict[str, Any] | None = None) -> EpisodeResult:
    """Runs one episode of `task_id` in `env` against the gateway at `base_url` (no `/v1`).

    `headers` are sent on every request (an `authorization`, an `x-reef-scenario`); the session
    and group tags are added here. `sampling` is merged into each chat body (`temperature`,
    `max_tokens`). The environment is reset here and left open; the caller closes it."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    base = base_url.rstrip("/")
    hdrs = {**(headers or {}), "x-reef-tag-session": session}
    if group is not None:
        hdrs["x-reef-tag-group"] = group
    started = time.monotonic()
    messages = env.reset(task_id)
    tools = env.tools()
    steps: list[Step] = []
    receipts: list[str] = []
    final_text: str | None = None
    stopped = "max-steps"
    error: str | None = None
    for i in range(max_steps):
        body = {"model": model, "messages": messages, "tools": tools, "tool_choice": "auto", **(sampling or {})}
        try:
            answer, rh = post_json(f"{base}/v1/chat/completions", body, hdrs, timeout_s)
            message = answer["choices"][0]["message"]
        except GatewayError as e:
            error = str(e)
            break
        except (KeyError, IndexError, TypeError):
            error = f"chat completion without choices[0].message: {json.dumps(answer)[:200]}"
            break
        receipt = rh.get(RECEIPT_HEADER)
        if receipt:
            receipts.append(receipt)
        calls = message.get("tool_calls") or []
        content = message.get("content")
        step = Step(index=i, receipt=receipt, tool_calls=[], content=content)
        steps.append(step)
        assistant: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            assistant["tool_calls"] = calls
        messages.append(assistant)
        if not calls:
            final_text = content
            stopped = "answered"
            break
        for n, call in enumerate(calls):
            fn = call.get("function") or {}
            name, raw = fn.get("name"), fn.get("arguments")
            args, problem = _parse_arguments(raw)
            if problem is not None or not isinstance(name, str):
                observation, ok = f"error: {problem or 'the tool call names no function'}", False
            else:
                result = env.step(name, args)
                observation, ok = result.observation, result.ok
            step.tool_calls.append({"name": name, "arguments": raw, "ok": ok, "observation": observation})
            messages.append({"role": "tool", "tool_call_id": call.get("id") or f"call_{i}_{n}", "content": observation})
    outcome = env.finish(final_text)
    info = env.info()
    result = EpisodeResult(env=info.get("env", getattr(env, "name", "?")), task=task_id, session=session, group=group,
                           success=outcome.success, score=outcome.score, detail=outcome.detail, steps=steps,
                           receipts=receipts, stopped=stopped, info=info, error=error)
    if report:
        body = {"score": outcome.score, "references": receipts,
                "feedback": outcome.detail,
                "metadata": {"kind": "episode-outcome", "env": result.env, "task": task_id, "session": session,
                             "group": group, "success": outcome.success, "steps": len(steps), "stopped": stopped,
                             "error": error, **{k: v for k, v in info.items() if k not in ("env", "task")}},
                # One report per episode, even when a retry resends it: the gateway is idempotent by it.
                "agent_record_id": _client_id(f"outcome-{session}")}
        try:
            result.report, _ = post_json(f"{base}/reef/report", body, headers or {}, timeout_s)
        except GatewayError as e:
            result.error = f"{error + '; ' if error else ''}report: {e}"
    result.wall_s = time.monotonic() - started
    return result
