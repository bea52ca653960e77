"""Trainer rank 0 pushes weights into a running engine: SGLang's distributed weight update.

    /init_weights_update_group        rank 0 (here) hosts the rendezvous; the engine's workers join
                                      as ranks 1..tp (`rank_offset: 1`)
    /update_weights_from_distributed  per bucket: names, dtypes, shapes; then one broadcast per tensor
    /destroy_weights_update_group     when the push is over

The backend follows both ends (`push_backend`): `nccl` when the trainer and the engine both hold
CUDA tensors (the trainer on GPUs, into SGLang), else `gloo` (a CPU machine; or a trainer on a GPU
pushing into the hf engine, which runs on the CPU). NCCL refuses two ranks on one GPU, so the NCCL
path needs the engine on a GPU of its own; it is exercised only by the GPU-marked test
(`tests/test_trainer_gpu.py`), which has not run yet (it needs SGLang and two GPUs).
Both ends form the group through `weight_group.join_group`, which builds it the way SGLang's
engine does.

The engine answers each HTTP call only after its side of the collective, so each call runs in a
thread next to the broadcasts. An engine that refuses a call without taking part (an unknown
group, a dtype it cannot allocate) would leave rank 0 waiting in its broadcast until the group's
timeout; the push therefore watches the call while it waits and gives up as soon as it failed.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any, Iterable

import torch

from ..weight_group import broadcast, dtype_name, join_group, leave_group

BUCKET_BYTES = 512 * 1024 * 1024


class WeightPushError(Exception):
    pass


def post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    """POST JSON; an HTTP error status still returns the body (SGLang answers refusals with 400)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return json.loads(raw)
        except ValueError:
            return {"success": False, "message": f"HTTP {e.code}: {raw[:300]!r}"}


