"""The hf engine's end of SGLang's distributed weight update, over gloo.

    /init_weights_update_group        {master_address, master_port, rank_offset, world_size, group_name, backend}
    /update_weights_from_distributed  {names, dtypes, shapes, group_name, flush_cache, weight_version}
    /destroy_weights_update_group     {group_name}
    /begin_weight_update, /end_weight_update   {}

Updates happen inside a session, as in SGLang 0.5.23, which refuses `update_weights_from_distributed`
outside one, a second `begin` while one is open, and an `end` with none open
(`srt/managers/scheduler_components/weight_updater.py:187-198, 309-335`); the messages are SGLang's,
so a sender is tested here against the answers it gets there.

The engine is one worker: it joins as rank `rank_offset` (SGLang's TP worker i joins as
`rank_offset + i`). Tensors are received into fresh buffers while requests keep generating; only a
complete, checked set reaches the model, under the engine's lock. So a transfer that breaks off, or
one that names a tensor the model lacks, leaves the weights that were serving. Each call is applied
whole or not at all; a sender that splits the weights into several calls (buckets) and fails
between two has updated the earlier buckets, as with SGLang: it must finish with a complete load
(Reef falls back to `update_weights_from_disk` of the same checkpoint).

A call whose tensors can be received but not applied still receives them, so the sender's
broadcasts complete and it reads the refusal instead of waiting out its timeout.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from ..weight_group import broadcast, dtype_of, join_group, leave_group
from .weights import WeightError


class WeightGroups:
    """The weight groups this engine has joined, by name."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._groups: dict[str, Any] = {}
        # One transfer per group at a time: two interleaved calls would pair the wrong broadcasts.
        self._transfer: dict[str, threading.Lock] = {}
        self._session = False
        self._session_lock = threading.Lock()  # each request runs on a thread of its own

    def begin(self) -> str:
        with self._session_lock:
            if self._session:
                raise WeightError("a weight-update session is already open; call end_weight_update() first")
            self._session = True
        return "Success"

    def in_session(self) -> bool:
        return self._session

    def end(self) -> str:
        with self._session_lock:
            if not self._session:
                raise WeightError("no weight-update session is open; call begin_weight_update() first")
            self._session = False
        return "Success"

    def init(self, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str,
             backend: str) -> str:
        if backend == "nccl":
            raise WeightError("backend nccl moves CUDA tensors, and the hf engine keeps its weights on the CPU: "
                              "use backend gloo")
        if backend != "gloo":
            raise WeightError(f"backend {backend!r}: the hf engine joins weight groups over gloo only")
        if not group_name:
            raise WeightError("group_name must not be empty")
        if group_name in self._groups:
            raise WeightError(f"weight group {group_name!r} already exists; destroy it first")
        if not 1 <= rank_offset < world_size:
            raise WeightError(f"rank_offset {rank_offset} does not fit world_size {world_size} (the sender is rank 0)")
        try:
            self._groups[group_name] = join_group(master_address, master_port, rank_offset, world_size, group_name,
                                                  backend, self.timeout_s)
            self._transfer[group_name] = threading.Lock()
        except Exception as e:  # torch raises RuntimeError, DistStoreError, TimeoutError...
            raise WeightError(f"cannot join weight group {group_name!r} at {master_address}:{master_port}: {e}") from e
        return f"joined weight group {group_name!r} as rank {rank_offset} of {world_size} (gloo)"

    def destroy(self, group_name: str) -> str:
        group = self._groups.pop(group_name, None)
        if group is None:
            raise WeightError(f"no weight group {group_name!r}")
        self._transfer.pop(group_name, None)
        leave_group(group)
        return f"left weight group {group_name!r}"

    def receive(self, names: list[str], dtypes: list[str], shapes: list[list[int]], group_name: str,
                model: torch.nn.Module, tied: bool) -> dict[str, torch.Tensor]:
        """Receive one call's tensors from rank 0, then check them against `model`; raises WeightError."""
        if not self._session:
            raise WeightError("update_weights_from_distributed must run between begin_weight_update() and "
                              "end_weight_update()")
        if not (len(names) == len(dtypes) == len(shapes)):
            raise WeightError(f"names, dtypes and shapes differ in length ({len(names)}, {len(dtypes)}, {len(shapes)})")
        group = self._groups.get(group_name)
        lock = self._transfer.get(group_name)
        if group is None or lock is None:
            raise WeightError(f"no weight group {group_name!r}: call /init_weights_update_group first")
        try:
            buffers = [torch.empty([int(d) for d in shape], dtype=dtype_of(dtype)) for dtype, shape in zip(dtypes, shapes)]
        except (ValueError, TypeError, RuntimeError) as e:
            raise WeightError(f"cannot allocate the announced tensors: {e}") from e
        with lock:
            try:
                for work in [broadcast(b, group) for b in buffers]:
                    work.wait()
            except Exception as e:
                # The group's peer is gone or late: the group is of no further use.
                self._groups.pop(group_name, None)
                try:
                    leave_group(group)
                except Exception:
                    pass  # a broken group may refuse a clean exit; it is dropped either way
                raise WeightError(f"transfer over {group_name!r} broke off: {e}") from e
        return checked(dict(zip(names, buffers)), model, tied)


def checked(received: dict[str, torch.Tensor], model: torch.nn.Module, tied: bool) -> dict[str, torch.Tensor]:
    """The tensors of one update call, checked against the served model; raises WeightError."""
    expected = dict(model.state_dict())
    if tied:
        received.pop("lm_head.weight", None)  # updated through the embedding it shares storage with
    unknown = sorted(set(received) - set(expected))
    if unknown:
        raise WeightError(f"the served model has no tensor(s) {unknown[:5]}")
    for name, tensor in received.items():
        want = expected[name]
        if tuple(tensor.shape) != tuple(want.shape):
            raise WeightError(f"{name}: shape {tuple(tensor.shape)} != {tuple(want.shape)}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise WeightError(f"{name}: holds NaN or infinite values")
    return received
