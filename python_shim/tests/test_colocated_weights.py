"""The colocated layout's weight routes on the hf engine, for real: the engine as a subprocess, this
process as trainer rank 0 with Reef's `TensorPusher`, the tiny model. The routes and messages are
SGLang 0.5.23's (`/update_weights_from_tensor` inside an update session, `/release_memory_occupation`,
`/resume_memory_occupation`), so the same sender drives SGLang on one GPU (by CUDA IPC there, shared
memory here).
"""

from __future__ import annotations

import base64
import os
import pickle
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from safetensors.torch import load_file

from reef_shim.tensor_ipc import PayloadError, deserialize, serialize
from reef_shim.trainer.weight_push import TensorPusher, WeightPushError
from test_hf_server import PROMPT, Engine, launch, models  # noqa: F401 - `models` is a fixture used here

SAMPLED = {"text": PROMPT, "return_logprob": True, "top_logprobs_num": 4,
           "sampling_params": {"max_new_tokens": 12, "temperature": 0.8, "top_p": 0.95, "sampling_seed": 21,
                               "ignore_eos": True}}


@pytest.fixture()
def engine(models: tuple[Path, Path], tmp_path: Path) -> Iterator[Engine]:
    with launch(models[0], tmp_path / "engine.log", "--weight-version", "v0") as e:
        yield e


def outputs(reply: dict[str, Any]) -> tuple[Any, Any, Any]:
    meta = reply["meta_info"]
    return reply["output_ids"], meta["output_token_logprobs"], meta["output_top_logprobs"]


def weights(model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    return sorted(load_file(str(model_dir / "model.safetensors")).items())


def pusher(engine: Engine) -> TensorPusher:
    # 8 KiB buckets, so a push of the tiny model makes many calls, as a real model's does.
    return TensorPusher(engine.url, torch.device("cpu"), timeout_s=60, bucket_bytes=8 * 1024)


def test_a_tensor_push_serves_exactly_what_a_disk_load_of_the_same_weights_serves(
        engine: Engine, models: tuple[Path, Path]) -> None:
    base = engine.generate(**SAMPLED)
    status, r = engine.call("/update_weights_from_tensor", {"serialized_named_tensors": [serialize(weights(models[1]))]})
    assert status == 400 and "between begin_weight_update()" in r["message"]  # outside a session
    assert outputs(engine.generate(**SAMPLED)) == outputs(base)

    pusher(engine).push(weights(models[1]), "v1")
    pushed = engine.generate(**SAMPLED)
    assert pushed["meta_info"]["weight_version"] == "v1" and outputs(pushed) != outputs(base)
    status, r = engine.call("/update_weights_from_disk", {"model_path": str(models[1]), "weight_version": "v1-disk"})
    assert status == 200 and r["success"], r
    assert outputs(engine.generate(**SAMPLED)) == outputs(pushed)


def test_memory_released_for_a_trainer_step_is_served_again_only_once_every_weight_is_back(
        engine: Engine, models: tuple[Path, Path]) -> None:
    base = engine.generate(**SAMPLED)
    status, r = engine.call("/release_memory_occupation", {})
    assert status == 200 and r["success"], r
    status, r = engine.call("/generate", SAMPLED)
    assert status == 503 and "released" in r["error"]["message"]
    assert engine.call("/release_memory_occupation", {"tags": ["weights"]})[0] == 400  # already released
    with pytest.raises(WeightPushError, match="resume_memory_occupation first"):
        pusher(engine).push(weights(models[0]), "v0-again")
    assert engine.call("/resume_memory_occupation", {"tags": ["weights", "kv_cache"]})[0] == 200

    # Resumed uninitialised, as SGLang does without a CPU backup: nothing is served from it...
    half = weights(models[0])[: len(weights(models[0])) // 2]
    pusher(engine).push(half, "v0-half")
    status, r = engine.call("/generate", SAMPLED)
    assert status == 503 and "not sent again" in r["error"]["message"]
    # ...until every weight has been sent again; then it serves exactly what a disk load of the same
    # weights into it serves. (Not bit for bit what it served before the release: the weights now sit
    # in new allocations, and there the CPU matmul kernels round differently, by ~1e-7.)
    pusher(engine).push(weights(models[0]), "v0-again")
    again = engine.generate(**SAMPLED)
    assert again["meta_info"]["weight_version"] == "v0-again" and again["output_ids"] == base["output_ids"]
    status, r = engine.call("/update_weights_from_disk", {"model_path": str(models[0]), "weight_version": "v0-disk"})
    assert status == 200 and r["success"], r
    assert outputs(engine.generate(**SAMPLED)) == outputs(again)
    assert engine.call("/release_memory_occupation", {"tags": ["gpu"]})[0] == 400


class _Boom:
    def __reduce__(self) -> Any:
        return (os.system, ("touch /tmp/reef-pwned",))


def test_a_payload_that_names_anything_but_a_tensor_reduction_runs_nothing_and_changes_nothing(
        engine: Engine, tmp_path: Path) -> None:
    evil = base64.b64encode(pickle.dumps([("model.norm.weight", _Boom())])).decode()
    with pytest.raises(PayloadError, match="posix.system|os.system"):
        deserialize(evil)
    base = engine.generate(**SAMPLED)
    assert engine.call("/begin_weight_update", {})[0] == 200
    status, r = engine.call("/update_weights_from_tensor", {"serialized_named_tensors": [evil]})
    assert engine.call("/end_weight_update", {})[0] == 200
    assert status == 400 and "not a tensor reduction" in r["message"]
    assert not Path("/tmp/reef-pwned").exists()
    assert outputs(engine.generate(**SAMPLED)) == outputs(base)