def engine_server_info(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """The engine's `/get_server_info` (SGLang: its server args; the hf engine: tp_size and device);
    empty for an engine without that route."""
    try:
        with urllib.request.urlopen(f"{url}/get_server_info", timeout=timeout) as r:
            info = json.loads(r.read())
            return info if isinstance(info, dict) else {}
    except (urllib.error.URLError, ValueError, OSError):
        return {}


def engine_workers(url: str, timeout: float = 10.0) -> int:
    """The engine's TP size; 1 for an engine that does not say."""
    return int(engine_server_info(url, timeout).get("tp_size") or 1)


def push_backend(trainer_device: str, engine_device: str | None) -> str:
    """`nccl` only when both ends hold CUDA tensors. An engine on the CPU (the hf engine) cannot
    join an NCCL group, so a trainer on a GPU pushes its gathered (CPU) weights to it over gloo.
    SGLang reports `device: cuda`; an engine that reports nothing is taken to be where the trainer is."""
    engine = (engine_device or trainer_device).split(":")[0]
    return "nccl" if trainer_device.split(":")[0] == "cuda" and engine == "cuda" else "gloo"


class _Call(threading.Thread):
    """An HTTP call that must run while this thread takes part in a collective."""

    def __init__(self, url: str, body: dict[str, Any], timeout: float) -> None:
        super().__init__(daemon=True)
        self.args_ = (url, body, timeout)
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = post(*self.args_)
        except BaseException as e:  # read on the caller's thread by failure()/finish()
            self.error = e

    def failure(self) -> str | None:
        """Why the call failed, once it has; None while it runs or when it succeeded."""
        if self.is_alive():
            return None
        if self.error is not None:
            return f"{type(self.error).__name__}: {self.error}"
        if self.result is None or self.result.get("success") is not True:
            return f"engine refused: {(self.result or {}).get('message')}"
        return None

    def finish(self, what: str, timeout_s: float) -> dict[str, Any]:
        self.join(timeout_s)
        if self.is_alive():
            raise WeightPushError(f"{what}: no answer within {timeout_s:.0f} s")
        why = self.failure()
        if why is not None:
            raise WeightPushError(f"{what}: {why}")
        assert self.result is not None
        return self.result


class WeightPusher:
    """One push session: connect, push (once or more), close. Call on trainer rank 0."""

    def __init__(self, engine_url: str, backend: str, master: tuple[str, int], engine_ranks: int = 1,
                 timeout_s: float = 300.0, bucket_bytes: int = BUCKET_BYTES) -> None:
        self.url = engine_url.rstrip("/")
        self.backend = backend
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.world = 1 + engine_ranks
        self.master = master
        # A fresh name per session: an engine that kept a group it failed to destroy refuses the old name.
        self.group_name = f"reef-weights-{uuid.uuid4().hex[:12]}"
        self.timeout_s = timeout_s
        self.bucket_bytes = bucket_bytes
        self.group: Any = None
        # Set when a push gave up with broadcasts still pending: destroying such a group waits for
        # them (until the timeout), so it is dropped instead and its thread times out on its own.
        self._abandoned = False

    def connect(self) -> None:
        call = _Call(f"{self.url}/init_weights_update_group", {
            "master_address": self.master[0], "master_port": self.master[1], "rank_offset": 1,
            "world_size": self.world, "group_name": self.group_name, "backend": self.backend}, self.timeout_s)
        call.start()
        # Rank 0 hosts the rendezvous and waits there for the engine's ranks; an engine that is gone
        # or refuses never comes, so the join runs aside and the call's answer is watched instead.
        joined: dict[str, Any] = {}

        def join() -> None:
            try:
                joined["group"] = join_group(self.master[0], self.master[1], 0, self.world, self.group_name,
                                             self.backend, self.timeout_s)
            except BaseException as e:  # read below
                joined["error"] = e

        joiner = threading.Thread(target=join, daemon=True, name="weight-group-join")
        joiner.start()
        deadline = time.monotonic() + self.timeout_s
        while joiner.is_alive():
            why = call.failure()
            if why is None and time.monotonic() > deadline:
                why = f"no group within {self.timeout_s:.0f} s"
            if why is not None:
                # The joiner times out on its own; the group it might still form is never used.
                raise WeightPushError(f"init_weights_update_group: {why}")
            joiner.join(0.01)
        if "error" in joined:
            why = call.failure()
            raise WeightPushError(f"init_weights_update_group: {why or joined['error']}") from joined["error"]
        self.group = joined["group"]
        call.finish("init_weights_update_group", self.timeout_s)

    def push(self, tensors: Iterable[tuple[str, torch.Tensor]], weight_version: str) -> int:
        """Send every (name, tensor) in buckets; the last carries the weight version. Returns bytes sent."""
        if self.group is None:
            raise WeightPushError("push before connect")
        items = list(tensors)
        if not items:
            raise WeightPushError("nothing to push")
        sent, bucket, size = 0, [], 0
        for i, (name, t) in enumerate(items):
            bucket.append((name, t.detach().to(self.device).contiguous()))
            size += t.numel() * t.element_size()
            last = i == len(items) - 1
            if size >= self.bucket_bytes or last:
                sent += self._bucket(bucket, weight_version if last else None, last)
                bucket, size = [], 0
        return sent

    def _bucket(self, bucket: list[tuple[str, torch.Tensor]], weight_version: str | None, last: bool) -> int:
        body = {"names": [n for n, _ in bucket], "dtypes": [dtype_name(t.dtype) for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket], "group_name": self.group_name, "flush_cache": last,
                "weight_version": weight_version}
        call = _Call(f"{self.url}/update_weights_from_distributed", body, self.timeout_s)
        call.start()
        works = [broadcast(t, self.group) for _, t in bucket]
        deadline = time.monotonic() + self.timeout_s
        for work in works:
            while not work.is_completed():
                why = call.failure()
                if why is None and time.monotonic() > deadline:
                    why = f"broadcast not done in {self.timeout_s:.0f} s"
                if why is not None:
                    self._abandoned = True
                    raise WeightPushError(f"update_weights_from_distributed: {why}")
                time.sleep(0.002)
            try:
                work.wait()  # raises what the backend saw (a peer that left mid-way)
            except Exception:
                self._abandoned = True
                raise
        call.finish("update_weights_from_distributed", self.timeout_s)
        return sum(t.numel() * t.element_size() for _, t in bucket)

    def close(self) -> None:
        if self.group is None:
            return
        try:
            post(f"{self.url}/destroy_weights_update_group", {"group_name": self.group_name}, 30)
        except Exception:
            # An engine that stops drops its groups; nothing here depends on the answer. close()
            # runs in the rank's `finally`: anything it raised (a body that is not JSON, a broken
            # status line) would fail the rank, and the driver kills the whole group for that.
            pass
        if not self._abandoned:
            try:
                leave_group(self.group)
            except Exception:
                pass  # a group whose peer vanished may refuse a clean exit; it is unusable either way
        self.group = None
