"""GPU weight sync: trainer rank 0 broadcasts the new weights into a running SGLang engine over NCCL.

UNVERIFIED: written against SGLang's documented HTTP API and run only by the GPU-marked test
(`test_trainer_gpu.py`); nothing on a CPU machine exercises it. The CPU path is
`update_weights_from_disk` with the checkpoint every step writes anyway, and remains the fallback.

Protocol (SGLang `/init_weights_update_group`, `/update_weights_from_distributed`):
1. Trainer rank 0 and the engine's TP workers form a private NCCL group of `1 + engine_tp` ranks;
   the trainer is rank 0, the engine's workers take ranks 1.. (`rank_offset: 1`). Both sides
   rendezvous on a TCP store at `master` and prefix its keys with `group_name`, so the group does
   not touch the trainer's own FSDP process group.
2. Per bucket of tensors: tell the engine the names, dtypes and shapes (HTTP, in a thread, because
   the engine answers only after it has received them), then broadcast each tensor from rank 0.
The HTTP calls block until the NCCL side completes, so each runs in a thread next to the collective.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from datetime import timedelta
from typing import Any, Iterable

import torch

BUCKET_BYTES = 512 * 1024 * 1024


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


class _Call(threading.Thread):
    """An HTTP call that must run while this thread takes part in a collective."""

    def __init__(self, url: str, body: dict[str, Any], timeout: float) -> None:
        super().__init__(daemon=True)
        self.args_ = (url, body, timeout)
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = _post(*self.args_)
        except BaseException as e:  # re-raised on the caller's thread by finish()
            self.error = e

    def finish(self, what: str) -> dict[str, Any]:
        self.join()
        if self.error is not None:
            raise RuntimeError(f"{what}: {self.error}") from self.error
        assert self.result is not None
        if self.result.get("success") is False:
            raise RuntimeError(f"{what}: engine refused: {self.result.get('message')}")
        return self.result


class NcclWeightSync:
    def __init__(self, engine_url: str, engine_tp: int, master: tuple[str, int], group_name: str = "reef-weights",
                 timeout_s: float = 300.0) -> None:
        self.url = engine_url.rstrip("/")
        self.world = 1 + engine_tp
        self.master = master
        self.group_name = group_name
        self.timeout_s = timeout_s
        self.group: Any = None

    def connect(self) -> None:
        """Form the NCCL group with the engine (call on trainer rank 0, on a CUDA device)."""
        from torch.distributed import PrefixStore, TCPStore

        call = _Call(f"{self.url}/init_weights_update_group", {
            "master_address": self.master[0], "master_port": self.master[1], "rank_offset": 1,
            "world_size": self.world, "group_name": self.group_name, "backend": "nccl"}, self.timeout_s)
        call.start()
        store = TCPStore(self.master[0], self.master[1], self.world, is_master=True,
                         timeout=timedelta(seconds=self.timeout_s))
        pg = torch.distributed.ProcessGroupNCCL(PrefixStore(self.group_name, store), 0, self.world)
        self.group = pg
        call.finish("init_weights_update_group")

    def push(self, tensors: Iterable[tuple[str, torch.Tensor]], weight_version: str) -> int:
        """Broadcast every (name, tensor) to the engine in buckets; returns the bytes sent."""
        if self.group is None:
            raise RuntimeError("NcclWeightSync.push before connect")
        sent, bucket, size = 0, [], 0
        items = list(tensors)
        for i, (name, t) in enumerate(items):
            bucket.append((name, t.detach().to("cuda", non_blocking=True).contiguous()))
            size += t.numel() * t.element_size()
            if size >= BUCKET_BYTES or i == len(items) - 1:
                sent += self._bucket(bucket, weight_version, last=i == len(items) - 1)
                bucket, size = [], 0
        return sent

    def _bucket(self, bucket: list[tuple[str, torch.Tensor]], weight_version: str, last: bool) -> int:
        body = {"names": [n for n, _ in bucket], "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket], "group_name": self.group_name, "flush_cache": last,
                "weight_version": weight_version if last else None}
        call = _Call(f"{self.url}/update_weights_from_distributed", body, self.timeout_s)
        call.start()
        for _, t in bucket:
            self.group.broadcast([t], torch.distributed.BroadcastOptions()).wait()
        call.finish("update_weights_from_distributed")
        return sum(t.numel() * t.element_size() for _, t in bucket)

    def close(self) -> None:
        if self.group is not None:
            try:
                _post(f"{self.url}/destroy_weights_update_group", {"group_name": self.group_name}, 30)
            except Exception:
                pass  # older SGLang has no such endpoint; the engine drops the group when it stops
            self.group = None
