"""Trainer rank 0 pushes weights into a running engine: SGLang's distributed weight update.

    /init_weights_update_group        rank 0 (here) hosts the rendezvous; the engine's workers join
                                      as ranks 1..tp (`rank_offset: 1`)
    /begin_weight_update              opens the engine's update session (SGLang 0.5.17+, which
                                      refuses an update outside one; 404 on older releases)
    /update_weights_from_distributed  per bucket: names, dtypes, shapes; then one broadcast per tensor
    /flush_cache?timeout=T            after the last bucket, inside the session: drops the cache the
                                      old weights filled, waiting up to T s for the engine to go idle
    /end_weight_update                closes the session, after a failure too: a session left open
                                      makes the engine refuse every later `begin`
    /destroy_weights_update_group     when the push is over

The backend follows both ends (`push_backend`): `nccl` when the trainer and the engine both hold
CUDA tensors (the trainer on GPUs, into SGLang), else `gloo` (a CPU machine; or a trainer on a GPU
pushing into the hf engine, which runs on the CPU). NCCL refuses two ranks on one GPU, so the NCCL
path needs the engine on a GPU of its own; it is exercised only by the GPU-marked test
(`tests/test_trainer_gpu.py`), which has not run yet (it needs SGLang and two GPUs).
Both ends form the group through `weight_group.join_group`, which builds it the way SGLang's
engine does.

The engine answers each HTTP call only after its side of the collective, so each call runs in a
thread next to the broadcasts, and the broadcasts run in a thread of their own: under NCCL the
group's first collective creates its communicator and blocks until every rank has joined, so an
engine that refuses without taking part (no session, an unknown group, a dtype it cannot allocate)
would hold a caller that broadcast itself where no timeout reaches it. The caller watches the call,
the broadcasts and one deadline for the whole push (`timeout_s`), and on giving up aborts the group,
so no NCCL work is left for torch's watchdog to time out (which tears down the process).
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

from ..dist_net import bind_listener
from ..engines.admin_key import admin_headers
from ..weight_group import broadcast, dtype_name, join_group, leave_group

BUCKET_BYTES = 512 * 1024 * 1024
# Each of the two calls that close a session (end the update, destroy the group) waits this long at most.
CLOSE_TIMEOUT_S = 15.0
# How long one `/flush_cache` waits for the engine to go idle, at most (and never past the push's deadline).
FLUSH_WAIT_S = 30.0


class WeightPushError(Exception):
    pass


def request(url: str, body: dict[str, Any], timeout: float) -> tuple[int, dict[str, Any]]:
    """POST JSON: the status and the body; an HTTP error status still returns the body (SGLang
    answers refusals with 400)."""
    # Every POST of a push is an engine admin route (the update session, the group, the buckets).
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **admin_headers()})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            answer = {"success": False, "message": f"HTTP {e.code}: {raw[:300]!r}"}
        return e.code, answer


def post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    return request(url, body, timeout)[1]


def engine_server_info(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """The engine's server info (SGLang: its resolved server args; the hf engine: tp_size, device and
    dtype); empty for an engine without that route. `/server_info` first: SGLang 0.5.23 still serves
    `/get_server_info` but logs a deprecation warning per call (`srt/entrypoints/http_server.py:853-860`)."""
    for route in ("/server_info", "/get_server_info"):
        try:
            with urllib.request.urlopen(f"{url}{route}", timeout=timeout) as r:
                info = json.loads(r.read())
                return info if isinstance(info, dict) else {}
        except urllib.error.HTTPError as e:
            if e.code != 404:
                return {}
        except (urllib.error.URLError, ValueError, OSError):
            return {}
    return {}


# SGLang's `--dtype` names (`srt/configs/model_config.py` `_STR_DTYPE_TO_TORCH_DTYPE`).
_ENGINE_DTYPES = {"half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
                  "float": torch.float32, "float32": torch.float32}


def push_dtype(engine_dtype: Any, config: Any) -> torch.dtype | None:
    """The dtype the engine serves, which is what the push sends: the engine casts what it receives
    into it, so fp32 master weights doubled the bytes and the engine's receive buffers for nothing
    (cast here or there, it is the same rounding). `auto` (SGLang's default) resolves as SGLang
    resolves it (0.5.23 `srt/configs/model_config.py:2284-2325`): the checkpoint's dtype, except
    float32, which it serves as float16 (bfloat16 for Gemma). None: send as held (an engine that does
    not say)."""
    if not isinstance(engine_dtype, str):
        return None
    name = engine_dtype.lower()
    if name in _ENGINE_DTYPES:
        return _ENGINE_DTYPES[name]
    if name != "auto":
        return None
    held = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(held, str):
        held = _ENGINE_DTYPES.get(held)
    if held is None or held == torch.float32:
        return torch.bfloat16 if str(getattr(config, "model_type", "")).startswith("gemma") else torch.float16
    return held


def engine_workers(url: str, timeout: float = 10.0) -> int:
    """The engine's TP size; 1 for an engine that does not say."""
    return int(engine_server_info(url, timeout).get("tp_size") or 1)


def push_backend(trainer_device: str, engine_device: str | None) -> str:
    """`nccl` only when both ends hold CUDA tensors. An engine on the CPU (the hf engine) cannot
    join an NCCL group, so a trainer on a GPU pushes its gathered (CPU) weights to it over gloo.
    SGLang reports `device: cuda`; an engine that reports nothing is taken to be where the trainer is."""
    engine = (engine_device or trainer_device).split(":")[0]
    return "nccl" if trainer_device.split(":")[0] == "cuda" and engine == "cuda" else "gloo"


def begin_session(url: str, timeout_s: float) -> bool:
    """Open the engine's update session; False for an engine that has none (SGLang ≤ 0.5.16 answers
    404). The engine takes its writer lock for it, so this is also where it waits for the
    generations in flight: over HTTP, within the push's deadline, before any collective is pending."""
    status, answer = request(f"{url}/begin_weight_update", {}, timeout_s)
    if status == 404:
        return False
    if answer.get("success") is not True and "already open" in str(answer.get("message")):
        # Only Reef's trainer updates this engine, so the open session is one a push of ours left
        # (its rank died mid-push): close it, then open ours.
        end_session(url)
        status, answer = request(f"{url}/begin_weight_update", {}, timeout_s)
    if answer.get("success") is not True:
        raise WeightPushError(f"begin_weight_update: engine refused: {answer.get('message')}")
    return True


def end_session(url: str) -> None:
    try:
        status, answer = request(f"{url}/end_weight_update", {}, CLOSE_TIMEOUT_S)
    except OSError as e:
        raise WeightPushError(f"end_weight_update: {type(e).__name__}: {e}") from e
    if answer.get("success") is not True:
        raise WeightPushError(f"end_weight_update: engine refused: {answer.get('message')}")


def flush_cache(url: str, deadline: float) -> None:
    """Drop the engine's prefix cache of the old weights, once the new ones are all in.

    The buckets carry `flush_cache: false` and this runs after the last. SGLang 0.5.23 flushes an
    update's cache only if no request is running or queued at that moment, and answers a refused
    flush with `success: false` *after* it loaded the weights and recorded the scheduler's version
    change, while the version the tokenizer manager reports stays the old one
    (`srt/managers/scheduler_components/weight_updater.py:120-133, :222-227`;
    `srt/managers/tokenizer_control_mixin.py:529-531`): a push that met one stray request read as
    failed, and the engine served the new weights under the old label. `/flush_cache?timeout=T`
    instead waits up to T s for the engine to go idle (`srt/entrypoints/http_server.py:1025-1040`,
    `scheduler_components/flush_wrapper.py:22-61`) and answers in plain text, 200 or 400; a release
    without the parameter (0.5.16) ignores it and refuses at once, so a refusal is asked again,
    with a short pause, until the push's deadline."""
    pause, last = 0.05, ""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise WeightPushError(f"flush_cache: the engine never went idle to drop the old weights' cache ({last.strip()})")
        wait = min(FLUSH_WAIT_S, max(0.0, left - 1.0))
        req = urllib.request.Request(f"{url}/flush_cache?timeout={wait:.1f}", data=b"", method="POST", headers=admin_headers())
        try:
            with urllib.request.urlopen(req, timeout=wait + 5.0) as r:
                r.read()
                return
        except urllib.error.HTTPError as e:
            last = e.read().decode("utf-8", "replace")[:300] or f"HTTP {e.code}"
            if e.code not in (400, 503):
                raise WeightPushError(f"flush_cache: HTTP {e.code}: {last.strip()}") from e
        except OSError as e:
            raise WeightPushError(f"flush_cache: {type(e).__name__}: {e}") from e
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 1.0)


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


