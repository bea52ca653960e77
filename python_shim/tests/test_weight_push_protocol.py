"""Reef's weight pusher against the answers of the pinned SGLang (0.5.23) and of the release before
its update sessions (0.5.16), over a real gloo group.

The engine is a test double: an HTTP server in a process of its own that joins the group as rank 1 with
`weight_group.join_group` (as SGLang's workers do) and answers each route with SGLang's status,
body and message (0.5.23: `srt/managers/scheduler_components/weight_updater.py:187-198, 309-335`;
`srt/entrypoints/http_server.py:1458-1505`; 0.5.16 has no session routes, so FastAPI's 404).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from reef_shim.engine_process import pick_free_port
from reef_shim.trainer import weight_push
from reef_shim.trainer.weight_push import WeightPusher, WeightPushError
from reef_shim.weight_group import broadcast

SHIM = Path(__file__).resolve().parents[1]
FAKE = Path(__file__).with_name("fake_sglang_weights.py")


class FakeSGLang:
    """The engine process (`fake_sglang_weights.py`): it must be a process of its own, as torch keeps
    one registry of group names per process and both ends register the group's."""

    def __init__(self, release: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(SHIM), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, str(FAKE), release], env=env, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("port "), f"the fake engine did not start: {line!r}"
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def set(self, **state: Any) -> None:
        req = urllib.request.Request(f"{self.url}/_test/set", data=json.dumps(state).encode(), method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/_test/state", timeout=10) as r:
            return json.loads(r.read())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture()
def engine(request: pytest.FixtureRequest) -> Iterator[FakeSGLang]:
    fake = FakeSGLang(getattr(request, "param", "0.5.23"))
    yield fake
    fake.close()


WEIGHTS = {f"model.layers.{i}.w": torch.randn(64, 32) for i in range(4)}


def pusher(engine: FakeSGLang, timeout_s: float = 30.0) -> WeightPusher:
    # 8 KiB buckets: each 64×32 fp32 tensor is one, so a push makes four update calls.
    p = WeightPusher(engine.url, "gloo", ("127.0.0.1", pick_free_port("127.0.0.1")), timeout_s=timeout_s,
                     bucket_bytes=8 * 1024)
    p.connect()
    return p


def updates(engine: FakeSGLang) -> list[str]:
    return [c for c in engine.state()["calls"] if c not in ("init_weights_update_group", "destroy_weights_update_group")]


def received_all(engine: FakeSGLang) -> bool:
    got = engine.state()["received"]
    return got == {n: hashlib.sha256(t.numpy().tobytes()).hexdigest() for n, t in WEIGHTS.items()}


def test_a_push_runs_inside_one_update_session_and_closes_it(engine: FakeSGLang) -> None:
    p = pusher(engine)
    try:
        p.push(WEIGHTS.items(), "v1")
    finally:
        p.close()
    assert updates(engine) == ["begin_weight_update"] + ["update_weights_from_distributed"] * 4 + [
        "flush_cache", "end_weight_update"]
    assert engine.state()["session"] is False
    assert received_all(engine)


@pytest.mark.parametrize("engine", ["0.5.16"], indirect=True)
def test_an_engine_without_update_sessions_takes_the_push(engine: FakeSGLang) -> None:
    p = pusher(engine)
    try:
        p.push(WEIGHTS.items(), "v1")
    finally:
        p.close()
    assert updates(engine) == ["begin_weight_update"] + ["update_weights_from_distributed"] * 4 + ["flush_cache"]
    assert received_all(engine)


def test_a_refused_push_closes_its_session_so_the_next_push_is_taken(engine: FakeSGLang) -> None:
    engine.set(refuse="dtype float64 is not supported")
    p = pusher(engine)
    with pytest.raises(WeightPushError, match="dtype float64 is not supported"):
        p.push(WEIGHTS.items(), "v1")
    p.close()
    state = engine.state()
    assert state["session"] is False and state["calls"][-2:] == ["end_weight_update", "destroy_weights_update_group"]
    engine.set(refuse=None)
    p = pusher(engine)
    try:
        p.push(WEIGHTS.items(), "v2")
    finally:
        p.close()
    assert received_all(engine)


def test_a_session_left_open_by_a_rank_that_died_is_closed_and_the_push_goes_ahead(engine: FakeSGLang) -> None:
    engine.set(session=True)
    p = pusher(engine)
    try:
        p.push(WEIGHTS.items(), "v1")
    finally:
        p.close()
    assert updates(engine)[:3] == ["begin_weight_update", "end_weight_update", "begin_weight_update"]
    assert engine.state()["session"] is False and received_all(engine)


def test_a_refusal_is_heard_while_the_first_broadcast_blocks_as_nccl_builds_its_communicator(
        engine: FakeSGLang, monkeypatch: pytest.MonkeyPatch) -> None:
    # NCCL creates a group's communicator in its first collective, which blocks until every rank has
    # joined; gloo queues the work and returns. So the sender's broadcast is made to block here until
    # the peer takes part, which a refusing engine never does. A pusher that broadcast on its own
    # thread would sit there until the group's timeout and fail with the backend's error instead.
    def blocking(tensor: torch.Tensor, group: Any) -> Any:
        work = broadcast(tensor, group)
        work.wait()
        return work

    monkeypatch.setattr(weight_push, "broadcast", blocking)
    engine.set(refuse="cannot allocate the receive buffers")
    p = pusher(engine, timeout_s=10.0)
    with pytest.raises(WeightPushError, match="engine refused: cannot allocate the receive buffers"):
        p.push(WEIGHTS.items(), "v1")
    assert engine.state()["session"] is False
    with pytest.raises(WeightPushError, match="connect a new session"):
        p.push(WEIGHTS.items(), "v1")  # the group it gave up on is never used again
    p.close()


def test_a_push_hosts_its_rendezvous_on_its_master_address_alone(engine: FakeSGLang) -> None:
    # torch's own tcp:// rendezvous listened on `::` whatever address rank 0 gave the engine, so a
    # host on the LAN could join the group and take the weights (review M5).
    from listeners import listening, not_loopback, refused_from_lan

    before = set(listening([os.getpid()]))
    p = WeightPusher(engine.url, "gloo", ("127.0.0.1", 0), timeout_s=30.0, bucket_bytes=8 * 1024)
    p.connect()
    try:
        opened = [f for f in listening([os.getpid()]) if f not in before]
        assert any(port == p.master[1] for _, _, port in opened), opened  # the store, on the port sent
        assert not_loopback(opened) == []
        assert refused_from_lan(p.master[1]) in (True, None)
        p.push(WEIGHTS.items(), "v1")
    finally:
        p.close()
    assert received_all(engine)


def test_a_request_still_running_at_the_last_bucket_is_waited_out_and_the_version_is_the_new_one(
        engine: FakeSGLang) -> None:
    # 0.5.23 flushes the cache of an update only when nothing runs or waits; refused, it answers 400
    # after loading the weights, and reports the old version. A push that asked the last bucket to
    # flush read as failed (and fell back to disk, which flushes the same way), while the engine
    # served the new weights under the old label.
    engine.set(busy_s=1.0)
    p = pusher(engine)
    try:
        p.push(WEIGHTS.items(), "v1")
    finally:
        p.close()
    state = engine.state()
    assert received_all(engine) and state["weight_version"] == "v1" and state["session"] is False
    assert updates(engine)[-2:] == ["flush_cache", "end_weight_update"]


def test_an_engine_that_never_goes_idle_fails_the_push_within_its_deadline(engine: FakeSGLang) -> None:
    engine.set(busy_s=600.0)
    p = pusher(engine, timeout_s=3.0)
    with pytest.raises(WeightPushError, match="never went idle"):
        p.push(WEIGHTS.items(), "v1")
    p.close()
    assert engine.state()["session"] is False
