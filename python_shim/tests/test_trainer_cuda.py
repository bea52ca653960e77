"""GPU only: the trainer group on a CUDA device, through Ray, with the tiny model.

The CPU tests (`test_trainer.py`) run the same group on gloo ranks. Here one rank holds the GPU, so
its process group is NCCL and FSDP2 shards over a CUDA mesh. The rollout engine stays the hf engine
on the CPU: the checks are that the trainer on the GPU computes the engine's distribution (ℓθ
before the update against the recorded ℓold, across devices), that its loss and gradient equal one
CPU process on the same batch, and that its weights reach the running engine (over gloo, since that
engine cannot join an NCCL group) and serve exactly what its checkpoint serves.

One GPU is enough. Ray is given two logical GPUs (the layout's rollout bundle needs one) and told
not to set CUDA_VISIBLE_DEVICES, so the rank sees the real GPU 0 whichever logical GPU it holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from safetensors.torch import load_file

from reef_shim import tiny_model
from reef_shim.engines.hf_engine import HFEngine
from trainer_fixtures import (check_bf16_step, check_push_serves_its_checkpoint, placed_driver, probe, reference_step,
                              spec, three_tasks)

pytestmark = pytest.mark.gpu

LAYOUT = {"trainer": {"gpus": 1}, "rollout": {"gpus": 1}, "prm": {"gpus": 1, "replicas": 0}, "student": None,
          "cpusPerBundle": 1, "colocate": False}
LR = 1e-3


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    tiny_model.build(out, seed=0, quiet=True)
    return out


@pytest.fixture(scope="module")
def tasks(model: Path) -> list[dict[str, Any]]:
    return three_tasks(HFEngine(str(model), weight_version="v0", seed=3))


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    pytest.importorskip("ray", reason="Ray is not installed")
    with placed_driver(LAYOUT, 4, 2, RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES="1", REEF_TRAINER_DEVICE="cuda") as d:
        yield d


def test_a_cuda_rank_matches_the_cpu_engine_trains_and_its_push_serves_its_checkpoint(
        driver: Any, model: Path, tasks: list[dict[str, Any]], tmp_path: Path) -> None:
    from test_hf_server import launch

    from reef_shim.trainer import TrainerGroup

    body = probe(tasks)
    group = TrainerGroup(driver)
    with launch(model, tmp_path / "engine.log", "--weight-version", "v0", "--weight-sync-timeout-s", "60") as eng:
        try:
            started = group.start(spec(str(model), str(tmp_path / "ckpt"), ranks=1, lr=LR))
            base = eng.generate(**body)
            step = group.step("s:openclawrl:1", tasks)
            pushed = group.push_weights(eng.url, "v1")
            served = eng.generate(**body)
        finally:
            group.stop()
        print(f"\ncuda rank: {started}\nstep metrics: {step['metrics']}\npush: {pushed}")
        assert started["device"].startswith("cuda") and started["worldSize"] == 1
        m = step["metrics"]
        assert step["trained"] is True and step["weightVersion"] == "v1"
        # The GPU's fp32 ℓθ reproduces the CPU engine's recorded logprobs (TF32 stays off for matmuls).
        assert m["train_rollout_logprob_abs_diff"] < 1e-3, m
        assert m["tokens"] == 72 and m["opd_tokens"] == 48 and m["samples_with_teacher"] == 2

        # The same loss and gradient as one CPU process on the whole batch.
        loss, norm = reference_step(model, tasks, LR)
        assert m["loss"] == pytest.approx(loss, rel=1e-4, abs=1e-6)
        assert m["grad_norm"] == pytest.approx(norm, rel=1e-3)

        # Into the CPU engine over gloo (it cannot join NCCL); it then serves the checkpoint's weights.
        assert pushed["backend"] == "gloo" and pushed["weightVersion"] == "v1"
        ckpt = load_file(str(Path(step["checkpointPath"]) / "model.safetensors"))
        base_state = load_file(str(model / "model.safetensors"))
        assert set(ckpt) == set(base_state)  # the pinned gather names every tensor as the base model does
        assert all(ckpt[k].dtype == base_state[k].dtype and ckpt[k].shape == base_state[k].shape for k in ckpt)
        assert served != base
        check_push_serves_its_checkpoint(eng, body, pushed, served, step["checkpointPath"])


def test_a_cuda_rank_in_bf16_trains_over_fp32_master_weights(driver: Any, model: Path, tasks: list[dict[str, Any]],
                                                             tmp_path: Path) -> None:
    from reef_shim.trainer import TrainerGroup

    group = TrainerGroup(driver)
    try:
        group.start(spec(str(model), str(tmp_path / "ckpt"), ranks=1, lr=LR, dtype="bf16"))
        step = group.step("s:openclawrl:1", tasks)
    finally:
        group.stop()
    check_bf16_step(step, model, tasks, LR)
