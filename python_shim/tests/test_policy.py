"""The shim refuses what the stack's layout does not hold (reef_shim/policy.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from reef_shim.errors import ShimError
from reef_shim.policy import ShimPolicy
from test_server import Shim

ROLLOUT = {"name": "rollout", "role": "rollout", "kind": "hf", "modelPath": "/models/tiny", "group": "reef-rollout",
           "bundleIndex": 0, "host": "127.0.0.1", "port": 30000, "extraArgs": ["--dtype", "float32"]}


def policy(tmp_path: Path) -> ShimPolicy:
    data = tmp_path / "data"
    (data / "checkpoints").mkdir(parents=True, exist_ok=True)
    return ShimPolicy([ROLLOUT], None, str(data), "/models/tiny")


@pytest.mark.parametrize("change", [
    {"extraArgs": ["--dtype", "float32", "--trust-remote-code"]},
    {"host": "0.0.0.0"},
    {"modelPath": "/tmp/attacker-model"},
    {"port": 30001},
    {"name": "rollout-2"},
])
def test_start_engine_only_as_configured(tmp_path: Path, change: dict[str, Any]) -> None:
    p = policy(tmp_path)
    p.check_engine(dict(ROLLOUT))
    with pytest.raises(ShimError) as e:
        p.check_engine({**ROLLOUT, **change})
    assert e.value.code == "REEF_ERR_INVALID_ARGUMENT"


def test_trainer_writes_and_loads_only_under_the_data_dir(tmp_path: Path) -> None:
    p = policy(tmp_path)
    inside = str(tmp_path / "data" / "checkpoints")
    p.check_trainer({"checkpointDir": inside, "modelPath": "/models/tiny"})
    p.check_checkpoint(os.path.join(inside, "v3"))
    p.check_checkpoint("/models/tiny")  # a rollback to the base release (closed-loop test)
    (tmp_path / "data" / "escape").symlink_to(tmp_path)
    for bad in ("/tmp/elsewhere", str(tmp_path / "data" / ".." / "x"), str(tmp_path / "data" / "escape" / "x"), str(tmp_path / "data-x")):
        with pytest.raises(ShimError, match="outside reef.data_dir"):
            p.check_trainer({"checkpointDir": bad, "modelPath": "/models/tiny"})
        with pytest.raises(ShimError, match="outside reef.data_dir"):
            p.check_checkpoint(bad)
    with pytest.raises(ShimError, match="modelPath"):
        p.check_trainer({"checkpointDir": inside, "modelPath": "/tmp/attacker-model"})


def test_init_ray_only_at_the_configured_address(tmp_path: Path) -> None:
    p = policy(tmp_path)
    p.check_ray(None)
    with pytest.raises(ShimError, match="cluster.ray_address"):
        p.check_ray("203.0.113.9:6379")


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Shim]:
    path = tmp_path / "shim-policy.json"
    path.write_text(json.dumps({"engines": [ROLLOUT], "rayAddress": None, "dataDir": str(tmp_path), "trainerModelPath": "/models/tiny"}))
    shim = Shim(env={"REEF_SHIM_POLICY": str(path)})
    yield shim
    shim.close()


def test_the_server_refuses_before_starting_anything(guarded: Shim) -> None:
    spec = {**ROLLOUT, "extraArgs": ["--trust-remote-code"]}
    err = guarded.call({"type": "start-engine", "requestId": "e1", "spec": spec})
    assert (err["code"], err["retryable"]) == ("REEF_ERR_INVALID_ARGUMENT", False)
    assert "differs from the configured one in extraArgs" in err["message"]
    err = guarded.call({"type": "init-ray", "requestId": "i1", "address": "203.0.113.9:6379", "numCpus": None,
                        "numGpus": None, "objectStoreBytes": None})
    assert err["code"] == "REEF_ERR_INVALID_ARGUMENT"
    assert guarded.call({"type": "ping", "requestId": "p"})["rayConnected"] is False
