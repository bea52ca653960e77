"""What a stack's shim may be asked to do: the layout `reef up` resolved from its config.

The shim runs what the bridge asks as the Reef user: an engine's arguments become a command line
(SGLang's --trust-remote-code on a writable model dir runs its code), a host of 0.0.0.0 opens an
engine to the network, a checkpoint dir is where the trainer writes, a Ray address is where the
shim places everything. The bus key keeps other processes off the socket; this keeps a request that
does get through (a bug, a compromised actor) to the layout the operator configured.

`reef up` writes the policy to `<data_dir>/run/shim-policy.json` (0600) and names it in
REEF_SHIM_POLICY. A shim started without one (its own tests, a developer by hand) takes any request.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .errors import ShimError

POLICY_ENV = "REEF_SHIM_POLICY"


def _refuse(what: str) -> ShimError:
    return ShimError("REEF_ERR_INVALID_ARGUMENT", f"{what}; the shim runs only the layout reef up gave it ({POLICY_ENV})")


def _inside(path: str, root: str) -> bool:
    # realpath: a symlink or `..` inside the data dir must not lead out of it.
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


class ShimPolicy:
    def __init__(self, engines: list[dict[str, Any]], ray_address: str | None, data_dir: str, trainer_model_path: str) -> None:
        self.engines = engines
        self.ray_address = ray_address
        self.data_dir = data_dir
        self.trainer_model_path = trainer_model_path

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> "ShimPolicy | None":
        path = (env if env is not None else os.environ).get(POLICY_ENV, "")
        if not path:
            return None
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
            return ShimPolicy(list(raw["engines"]), raw["rayAddress"], str(raw["dataDir"]), str(raw["trainerModelPath"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ShimError("REEF_ERR_CONFIG_INVALID", f"{POLICY_ENV}: cannot read the shim policy {path}: {e}") from e

    def check_engine(self, spec: dict[str, Any]) -> None:
        if spec in self.engines:
            return
        same_name = next((e for e in self.engines if e["name"] == spec["name"]), None)
        if same_name is None:
            raise _refuse(f"start-engine: no engine {spec['name']!r} in this stack's layout")
        differ = sorted(k for k in set(spec) | set(same_name) if spec.get(k) != same_name.get(k))
        raise _refuse(f"start-engine: engine {spec['name']!r} differs from the configured one in {', '.join(differ)}")

    def check_ray(self, address: str | None) -> None:
        if address != self.ray_address:
            raise _refuse(f"init-ray: address {address!r} is not the configured cluster.ray_address ({self.ray_address!r})")

    def check_trainer(self, spec: dict[str, Any]) -> None:
        if not _inside(spec["checkpointDir"], self.data_dir):
            raise _refuse(f"trainer-start: checkpointDir {spec['checkpointDir']!r} is outside reef.data_dir")
        if spec["modelPath"] != self.trainer_model_path:
            raise _refuse(f"trainer-start: modelPath {spec['modelPath']!r} is not the configured cluster.rollout.model_path")

    def check_checkpoint(self, path: str) -> None:
        # A rollback to the base release loads the configured model itself.
        if os.path.realpath(path) == os.path.realpath(self.trainer_model_path):
            return
        if not _inside(path, self.data_dir):
            raise _refuse(f"trainer-load: checkpoint {path!r} is outside reef.data_dir and is not the configured "
                          "cluster.rollout.model_path")
