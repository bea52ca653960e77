"""Every task's checker passes a correct solution and fails a wrong one; tool errors are answers."""

from __future__ import annotations

import pytest

from envs_fake_chat import FakeChat, SOLUTIONS
from reef_shim.envs import terminal, toolcall
from reef_shim.envs.agent import run_episode
from reef_shim.envs.sandbox import Limits
from reef_shim.envs.toolcall import ToolCallEnv, calculate, convert, last_number

WRONG_SHELL = {
    "write-file": ["echo 'hello world' > greeting.txt"],
    "count-errors": ["grep -c INFO app.log > count.txt"],
    "unique-names": ["sort names.txt > unique.txt"],
    "fix-script": ["true"],
    "move-logs": ["mkdir logs && cp *.log logs/"],
}
LIMITS = Limits(wall_s=5, output_bytes=4096)


def test_every_task_has_a_solution_and_a_wrong_one():
    assert set(SOLUTIONS) == set(terminal.TASKS_BY_ID) | set(toolcall.TASKS_BY_ID)
    assert set(WRONG_SHELL) == set(terminal.TASKS_BY_ID)


@pytest.mark.parametrize("task", list(terminal.TASKS_BY_ID))
def test_terminal_checker_passes_right_and_fails_wrong(task):
    env = terminal.TerminalEnv(LIMITS)
    try:
        env.reset(task)
        calls, final = SOLUTIONS[task]
        for name, args in calls:
            assert env.step(name, args).ok
        right = env.finish(final)
        env.reset(task)
        for cmd in WRONG_SHELL[task]:
            env.step("run_shell", {"command": cmd})
        wrong = env.finish("done")
    finally:
        env.close()
    assert right.success and right.score == 1.0, right.detail
    assert not wrong.success and wrong.score == -1.0, wrong.detail


def test_a_link_to_the_right_content_outside_does_not_pass(tmp_path):
    outside = tmp_path / "answer"
    outside.write_text("hello reef\n")
    env = terminal.TerminalEnv(LIMITS)
    try:
        env.reset("write-file")
        env.step("run_shell", {"command": f"ln -s {outside} greeting.txt"})
        out = env.finish("done")
    finally:
        env.close()
    assert not out.success and "not a regular file" in out.detail


def test_terminal_tool_errors_are_observations():
    env = terminal.TerminalEnv(LIMITS)
    try:
        env.reset("write-file")
        assert not env.step("bash", {"command": "ls"}).ok
        bad = env.step("run_shell", {"cmd": "ls"})
        assert not bad.ok and "missing required argument 'command'" in bad.observation
        r = env.step("run_shell", {"command": "echo out; echo err >&2; exit 3"})
        assert r.ok and "exit code 3" in r.observation and "out" in r.observation and "err" in r.observation
        assert env.info()["runs"] == 1 and env.info()["isolation"] in ("bwrap", "uid", "rlimits")
    finally:
        env.close()
    with pytest.raises(ValueError, match="unknown task"):
        terminal.TerminalEnv(LIMITS).reset("nope")


@pytest.mark.parametrize("task", list(toolcall.TASKS_BY_ID))
def test_toolcall_checker_passes_right_and_fails_wrong(task):
    env = ToolCallEnv()
    env.reset(task)
    calls, final = SOLUTIONS[task]
    outputs = [env.step(name, args) for name, args in calls]
    assert all(o.ok for o in outputs), [o.observation for o in outputs]
    assert env.finish(final).success
    assert env.finish(f"{final} or maybe 1234567").success is False
    assert env.finish("I do not know").success is False


def test_tools_compute_and_refuse():
    assert calculate("(17 * 23) + 4") == 395
    assert abs(convert(26.2, "mi", "km") - 42.16) < 0.01
    assert abs(convert(212, "F", "C") - 100) < 1e-9
    assert last_number("it is 1,234.5 metres") == 1234.5
    env = ToolCallEnv()
    env.reset("arith")
    for name, args, says in [
        ("calculator", {"expression": "__import__('os').system('x')"}, "unsupported"),
        ("calculator", {"expression": "9 ** 9 ** 9"}, "too large"),
        ("calculator", {"expression": "1/0"}, "division by zero"),
        ("convert_units", {"value": 1, "from_unit": "kg", "to_unit": "km"}, "different kinds"),
        ("convert_units", {"value": "1", "from_unit": "kg", "to_unit": "g"}, "must be a number"),
        ("lookup", {"table": "atomic_number", "key": "unobtainium"}, "not in atomic_number"),
        ("lookup", {"table": "nope", "key": "x"}, "must be one of"),
        ("search", {"q": "x"}, "unknown tool"),
    ]:
        r = env.step(name, args)
        assert not r.ok and says in r.observation, (name, args, r.observation)


def test_one_episode_through_the_chat_api_files_its_outcome():
    chat = FakeChat()
    env = terminal.TerminalEnv(LIMITS)
    try:
        res = run_episode(chat.url, "m", env, "count-errors", session="s-1", group="g-1",
                          headers={"authorization": "Bearer k"}, max_steps=4)
    finally:
        env.close()
        chat.close()
    assert res.success and res.stopped == "answered" and res.error is None
    assert [c["headers"]["x-reef-tag-session"] for c in chat.chats] == ["s-1", "s-1"]
    assert all(c["headers"]["x-reef-tag-group"] == "g-1" and c["headers"]["authorization"] == "Bearer k" for c in chat.chats)
    # The second request carries the tool's output as the next state.
    tool_msgs = [m for m in chat.chats[1]["body"]["messages"] if m["role"] == "tool"]
    assert len(tool_msgs) == 1 and "exit code 0" in tool_msgs[0]["content"]
    assert tool_msgs[0]["tool_call_id"] == f"call_{chat.chats[0]['receipt']}"
    [rep] = chat.reports
    assert rep["body"]["score"] == 1.0 and rep["body"]["references"] == [c["receipt"] for c in chat.chats]
    assert rep["body"]["metadata"]["group"] == "g-1" and rep["body"]["agent_record_id"] == "outcome-s-1"
    assert rep["headers"]["authorization"] == "Bearer k" and "x-reef-tag-session" not in rep["headers"]


def test_an_episode_that_runs_out_of_steps_is_checked_and_reported():
    chat = FakeChat()
    env = ToolCallEnv()
    try:
        res = run_episode(chat.url, "m", env, "atomic-sum", session="s-2", group="g", max_steps=2)
    finally:
        chat.close()
    assert res.stopped == "max-steps" and len(res.steps) == 2 and not res.success
    assert chat.reports[0]["body"]["score"] == -1.0 and len(chat.reports[0]["body"]["references"]) == 2
