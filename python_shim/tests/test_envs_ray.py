"""Environment workers as real Ray actors run episodes in parallel against a chat endpoint.

The endpoint is a test double of the engine (scripted tool calls); Ray, the workers, the agent
loop, the environments and their sandboxes are real. One test: a Ray start costs seconds."""

from __future__ import annotations

import os

import pytest

from envs_fake_chat import FakeChat
from reef_shim.envs.run import parse_headers, parse_tasks, summarize
from reef_shim.envs.workers import EnvWorker, env_worker_actor, rollout_specs, run_parallel

SHIM = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


@pytest.fixture
def ray_local(monkeypatch):
    """A local Ray head started and closed as the shim does it (RayDriver: loopback only, and its
    leftover agents reaped at close)."""
    # Workers import reef_shim by module path; an absolute one, whatever their working directory.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (SHIM, os.environ.get("PYTHONPATH")) if p))
    from reef_shim.ray_driver import RayDriver

    d = RayDriver()
    try:
        d.init_ray(None, 2, None, None)
        import ray

        yield ray
    finally:
        d.close()


def test_three_workers_run_grouped_rollouts_and_report_each(ray_local):
    ray = ray_local
    chat = FakeChat()
    try:
        Worker = env_worker_actor(ray, num_cpus=0.25)
        workers = [Worker.remote(f"w{i}", chat.url, "tiny", headers={"x-reef-scenario": "agents"},
                                 env_options={"terminal": {"limits": {"wall_s": 5}}}) for i in range(3)]
        specs = rollout_specs([("terminal", "write-file"), ("terminal", "fix-script"), ("toolcall", "atomic-sum")],
                              n=2, run_id="t1", max_steps=6)
        results = run_parallel(ray, specs, workers)
        described = ray.get([w.describe.remote() for w in workers])
    finally:
        chat.close()

    assert [(r["task"], r["session"]) for r in results] == [(s.task, s.session) for s in specs]
    assert all(r["success"] and r["stopped"] == "answered" and r["error"] is None for r in results), \
        [(r["task"], r["detail"], r["error"]) for r in results]
    # Each episode ran in one worker process; the work spread over more than one.
    assert len({d["pid"] for d in described}) == 3 and len({r["worker"] for r in results}) > 1
    assert sum(d["episodes"] for d in described) == len(specs)
    terminal = [r for r in results if r["env"] == "terminal"]
    assert all(r["info"]["isolation"] == described[0]["isolation"] for r in terminal)
    # One report per episode, naming exactly that episode's receipts, under its group.
    by_session = {rep["body"]["metadata"]["session"]: rep["body"] for rep in chat.reports}
    assert set(by_session) == {s.session for s in specs}
    for r in results:
        rep = by_session[r["session"]]
        assert rep["references"] == r["receipts"] == [st["receipt"] for st in r["steps"]]
        assert rep["metadata"]["group"] == r["group"] == f"t1-{r['env']}-{r['task']}"
        assert rep["score"] == 1.0
    for c in chat.chats:
        assert c["headers"]["x-reef-scenario"] == "agents"
        assert c["headers"]["x-reef-tag-group"] in {s.group for s in specs}
    assert len(chat.chats) == sum(len(r["steps"]) for r in results)


def test_worker_and_runner_options_are_checked():
    with pytest.raises(ValueError, match="unknown env"):
        EnvWorker("w", "http://127.0.0.1:1", "m", env_options={"gui": {}})
    with pytest.raises(ValueError, match="rollouts per task"):
        rollout_specs([("terminal", "write-file")], n=0, run_id="x")
    # Measured episodes carry no group and file no report: nothing of theirs trains as an agent step.
    measured = rollout_specs([("toolcall", "arith")], n=2, run_id="m", measure=True)
    assert [(s.group, s.report, s.session) for s in measured] == [(None, False, "m-toolcall-arith-r0"), (None, False, "m-toolcall-arith-r1")]
    assert parse_tasks("terminal:write-file, toolcall:all")[:2] == [("terminal", "write-file"), ("toolcall", "arith")]
    for bad, says in [("gui:x", "env:task"), ("terminal:nope", "has no task"), ("terminal", "env:task"), (" , ", "no task")]:
        with pytest.raises(ValueError, match=says):
            parse_tasks(bad)
    assert parse_headers(["X-Reef-Scenario: agents"]) == {"x-reef-scenario": "agents"}
    with pytest.raises(ValueError, match="name:value"):
        parse_headers(["novalue"])
    s = summarize([{"env": "toolcall", "task": "arith", "success": True, "info": {}},
                   {"env": "toolcall", "task": "arith", "success": False, "info": {}}])
    assert s["per_task"]["toolcall:arith"] == {"episodes": 2, "successes": 1, "success_rate": 0.5}