class _Broadcasts(threading.Thread):
    """Rank 0's side of one bucket, off the caller's thread (see the module's docstring)."""

    def __init__(self, tensors: list[torch.Tensor], group: Any) -> None:
        super().__init__(daemon=True, name="weight-push-broadcast")
        self.tensors, self.group = tensors, group
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for work in [broadcast(t, self.group) for t in self.tensors]:
                work.wait()  # raises what the backend saw (a peer that left mid-way, the group's timeout)
        except BaseException as e:  # read on the caller's thread
            self.error = e


class WeightPusher:
    """One push session: connect, push (once or more), close. Call on trainer rank 0.

    `master` is where rank 0 hosts the group's rendezvous, and the address the engine is sent to
    join it at: loopback only when the engine runs on this host (`dist_net`). Port 0 picks one.

    `timeout_s` bounds the whole of connect and the pushes after it; closing a session adds at most
    `CLOSE_TIMEOUT_S` for each of its two calls, so a rank always answers within
    `timeout_s + 2 * CLOSE_TIMEOUT_S`, whatever the engine does."""

    def __init__(self, engine_url: str, backend: str, master: tuple[str, int], engine_ranks: int = 1,
                 timeout_s: float = 300.0, bucket_bytes: int = BUCKET_BYTES, dtype: torch.dtype | None = None) -> None:
        self.url = engine_url.rstrip("/")
        self.dtype = dtype  # floating-point tensors are sent in it (`push_dtype`); None: as held
        self.backend = backend
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.world = 1 + engine_ranks
        self.master = master
        # A fresh name per session: an engine that kept a group it failed to destroy refuses the old name.
        self.group_name = f"reef-weights-{uuid.uuid4().hex[:12]}"
        self.timeout_s = timeout_s
        self.bucket_bytes = bucket_bytes
        self.group: Any = None
        self._deadline = time.monotonic() + timeout_s
        # Set when a push gave up with broadcasts still pending: the group is aborted, not destroyed
        # (destroying waits for them), and never used again.
        self._abandoned = False

    def _left(self, what: str) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise WeightPushError(f"{what}: the push's {self.timeout_s:.0f} s were spent")
        return left

    def connect(self) -> None:
        self._deadline = time.monotonic() + self.timeout_s
        # Bound before the engine is told the port (port 0: one picked now), so nothing else can take it.
        listener = bind_listener(*self.master)
        self.master = (self.master[0], int(listener.getsockname()[1]))
        call = _Call(f"{self.url}/init_weights_update_group", {
            "master_address": self.master[0], "master_port": self.master[1], "rank_offset": 1,
            "world_size": self.world, "group_name": self.group_name, "backend": self.backend},
            self._left("init_weights_update_group"))
        call.start()
        # Rank 0 hosts the rendezvous and waits there for the engine's ranks; an engine that is gone
        # or refuses never comes, so the join runs aside and the call's answer is watched instead.
        joined: dict[str, Any] = {}

        def join() -> None:
            try:
                joined["group"] = join_group(self.master[0], self.master[1], 0, self.world, self.group_name,
                                             self.backend, self.timeout_s, listener)
            except BaseException as e:  # read below
                joined["error"] = e

        joiner = threading.Thread(target=join, daemon=True, name="weight-group-join")
        joiner.start()
        while joiner.is_alive():
            why = call.failure()
            if why is None and time.monotonic() > self._deadline:
                why = f"no group within {self.timeout_s:.0f} s"
            if why is not None:
                # The joiner times out on its own; the group it might still form is never used.
                raise WeightPushError(f"init_weights_update_group: {why}")
            joiner.join(0.01)
        if "error" in joined:
            why = call.failure()
            raise WeightPushError(f"init_weights_update_group: {why or joined['error']}") from joined["error"]
        self.group = joined["group"]
        call.finish("init_weights_update_group", self._left("init_weights_update_group"))

    def push(self, tensors: Iterable[tuple[str, torch.Tensor]], weight_version: str) -> int:
        """Send every (name, tensor) in buckets, inside one update session; the last carries the
        weight version. Returns bytes sent."""
        if self.group is None:
            raise WeightPushError("push before connect")
        if self._abandoned:
            raise WeightPushError("push after a failed push: connect a new session")
        items = list(tensors)
        if not items:
            raise WeightPushError("nothing to push")
        session = self._begin()
        try:
            sent, bucket, size = 0, [], 0
            for i, (name, t) in enumerate(items):
                dtype = self.dtype if self.dtype is not None and t.is_floating_point() else t.dtype
                sent_t = t.detach().to(self.device, dtype).contiguous()
                bucket.append((name, sent_t))
                size += sent_t.numel() * sent_t.element_size()
                last = i == len(items) - 1
                if size >= self.bucket_bytes or last:
                    sent += self._bucket(bucket, weight_version if last else None)
                    bucket, size = [], 0
            flush_cache(self.url, self._deadline)
        finally:
            if session:
                end_session(self.url)
        return sent

    def _begin(self) -> bool:
        return begin_session(self.url, self._left("begin_weight_update"))

    def _bucket(self, bucket: list[tuple[str, torch.Tensor]], weight_version: str | None) -> int:
        what = "update_weights_from_distributed"
        body = {"names": [n for n, _ in bucket], "dtypes": [dtype_name(t.dtype) for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket], "group_name": self.group_name, "flush_cache": False,
                "weight_version": weight_version}
        call = _Call(f"{self.url}/{what}", body, self._left(what))
        call.start()
        sender = _Broadcasts([t for _, t in bucket], self.group)
        sender.start()
        while sender.is_alive():
            why = call.failure()
            # The call's own timeout is the time left to the push's deadline: timing out, it met
            # the deadline, whichever of the two this loop saw first.
            if (why is None and time.monotonic() > self._deadline) or isinstance(call.error, TimeoutError):
                why = f"broadcast not done in {self.timeout_s:.0f} s"
            if why is not None:
                self._abort()
                raise WeightPushError(f"{what}: {why}")
            sender.join(0.002)
        if sender.error is not None:
            self._abort()
            # The engine's answer says more than the backend's error (it saw why the peer left).
            call.join(min(5.0, max(0.0, self._deadline - time.monotonic())))
            raise WeightPushError(f"{what}: {call.failure() or sender.error}") from sender.error
        call.finish(what, max(0.0, self._deadline - time.monotonic()))
        return sum(t.numel() * t.element_size() for _, t in bucket)

    def _abort(self) -> None:
        """Give up on the group with broadcasts pending. NCCL work is cancelled, so torch's watchdog
        does not time it out later and tear the rank's process down; gloo cannot cancel, and its
        pending work ends at the group's timeout in the broadcasting thread."""
        self._abandoned = True
        try:
            from torch.distributed.distributed_c10d import _abort_process_group

            _abort_process_group(self.group)
        except Exception:
            pass  # already gone, or a backend that cannot abort: the group is never used again either way

    def close(self) -> None:
        if self.group is None:
            return
        try:
            post(f"{self.url}/destroy_weights_update_group", {"group_name": self.group_name}, CLOSE_TIMEOUT_S)
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


