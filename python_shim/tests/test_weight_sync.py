"""SGLang's distributed weight update over gloo, for real: the hf engine as a subprocess, a sender
process (`weight_sender.py`, Reef's `WeightPusher`) as trainer rank 0, the tiny model.

The weights pushed are another build of the tiny model (seed 1): same shapes, other values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from test_hf_server import PROMPT, SHIM, Engine, launch, models  # noqa: F401 - `models` is a fixture used here

SENDER = Path(__file__).with_name("weight_sender.py")
SAMPLED = {"text": PROMPT, "return_logprob": True, "top_logprobs_num": 4,
           "sampling_params": {"max_new_tokens": 12, "temperature": 0.8, "top_p": 0.95, "sampling_seed": 21,
                               "ignore_eos": True}}


@pytest.fixture()
def engine(models: tuple[Path, Path], tmp_path: Path) -> Iterator[Engine]:
    # A fresh engine per test, so each starts from the seed-0 weights with no group left over.
    with launch(models[0], tmp_path / "engine.log", "--weight-version", "v0", "--weight-sync-timeout-s", "30") as e:
        yield e


def send(engine: Engine, model_dir: Path, version: str, mode: str = "ok") -> dict[str, Any]:
    """Run the sender to its end. Its own timeout (600 s) is far beyond the run's (180 s), so a sender
    that waits out its timeout instead of hearing the engine fails the test instead of passing slowly."""
    env = {**os.environ, "PYTHONPATH": str(SHIM), "PYTHONUNBUFFERED": "1"}
    run = subprocess.run([sys.executable, str(SENDER), engine.url, str(model_dir), version, mode, "600"], env=env,
                         capture_output=True, text=True, timeout=180)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert lines, f"sender exited {run.returncode} without an outcome:\n{run.stderr[-3000:]}"
    return json.loads(lines[-1])


def outputs(reply: dict[str, Any]) -> tuple[Any, Any, Any]:
    meta = reply["meta_info"]
    return reply["output_ids"], meta["output_token_logprobs"], meta["output_top_logprobs"]


def test_a_gloo_push_serves_exactly_what_a_disk_load_of_the_same_weights_serves(
        engine: Engine, models: tuple[Path, Path]) -> None:
    base = engine.generate(**SAMPLED)
    outcome = send(engine, models[1], "v1")
    assert outcome["ok"] is True, outcome
    assert outcome["bytes"] == sum(p.stat().st_size for p in [models[1] / "model.safetensors"]) - _header(models[1])
    assert engine.call("/model_info")[1]["weight_version"] == "v1"
    pushed = engine.generate(**SAMPLED)
    assert pushed["meta_info"]["weight_version"] == "v1"
    assert outputs(pushed) != outputs(base)

    # The same weights from disk: the same seed gives the same tokens, logprobs and top-K.
    status, r = engine.call("/update_weights_from_disk", {"model_path": str(models[0]), "weight_version": "v0"})
    assert status == 200 and r["success"], r
    assert outputs(engine.generate(**SAMPLED)) == outputs(base)
    status, r = engine.call("/update_weights_from_disk", {"model_path": str(models[1]), "weight_version": "v1-disk"})
    assert status == 200 and r["success"], r
    assert outputs(engine.generate(**SAMPLED)) == outputs(pushed)


def _header(model_dir: Path) -> int:
    """Bytes of the safetensors header (8-byte length + JSON), which the push does not send."""
    with open(model_dir / "model.safetensors", "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def test_nccl_is_refused_with_a_reason_and_nothing_changes(engine: Engine) -> None:
    before = engine.generate(**SAMPLED)
    status, r = engine.call("/init_weights_update_group", {
        "master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2,
        "group_name": "g", "backend": "nccl"})
    assert status == 400 and r["success"] is False
    assert "gloo" in r["message"] and "nccl" in r["message"]
    update = {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[64]], "group_name": "g"}
    status, r = engine.call("/update_weights_from_distributed", update)
    assert status == 400 and r["success"] is False and "between begin_weight_update()" in r["message"]
    assert engine.call("/begin_weight_update", {})[0] == 200
    status, r = engine.call("/update_weights_from_distributed", update)
    assert status == 400 and r["success"] is False and "no weight group" in r["message"]
    assert engine.call("/end_weight_update", {})[0] == 200
    assert engine.call("/init_weights_update_group", {"master_address": "127.0.0.1"})[0] == 400
    assert outputs(engine.generate(**SAMPLED)) == outputs(before)


@pytest.mark.parametrize("mode", ["die-midway", "unknown-name", "unknown-group"])
def test_a_broken_or_refused_push_leaves_the_old_weights_serving(engine: Engine, models: tuple[Path, Path],
                                                                 mode: str) -> None:
    before = engine.generate(**SAMPLED)
    outcome = send(engine, models[1], "v-broken", mode)
    if mode == "die-midway":
        assert outcome == {"died": True}
    else:
        # The sender hears the refusal (see `send`: it does not wait out its timeout).
        assert outcome["ok"] is False, outcome
        assert ("model.bogus.weight" if mode == "unknown-name" else "no weight group") in outcome["error"]
    info = engine.call("/model_info")[1]
    assert info["weight_version"] == "v0"
    after = engine.generate(**SAMPLED)
    assert after["meta_info"]["weight_version"] == "v0"
    assert outputs(after) == outputs(before)
    # The engine still takes a good push afterwards.
    assert send(engine, models[1], "v2")["ok"] is True
    assert engine.generate(**SAMPLED)["meta_info"]["weight_version"] == "v2"


def test_a_gloo_push_into_a_bf16_engine_is_cast_as_a_disk_load_is(models: tuple[Path, Path], tmp_path: Path) -> None:
    # The trainer holds fp32 tensors and sends them in the dtype the engine says it serves: half the
    # bytes, and the same rounding as the engine's own cast of a checkpoint it loads.
    with launch(models[0], tmp_path / "bf16.log", "--dtype", "bf16", "--weight-sync-timeout-s", "30") as bf16:
        assert bf16.call("/server_info")[1]["dtype"] == "bfloat16"
        outcome = send(bf16, models[1], "v1")
        assert outcome["ok"] is True, outcome
        assert outcome["bytes"] * 2 == (models[1] / "model.safetensors").stat().st_size - _header(models[1])
        pushed = bf16.generate(**SAMPLED)
        status, r = bf16.call("/update_weights_from_disk", {"model_path": str(models[1]), "weight_version": "v1-disk"})
        assert status == 200 and r["success"], r
        assert outputs(bf16.generate(**SAMPLED)) == outputs(pushed)
