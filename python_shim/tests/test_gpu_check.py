"""scripts/gpu_check.py, the one-shot GPU check, in its CPU mode: the harness a GPU run relies on.

Under `--cpu` the steps that can run on the CPU do (the pusher's failure paths against the fake
engine over gloo, the gloo receive, the bf16 trainer step), with small sizes, and the CUDA-only ones
are recorded as skipped with the reason. Not GPU-marked: it must run here, so that the first GPU
run does not find the harness's own bugs. About 30-60 s (seven subprocesses import torch).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
KEYS = {"step", "name", "status", "ok", "seconds", "observed", "expected", "reason", "log"}


def load_driver():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_step_timeouts_fit_in_eight_minutes_imports_included() -> None:
    g = load_driver()
    assert g.BUDGET_S <= 480
    fixed = [s.cap_s for s in g.STEPS if s.cap_s is not None]
    # The fixed steps always fit; the last one takes what is left and is skipped below its minimum.
    assert sum(fixed) <= g.BUDGET_S and [s.cap_s for s in g.STEPS][-1] is None
    assert all(s.min_s <= (s.cap_s or g.BUDGET_S) for s in g.STEPS)
    for cpu in (False, True):
        opts = g.options(g.parse_args(["--cpu"] if cpu else []), "cpu" if cpu else "cuda", Path("/tmp"))
        assert all(s.expected.format(**opts) for s in g.STEPS)


def test_cpu_mode_records_every_step_and_calls_ok_only_what_ran_and_passed(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check"
    env = {**os.environ, "REEF_GPU_OUT": str(out)}
    r = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--hold-s", "1", "--push-timeout-s", "5"], env=env,
                       capture_output=True, text=True, timeout=400)
    print(r.stdout[-4000:], r.stderr[-4000:])
    summary = json.loads((out / "summary.json").read_text())
    steps = {s["step"]: s for s in summary["steps"]}
    assert list(steps) == ["0", "1a", "1b", "2", "3", "4", "5"]
    assert r.returncode == 0, [(s["step"], s["status"], s["observed"]) for s in summary["steps"]]
    for s in summary["steps"]:
        assert set(s) == KEYS and s["expected"]
        assert s["ok"] is (s["status"] == "ok")
        if s["status"] == "skipped":
            assert s["reason"] and s["observed"] == {} and s["log"] is None
        else:
            assert s["reason"] is None and s["observed"] and (out / s["log"]).is_file()
    assert {k for k, s in steps.items() if s["status"] == "skipped"} == {"3", "5"}
    assert all("CUDA" in steps[k]["reason"] for k in ("3", "5"))
    assert summary["mode"] == "cpu" and summary["ok"] is False  # skipped steps never make the check pass

    refused, silent = steps["1a"]["observed"], steps["1b"]["observed"]
    assert refused["backend"] == "gloo" and refused["push"].startswith("WeightPushError")
    assert "refuses the update without broadcasting" in refused["push"]  # the engine's own message
    assert refused["engine_calls"] == ["init_weights_update_group", "begin_weight_update",
                                       "update_weights_from_distributed", "end_weight_update",
                                       "destroy_weights_update_group"]
    # timeout_s (5 s) bounds connect and push together: the silent engine is given up on at that
    # deadline, which the error names (how long it took is the GPU run's figure, not a test's).
    assert silent["push"].startswith("WeightPushError") and "not done in 5 s" in silent["push"]
    assert refused["fresh_all_reduce"] and silent["fresh_all_reduce"]
    gloo = steps["2"]["observed"]
    assert gloo["receiver_device"] == "cpu" and gloo["mismatched"] == [] and gloo["tensors"] == 24
    trainer = steps["4"]["observed"]
    assert trainer["rank"]["device"] == "cpu" and trainer["response_tokens"] == 72
    assert trainer["fp32_hf_engine_vs_bf16_trainer"]["mean"] < 5e-2

    printed = [line for line in r.stdout.splitlines() if line.startswith("[gpu-check] ")]
    assert len(printed) == len(steps) + 1 and printed[-1].startswith("[gpu-check] 5 ok, 0 failed, 0 timed-out, 2 skipped")
    assert (out / "check.log").read_text().count("\n") == len(printed)
