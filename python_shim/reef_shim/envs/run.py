"""Runs rollouts of environment tasks through a gateway with N Ray env workers, and writes the results.

    python -m reef_shim.envs.run --base-url http://127.0.0.1:8080 --model tiny \\
        --tasks terminal:all,toolcall:arith --n 4 --workers 8 --out results.json

Each task gets `--n` rollouts in one group (`x-reef-tag-group`), each rollout a session of its
own; every episode's outcome is filed with `POST /reef/report`. The JSON written has every
episode (steps, receipts, outcome, which sandbox isolation held) and the success rate per task.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from typing import Any

from . import terminal, toolcall
from .sandbox import default_isolation
from .workers import ENV_KINDS, env_worker_actor, rollout_specs, run_parallel

_TASKS = {"terminal": list(terminal.TASKS_BY_ID), "toolcall": list(toolcall.TASKS_BY_ID)}


def parse_tasks(text: str) -> list[tuple[str, str]]:
    """`env:task` items, comma-separated; `env:all` is every task of that env."""
    out: list[tuple[str, str]] = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        env, sep, task = item.partition(":")
        if not sep or env not in ENV_KINDS:
            raise ValueError(f"--tasks: {item!r} is not env:task with env one of {', '.join(ENV_KINDS)}")
        if task == "all":
            out += [(env, t) for t in _TASKS[env]]
        elif task in _TASKS[env]:
            out.append((env, task))
        else:
            raise ValueError(f"--tasks: {env} has no task {task!r} (it has {', '.join(_TASKS[env])}, or all)")
    if not out:
        raise ValueError("--tasks: no task named")
    return out


def parse_headers(items: list[str]) -> dict[str, str]:
    headers = {}
    for h in items:
        k, sep, v = h.partition(":")
        if not sep or not k.strip():
            raise ValueError(f"--header: {h!r} is not name:value")
        headers[k.strip().lower()] = v.strip()
    return headers


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    per_task: dict[str, dict[str, Any]] = {}
    for r in results:
        t = per_task.setdefault(f"{r['env']}:{r['task']}", {"episodes": 0, "successes": 0})
        t["episodes"] += 1
        t["successes"] += int(r["success"])
    for t in per_task.values():
        t["success_rate"] = t["successes"] / t["episodes"]
    n = len(results)
    return {"episodes": n, "success_rate": sum(r["success"] for r in results) / n if n else None, "per_task": per_task,
            "isolations": sorted({r["info"].get("isolation") for r in results if r["env"] == "terminal"} - {None})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reef_shim.envs.run", description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", required=True, help="the gateway, without /v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tasks", default="terminal:all,toolcall:all")
    ap.add_argument("--n", type=int, default=4, help="rollouts per task (one group)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--header", action="append", default=[], help="name:value, sent on every request (repeatable)")
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--run-id", default=None, help="prefix of the session and group tags (default: a fresh one)")
    ap.add_argument("--measure", action="store_true",
                    help="no group tag and no outcome report: the episodes are measured, not trained as agent steps")
    ap.add_argument("--ray-address", default=None, help="a running cluster (default: a local head)")
    ap.add_argument("--out", default=None, help="write the results JSON here (default: stdout)")
    a = ap.parse_args(argv)
    try:
        tasks = parse_tasks(a.tasks)
        headers = parse_headers(a.header)
        if a.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {a.workers}")
        specs = rollout_specs(tasks, a.n, a.run_id or f"run-{uuid.uuid4().hex[:8]}", a.max_steps,
                              measure=a.measure)
    except ValueError as e:
        ap.error(str(e))
    sampling = {k: v for k, v in (("temperature", a.temperature), ("max_tokens", a.max_tokens)) if v is not None}
    if "REEF_API_KEY" in os.environ and "authorization" not in headers:
        headers["authorization"] = f"Bearer {os.environ['REEF_API_KEY']}"

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    started = time.monotonic()
    if a.ray_address:
        ray.init(address=a.ray_address, log_to_driver=False)
    else:
        ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False)
    try:
        Worker = env_worker_actor(ray)
        workers = [Worker.remote(f"env-{i}", a.base_url, a.model, headers=headers, sampling=sampling or None)
                   for i in range(min(a.workers, len(specs)))]
        print(f"[envs] {len(specs)} episodes of {len(tasks)} tasks on {len(workers)} workers "
              f"(sandbox here: {default_isolation()})", file=sys.stderr)
        results = run_parallel(ray, specs, workers)
    finally:
        ray.shutdown()
    out = {"summary": summarize(results), "wall_s": time.monotonic() - started, "episodes": results}
    for task, t in out["summary"]["per_task"].items():
        print(f"[envs] {task}: {t['successes']}/{t['episodes']} passed", file=sys.stderr)
    text = json.dumps(out, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
