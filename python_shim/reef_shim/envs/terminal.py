"""The terminal environment: shell tasks in a sandbox directory, each with a checker.

The agent has one tool, `run_shell {command}`; each call runs in the episode's `Sandbox` and the
tool output (exit code, stdout, stderr, cut to the limit, and whether it was killed) is the next
state. When the model answers without a tool call, or the loop runs out of steps, the task's
checker reads the directory (without following links the agent made) and decides pass or fail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from .base import Outcome, StepResult, check_arguments, function_tool
from .sandbox import Limits, Sandbox

RUN_SHELL = function_tool(
    "run_shell",
    "Run a shell command (POSIX sh) in the task's working directory and get its exit code, stdout and stderr.",
    {"command": {"type": "string", "description": "the command line, e.g. `ls -la`"}},
    ["command"],
)

SYSTEM_PROMPT = (
    "You are working in a Linux shell. Use the run_shell tool to run commands in your working directory. "
    "When the task is done, reply with a short summary and no tool call."
)


@dataclass(frozen=True)
class ShellTask:
    id: str
    prompt: str
    files: dict[str, tuple[str, int]]  # relative path -> (content, mode), written before the first step
    check: Callable[[Sandbox], Outcome]


def _expect_file(rel: str, want: str) -> Callable[[Sandbox], Outcome]:
    def check(sb: Sandbox) -> Outcome:
        got = sb.read_file(rel)
        if got is None:
            return Outcome(False, f"{rel} is missing or not a regular file")
        # One trailing newline either way: `echo` adds one, `printf` need not.
        if got.rstrip("\n") == want.rstrip("\n"):
            return Outcome(True, f"{rel} holds the expected text")
        return Outcome(False, f"{rel} holds {got[:80]!r}, expected {want[:80]!r}")

    return check


def _expect_number(rel: str, want: int) -> Callable[[Sandbox], Outcome]:
    def check(sb: Sandbox) -> Outcome:
        got = sb.read_file(rel)
        if got is None:
            return Outcome(False, f"{rel} is missing or not a regular file")
        if re.fullmatch(r"\s*-?\d+\s*", got) and int(got) == want:
            return Outcome(True, f"{rel} holds {want}")
        return Outcome(False, f"{rel} holds {got.strip()[:40]!r}, expected {want}")

    return check


def _check_script(sb: Sandbox) -> Outcome:
    # The fixed script is the agent's code: it runs in the sandbox too, under the same limits.
    if sb.read_file("add.sh") is None:
        return Outcome(False, "add.sh is missing or not a regular file")
    r = sb.run("sh add.sh 17 25; sh add.sh -4 10", Limits(wall_s=5, output_bytes=1024))
    if r.exit_code == 0 and r.stdout.split() == ["42", "6"]:
        return Outcome(True, "add.sh prints 42 for 17 25 and 6 for -4 10")
    return Outcome(False, f"add.sh printed {r.stdout.strip()[:60]!r} (exit {r.exit_code}), expected 42 then 6")


def _check_moved(sb: Sandbox) -> Outcome:
    names = sb.listing()
    want_in = {"logs/a.log", "logs/b.log", "logs/c.log"}
    missing = sorted(want_in - set(names))
    stray = sorted(n for n in names if n.endswith(".log") and not n.startswith("logs/"))
    if missing or stray or sb.read_file("notes.txt") is None:
        return Outcome(False, f"missing {missing}, still outside logs/ {stray}, notes.txt kept: {sb.read_file('notes.txt') is not None}")
    if sb.read_file("logs/b.log") != "beta\n":
        return Outcome(False, "logs/b.log lost its content")
    return Outcome(True, "every .log file is in logs/ with its content, notes.txt stayed")


_LOG = "".join(f"{t} {'ERROR' if i % 7 == 3 else 'INFO'} request {i}\n"
               for i, t in enumerate(f"12:{m:02d}" for m in range(40)))
_NAMES = "carol\nalice\nbob\nalice\ndave\ncarol\nalice\n"

TASKS: tuple[ShellTask, ...] = (
    ShellTask("write-file", "Create a file named greeting.txt whose only line is: hello reef", {},
              _expect_file("greeting.txt", "hello reef\n")),
    ShellTask("count-errors", "Count the lines of app.log that contain the word ERROR, and write just that number to count.txt.",
              {"app.log": (_LOG, 0o644)}, _expect_number("count.txt", _LOG.count("ERROR"))),
    ShellTask("unique-names", "names.txt has one name per line, with repeats. Write the distinct names, sorted, one per line, to unique.txt.",
              {"names.txt": (_NAMES, 0o644)}, _expect_file("unique.txt", "alice\nbob\ncarol\ndave\n")),
    ShellTask("fix-script", "add.sh should print the sum of its two integer arguments (`sh add.sh 2 3` prints 5), but it is broken. Fix it.",
              {"add.sh": ('#!/bin/sh\necho $(( $1 - $2 ))\n', 0o755)}, _check_script),
    ShellTask("move-logs", "Move every .log file in the working directory into a new directory named logs. Leave other files where they are.",
              {"a.log": ("alpha\n", 0o644), "b.log": ("beta\n", 0o644), "c.log": ("gamma\n", 0o644), "notes.txt": ("keep\n", 0o644)},
              _check_moved),
)
TASKS_BY_ID = {t.id: t for t in TASKS}


class TerminalEnv:
    """One terminal episode at a time; `reset` makes a fresh sandbox and `close` deletes it."""

    name = "terminal"

    def __init__(self, limits: Limits | None = None, isolation: str = "auto", tasks: tuple[ShellTask, ...] = TASKS) -> None:
        self.limits = limits or Limits()
        self.isolation = isolation
        self._tasks = {t.id: t for t in tasks}
        self._task: ShellTask | None = None
        self.sandbox: Sandbox | None = None
        self.runs = 0

    def task_ids(self) -> list[str]:
        return list(self._tasks)

    def tools(self) -> list[dict[str, Any]]:
        return [RUN_SHELL]

    def reset(self, task_id: str) -> list[dict[str, Any]]:
        if task_id not in self._tasks:
            raise ValueError(f"terminal: unknown task {task_id!r} (known: {', '.join(self._tasks)})")
        self.close()
        self._task = self._tasks[task_id]
        self.sandbox = Sandbox(self.limits, self.isolation)
        for rel, (content, mode) in self._task.files.items():
            self.sandbox.write_file(rel, content, mode)
        self.runs = 0
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"{self._task.prompt}\n(Working directory: {self.sandbox.path})"}]

    def step(self, name: str, arguments: dict[str, Any]) -> StepResult:
        sb = self._live()
        if name != "run_shell":
            return StepResult(f"error: unknown tool {name!r}; the only tool is run_shell", ok=False)
        problem = check_arguments(RUN_SHELL, arguments)
        if problem is None and not arguments["command"].strip():
            problem = "argument 'command' is empty"
        if problem is not None:
            return StepResult(f"error: {problem}; call run_shell with {{\"command\": \"...\"}}", ok=False)
        self.runs += 1
        return StepResult(sb.run(arguments["command"]).as_tool_output(), ok=True)

    def finish(self, final_text: str | None) -> Outcome:
        assert self._task is not None
        return self._task.check(self._live())

    def info(self) -> dict[str, Any]:
        sb = self.sandbox
        return {"env": self.name, "task": self._task.id if self._task else None, "runs": self.runs,
                "isolation": sb.isolation if sb else None, "net_isolated": sb.net_isolated if sb else None}

    def _live(self) -> Sandbox:
        if self.sandbox is None:
            raise RuntimeError("terminal: step before reset")
        return self.sandbox

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
