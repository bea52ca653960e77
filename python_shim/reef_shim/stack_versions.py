"""The torch and NCCL a process runs with, for the check that both ends of a weight push match.

A weight group joins two torch builds over one wire protocol: gloo's and NCCL's frames and NCCL's
communicator set-up are versioned, and CUDA IPC handles are only read back by the torch that made
them. Ends that differ fail deep in a collective, or hang there. Read from the installed
distributions' metadata (no import of torch, so an engine's Ray actor can answer it cheaply for
the interpreter it launches the engine with); the NCCL is the wheel torch loads it from.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version
from typing import Any

_NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12")


def _dist(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def stack_versions() -> dict[str, str | None]:
    nccl = next((v for v in map(_dist, _NCCL_DISTS) if v is not None), None)
    return {"torch": _dist("torch"), "nccl": nccl, "python": platform.python_version()}


def mismatch(here: dict[str, Any], engine: dict[str, Any] | None, backend: str) -> str | None:
    """Why the two ends cannot form a weight group, or None. NCCL must match only where NCCL carries
    the push. An engine whose versions are unknown (one this shim did not record) is not refused."""
    if not engine:
        return None
    keys = ("torch", "nccl") if backend == "nccl" else ("torch",)
    differ = [f"{k} {here.get(k)} here, {engine.get(k)} in the engine's environment" for k in keys if here.get(k) != engine.get(k)]
    if not differ:
        return None
    return (f"the trainer and the engine run different builds ({'; '.join(differ)}): a weight group needs the same "
            "torch and NCCL on both ends. Run both from one venv (scripts/setup.sh --gpu builds it)")
