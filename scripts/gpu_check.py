"""The one-shot GPU check: what one GPU can prove about Reef's GPU path, in at most 8 minutes.

    python3 scripts/gpu_check.py [--out DIR] [--only 1a,1b,...]    # on a machine with CUDA
    python3 scripts/gpu_check.py --cpu --out DIR                    # the harness on this CPU

Written for a bare GPU machine: Python, torch, transformers and safetensors, nothing else (no venv,
no SGLang, no Node, no network; Ray, pyzmq, msgpack and pytest are recorded when present and never
needed). Each step runs in a subprocess of its own (`gpu_check_steps.py`) with a hard timeout, and
the timeouts add up to `--budget-s` at most (465 s), imports included. What each step proves and
expects is in `STEPS` below and in docs/benchmarks.md ("The GPU check").

Everything goes under `--out`, else `$REEF_GPU_OUT`, else `.cache/gpu-check` (relative paths from
the repository root): `summary.json` (one record per step: `step, name, status, ok, seconds,
observed, expected, reason`), `check.log` (the lines printed, one per step) and `logs/<step>.log`.
`status` is `ok`, `failed`, `timed-out` or `skipped`; `ok` is true only for `ok`, so a step that did
not run never reads as passed. Exits 1 when a step failed or timed out, else 0.

`--cpu` hides the GPUs: the steps that can run on the CPU do (the pusher's failure paths and the
weight group over gloo, the trainer step on CPU tensors) with small sizes, and the CUDA-only ones
are skipped with the reason. `python_shim/tests/test_gpu_check.py` runs it so.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STEPS_PY = Path(__file__).resolve().with_name("gpu_check_steps.py")
BUDGET_S = 465.0  # 8 minutes, less the driver's own start and the summary


@dataclass(frozen=True)
class Step:
    id: str
    name: str
    cap_s: float | None  # its hard timeout; None: whatever is left of the budget
    min_s: float  # skipped when less than this is left
    cuda_only: bool  # skipped under --cpu (and without CUDA)
    expected: str


STEPS = [
    Step("0", "environment", 30, 15, False,
         "torch imports; with CUDA: a device, its name, free memory, NCCL's version"),
    Step("1a", "push-refused", 80, 40, False,
         "the engine answers the update 400 at once and never broadcasts: WeightPusher.push raises "
         "WeightPushError carrying the engine's message within 5 s; the process then stays alive and "
         "healthy for {hold_s:g} s (matmuls, a fresh world-1 {backend} all_reduce)"),
    Step("1b", "push-silent", 110, 50, False,
         "the engine accepts the update, never broadcasts, never answers: push raises WeightPushError "
         "within timeout_s ({push_timeout_s:g} s) + 5 s; the process stays alive and healthy for {hold_s:g} s "
         "(torch's NCCL watchdog does not tear it down)"),
    Step("2", "gloo-receive", 60, 30, False,
         "rank 0 broadcasts a synthetic bf16 state dict ({shape} shape) from the CPU over gloo, rank 1 "
         "receives into {device} tensors: every tensor's sha256 matches; GB/s reported"),
    Step("3", "cuda-ipc", 45, 25, True,
         "a {ipc_gib:g} GiB CUDA tensor's IPC handle (torch.multiprocessing's reduce_tensor, pickled as "
         "SGLang's colocated update does) opened in another process and copied: sha256 matches"),
    Step("4", "bf16-step-parity", 90, 45, False,
         "one bf16 TrainerRank step of the tiny model on {device} (no Ray): no error, finite loss and "
         "gradient; mean |ℓθ − ℓold| against the fp32 hf engine in (1e-4, 5e-2); mean |Δ| between a "
         "bf16 KV-cache decode (the engine's tempered logprobs, T=0.7) and the trainer's scoring < 0.02"),
    Step("5", "trainer-throughput", None, 90, True,
         "bench/gpu_train.py --dtype bf16 on the largest Qwen3 shape that fits the time left: tokens/s"),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="output directory (default: $REEF_GPU_OUT, else .cache/gpu-check)")
    p.add_argument("--cpu", action="store_true", help="hide the GPUs: CPU-capable steps on the CPU, small sizes")
    p.add_argument("--only", help="comma-separated step ids to run (and 0, always); the others are recorded as skipped")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="all steps together, imports included")
    p.add_argument("--hold-s", type=float, default=30.0, help="steps 1a/1b: how long the pusher's process is watched after")
    p.add_argument("--push-timeout-s", type=float, default=20.0, help="steps 1a/1b: WeightPusher's timeout_s")
    return p.parse_args(argv)


def options(args: argparse.Namespace, device: str, work: Path) -> dict[str, Any]:
    """What every step is given (the same for all: a step reads what it needs)."""
    cpu = device == "cpu"
    return {"device": device, "work": str(work), "hold_s": args.hold_s, "push_timeout_s": args.push_timeout_s,
            "backend": "gloo" if cpu else "nccl", "shape": "tiny" if cpu else "qwen3-0.6b",
            "ipc_gib": 1.0, "threads": 1 if cpu else 8}


def git_commit() -> dict[str, Any]:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    if head.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}


def run_step(step: Step, opts: dict[str, Any], timeout_s: float, log: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run one step's subprocess (its own session, so its children die with it) and read what it wrote."""
    result = Path(opts["work"]) / f"step-{step.id}.json"
    started = time.monotonic()
    with log.open("w") as f:
        p = subprocess.Popen([sys.executable, str(STEPS_PY), step.id, str(result), json.dumps(opts)], stdout=f,
                             stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        timed_out = False
        try:
            rc = p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)  # on time-out, and any child left behind (a fake engine)
        except ProcessLookupError:
            pass
        rc = p.wait()
    seconds = time.monotonic() - started
    try:
        written = json.loads(result.read_text())
    except (OSError, ValueError):
        written = {"observed": {}, "outcome": None}
    observed, outcome = written["observed"], written["outcome"]
    if outcome is None:  # killed, or died before it could say how it went: what it noted so far stays
        status = "timed-out" if timed_out else "failed"
        why = f"killed after {timeout_s:.0f} s" if timed_out else f"exited {rc} without a result"
        observed = {**observed, "exit": why}
        outcome = {"status": status, "line": why, "reason": None}
    return {"status": outcome["status"], "seconds": round(seconds, 1), "observed": observed,
            "line": outcome["line"], "reason": outcome["reason"]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget_s
    out = Path(args.out or os.environ.get("REEF_GPU_OUT") or ".cache/gpu-check")
    out = out if out.is_absolute() else ROOT / out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "python_shim"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if args.cpu:
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    device = "cpu" if args.cpu else "cuda"
    summary: dict[str, Any] = {"mode": device, "budget_s": args.budget_s, "python": sys.executable,
                               **git_commit(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "steps": []}
    lines: list[str] = []

    def say(line: str) -> None:
        print(f"[gpu-check] {line}", flush=True)
        lines.append(line)

    cuda_seen: bool | None = None  # what step 0 found
    with tempfile.TemporaryDirectory(prefix="reef-gpu-check-") as work:
        opts = options(args, device, Path(work))
        for step in STEPS:
            left = deadline - time.monotonic()
            timeout_s = min(step.cap_s or left, left)
            reason = None
            if only is not None and step.id not in only and step.id != "0":  # the others depend on step 0
                reason = "not selected (--only)"
            elif step.cuda_only and args.cpu:
                reason = "needs CUDA (--cpu)"
            elif not args.cpu and step.id != "0" and cuda_seen is not True:
                reason = "no CUDA device (step 0)" if cuda_seen is False else "the environment was not checked (step 0)"
            elif timeout_s < step.min_s:
                reason = f"{max(left, 0):.0f} s left of the {args.budget_s:.0f} s budget, it needs {step.min_s:.0f} s"
            log = out / "logs" / f"{step.id}-{step.name}.log"
            if reason is None:
                r = run_step(step, {**opts, "budget_s": timeout_s}, timeout_s, log, env)
            else:
                r = {"status": "skipped", "seconds": 0.0, "observed": {}, "line": reason, "reason": reason}
            if step.id == "0" and "cuda_available" in r["observed"]:
                cuda_seen = bool(r["observed"]["cuda_available"])
            expected = step.expected.format(**opts)
            summary["steps"].append({"step": step.id, "name": step.name, "status": r["status"],
                                     "ok": r["status"] == "ok", "seconds": r["seconds"], "observed": r["observed"],
                                     "expected": expected, "reason": r["reason"],
                                     "log": str(log.relative_to(out)) if reason is None else None})
            say(f"{step.id} {step.name}: {r['status']} ({r['seconds']:.1f} s) {r['line']}")
    summary["wall_s"] = round(time.monotonic() - started, 1)
    summary["ok"] = all(s["ok"] for s in summary["steps"])  # every step ran and passed
    bad = [s["step"] for s in summary["steps"] if s["status"] in ("failed", "timed-out")]
    counts = {k: sum(s["status"] == k for s in summary["steps"]) for k in ("ok", "failed", "timed-out", "skipped")}
    say(f"{', '.join(f'{n} {k}' for k, n in counts.items())}{' (' + ', '.join(bad) + ')' if bad else ''}; "
        f"{summary['wall_s']:.0f} s; {out / 'summary.json'}")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "check.log").write_text("\n".join(lines) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
