"""How the weight group is built for NCCL, checked on the CPU (torch's NCCL options exist in the
CUDA build the lock installs; a group itself needs a GPU, and the GPU check drives that)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from reef_shim import weight_group
from reef_shim.engine_process import pick_free_port


def test_nccl_weight_groups_set_up_their_communicator_nonblocking_and_gloo_ones_take_defaults() -> None:
    opts = weight_group.backend_options("nccl", timedelta(seconds=42))
    assert opts.config.blocking == 0 and opts._timeout == timedelta(seconds=42)
    assert weight_group.backend_options("gloo", timedelta(seconds=42)) is None


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_join_group_hands_those_options_to_torch(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A blocking NCCL set-up cannot be aborted by a pusher that gives up on an engine that never
    # joins (weight_group.backend_options); the options must reach the group torch builds.
    import torch.distributed.distributed_c10d as c10d

    seen: dict[str, Any] = {}
    group = object()

    def helper(*args: Any, **kwargs: Any) -> tuple[object, None]:
        seen.update(kwargs)
        return group, None

    monkeypatch.setattr(c10d, "_new_process_group_helper", helper)
    try:
        weight_group.join_group("127.0.0.1", pick_free_port("127.0.0.1"), 0, 1, "reef-weights-test", backend, 5.0)
    finally:
        c10d._world.pg_group_ranks.pop(group, None)
    opts = seen["backend_options"]
    if backend == "nccl":
        assert opts.config.blocking == 0 and opts._timeout == timedelta(seconds=5)
    else:
        assert opts is None
    assert seen["timeout"] == timedelta(seconds=5)