class TensorPusher:
    """The colocated push: trainer rank 0 and the engine share a device, where NCCL refuses a
    group, so each bucket goes by `/update_weights_from_tensor` as tensors in shared memory (CUDA
    IPC handles on a GPU, shared-memory segments on the CPU: `tensor_ipc`), inside an update
    session. The engine copies them into its weights before it answers, so a bucket is held only
    until then. `timeout_s` bounds the whole push."""

    def __init__(self, engine_url: str, device: torch.device, timeout_s: float = 300.0,
                 bucket_bytes: int = BUCKET_BYTES, dtype: torch.dtype | None = None) -> None:
        self.url = engine_url.rstrip("/")
        self.device = device
        self.timeout_s = timeout_s
        self.bucket_bytes = bucket_bytes
        self.dtype = dtype

    def push(self, tensors: Iterable[tuple[str, torch.Tensor]], weight_version: str) -> int:
        from ..tensor_ipc import serialize

        items = list(tensors)
        if not items:
            raise WeightPushError("nothing to push")
        deadline = time.monotonic() + self.timeout_s

        def left(what: str) -> float:
            if time.monotonic() >= deadline:
                raise WeightPushError(f"{what}: the push's {self.timeout_s:.0f} s were spent")
            return deadline - time.monotonic()

        what = "update_weights_from_tensor"
        session = begin_session(self.url, left("begin_weight_update"))
        try:
            sent, bucket, size = 0, [], 0
            for i, (name, t) in enumerate(items):
                dtype = self.dtype if self.dtype is not None and t.is_floating_point() else t.dtype
                bucket.append((name, t.detach().to(self.device, dtype).contiguous()))
                size += bucket[-1][1].numel() * bucket[-1][1].element_size()
                last = i == len(items) - 1
                if size >= self.bucket_bytes or last:
                    status, answer = request(f"{self.url}/{what}", {
                        "serialized_named_tensors": [serialize(bucket)], "flush_cache": False,
                        "weight_version": weight_version if last else None}, left(what))
                    if answer.get("success") is not True:
                        raise WeightPushError(f"{what}: engine refused: {answer.get('message')}")
                    sent += size
                    bucket, size = [], 0
            flush_cache(self.url, deadline)
        finally:
            if session:
                end_session(self.url)
        return sent
