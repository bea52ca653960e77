"""Both ends of a weight push must run one torch build (and one NCCL where NCCL carries it)."""

from __future__ import annotations

from reef_shim.stack_versions import mismatch, stack_versions


def test_versions_are_read_from_the_installed_builds() -> None:
    import torch

    here = stack_versions()
    assert here["torch"] is not None and torch.__version__.startswith(here["torch"])
    assert here["nccl"] is not None  # the lock's torch is a CUDA build, with its NCCL wheel


def test_a_different_torch_is_refused_and_nccl_counts_only_where_nccl_carries_the_push() -> None:
    here = {"torch": "2.15.0", "nccl": "2.30.7", "python": "3.11.2"}
    assert mismatch(here, dict(here), "nccl") is None
    assert "torch 2.15.0 here, 2.14.1 in the engine's environment" in mismatch(here, {**here, "torch": "2.14.1"}, "gloo")
    assert mismatch(here, {**here, "nccl": "2.27.3"}, "gloo") is None
    assert "nccl 2.30.7 here, 2.27.3" in mismatch(here, {**here, "nccl": "2.27.3"}, "nccl")
    assert mismatch(here, {**here, "python": "3.12.1"}, "nccl") is None
    # An engine whose versions were not recorded (an older shim's) is not refused on that ground.
    assert mismatch(here, None, "nccl") is None
