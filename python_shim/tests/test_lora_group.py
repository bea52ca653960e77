"""The trainer group with adapters for real: Ray, 2 gloo ranks, the tiny model. A rank killed
mid-run, and the restarted group resumes every adapter's optimizer from its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from safetensors.torch import load_file

from lora_fixtures import SPEC, TINY
from reef_shim.engines.hf_engine import HFEngine
from reef_shim.errors import ShimError
from reef_shim.trainer import TrainerGroup
from trainer_fixtures import placed_driver, spec, three_tasks

LAYOUT = {"trainer": {"gpus": 2}, "rollout": {"gpus": 1}, "prm": {"gpus": 1, "replicas": 0}, "student": None,
          "cpusPerBundle": 1, "colocate": False}


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with placed_driver(LAYOUT, 4, 3, REEF_TRAINER_DEVICE="cpu") as d:
        yield d


def _adapter(path: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(path) / "adapter_model.safetensors"))


def test_a_killed_group_restarts_with_every_adapters_optimizer(driver: Any, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = three_tasks(HFEngine(str(TINY), weight_version="v0", seed=3))
    ckpt = tmp_path / "ckpt"
    lora_spec = {**spec(str(TINY), str(ckpt), lr=1e-2), "adapter": dict(SPEC)}
    monkeypatch.setenv("REEF_TRAINER_TEST_CRASH", json.dumps({"rank": 1, "batchId": "B:2",
                                                              "marker": str(tmp_path / "crashed")}))
    group = TrainerGroup(driver)
    try:
        assert group.start(lora_spec)["weightVersion"] == "v0"
        with pytest.raises(ShimError, match="trainer-step.scenario: required"):
            group.step("none", tasks)
        a1 = group.step("A:1", tasks[:2], "A")
        b1 = group.step("B:1", tasks[2:], "B")  # one task: rank 1 runs the dummy pass
        a2 = group.step("A:2", tasks[:2], "A")
        a3 = group.step("A:3", tasks[:2], "A")  # the uninterrupted run's A after three batches
        with pytest.raises(ShimError, match="/load_lora_adapter"):
            group.push_weights("http://127.0.0.1:1", a3["weightVersion"])
        with pytest.raises(ShimError) as killed:
            group.step("B:2", tasks[2:], "B")  # rank 1 dies mid-step
        assert killed.value.code == "REEF_ERR_TRAINER_RANK" and killed.value.retryable

        # The restart the trainer-controller does: a fresh group, each scenario's last release loaded.
        group.start(lora_spec)
        assert group.load(a2["checkpointPath"]) == {"weightVersion": a2["weightVersion"]}
        assert group.load(b1["checkpointPath"]) == {"weightVersion": b1["weightVersion"]}
        with pytest.raises(ShimError, match="full-weight checkpoint"):
            group.load(str(TINY))
        again = group.step("A:3 again", tasks[:2], "A")
        b2 = group.step("B:2", tasks[2:], "B")  # the killed batch, retried
    finally:
        group.stop()
    assert [a1["weightVersion"], b1["weightVersion"], a2["weightVersion"], a3["weightVersion"]] == ["v1", "v2", "v3", "v4"]
    assert again["trained"] and b2["trained"]
    meta = json.loads((Path(again["checkpointPath"]) / "reef_checkpoint.json").read_text())
    assert meta["parent"] == a2["weightVersion"] and meta["scenario"] == "A"
    assert json.loads((Path(b2["checkpointPath"]) / "reef_checkpoint.json").read_text())["parent"] == "v2"
    # A's third batch after the restart is the uninterrupted run's, bit for bit: its AdamW moments
    # and step count came back with the checkpoint (afresh, the step would differ).
    want, got = _adapter(a3["checkpointPath"]), _adapter(again["checkpointPath"])
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert again["metrics"]["loss"] == a3["metrics"]["loss"]
