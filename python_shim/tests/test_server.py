"""The shim server over a real ZeroMQ socket: a DEALER talks to `python -m reef_shim.server`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import zmq

from reef_shim.messages import pack, unpack

SHIM_DIR = str(Path(__file__).resolve().parents[1])
LAYOUT = {"trainer": {"gpus": 4}, "rollout": {"gpus": 1}, "prm": {"gpus": 1, "replicas": 1},
          "student": {"gpus": 1}, "cpusPerBundle": 1, "colocate": False}


def shim_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SHIM_DIR, "PYTHONUNBUFFERED": "1"}


def read_ready(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"shim exited before its ready line: {proc.wait()}"
    ready = json.loads(line)
    assert ready["event"] == "ready"
    return ready


class Shim:
    def __init__(self, *extra: str, env: dict[str, str] | None = None, connect: bool = True) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reef_shim.server", "--endpoint", "tcp://127.0.0.1:*", *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**shim_env(), **(env or {})})
        self.ready = read_ready(self.proc)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 10_000)
        if connect:
            self.sock.connect(self.ready["endpoint"])

    def send_raw(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def recv(self) -> dict[str, Any]:
        return unpack(self.sock.recv())

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.send_raw(pack(msg))
        return self.recv()

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def shim() -> Iterator[Shim]:
    s = Shim()
    yield s
    s.close()


def test_ready_line_names_the_bound_endpoint(shim: Shim) -> None:
    assert shim.ready["pid"] == shim.proc.pid
    assert shim.ready["endpoint"].startswith("tcp://127.0.0.1:")
    assert not shim.ready["endpoint"].endswith(":*")


def test_ping_plan_and_status(shim: Shim) -> None:
    pong = shim.call({"type": "ping", "requestId": "p1"})
    assert pong == {"type": "ok", "requestId": "p1", "pid": shim.proc.pid, "version": "0.1.0", "rayConnected": False}
    plan = shim.call({"type": "plan-placement", "requestId": "p2", "layout": LAYOUT})
    assert [g["name"] for g in plan["plan"]["groups"]] == ["reef-trainer", "reef-rollout", "reef-prm-0", "reef-student"]
    assert plan["plan"]["totalGpus"] == 7
    status = shim.call({"type": "status", "requestId": "p3"})
    assert status == {"type": "ok", "requestId": "p3", "ray": None, "groups": [], "engines": []}


def test_starts_with_a_blank_engine_start_timeout() -> None:
    # The bridge client reads a blank REEF_ENGINE_START_TIMEOUT_S as the default; the shim used to
    # die at import (float('')) before its ready line.
    s = Shim(env={"REEF_ENGINE_START_TIMEOUT_S": ""})
    try:
        assert s.call({"type": "ping", "requestId": "p"})["type"] == "ok"
    finally:
        s.close()


def test_bad_messages_get_error_replies_and_the_shim_stays_up(shim: Shim) -> None:
    shim.send_raw(b"\xc1 not msgpack")
    err = shim.recv()
    assert (err["type"], err["code"], err["requestId"]) == ("error", "REEF_ERR_BAD_MESSAGE", None)
    shim.send_raw(pack({"type": "ping", "requestId": "a"}), b"second frame")
    assert shim.recv()["code"] == "REEF_ERR_BAD_MESSAGE"
    err = shim.call({"type": "warp", "requestId": "u1"})
    assert (err["code"], err["requestId"], err["retryable"]) == ("REEF_ERR_UNKNOWN_MESSAGE", "u1", False)
    err = shim.call({"type": "plan-placement", "requestId": "b1", "layout": {**LAYOUT, "trainer": {}}})
    assert err["code"] == "REEF_ERR_BAD_MESSAGE"
    assert "plan-placement.layout.trainer.gpus: missing" in err["message"]
    err = shim.call({"type": "plan-placement", "requestId": "b2", "layout": {**LAYOUT, "trainer": {"gpus": 0}}})
    assert (err["code"], err["requestId"]) == ("REEF_ERR_INVALID_ARGUMENT", "b2")
    assert shim.call({"type": "ping", "requestId": "still"})["type"] == "ok"


def test_slow_requests_go_through_the_worker(shim: Shim) -> None:
    # Without init-ray the driver refuses at once; the reply still travels back from the worker.
    err = shim.call({"type": "create-placement", "requestId": "c1", "layout": LAYOUT, "timeoutS": 5})
    assert (err["code"], err["retryable"]) == ("REEF_ERR_RAY", False)
    assert "init-ray" in err["message"]


def test_weights_are_pushed_only_into_an_engine_the_shim_started(shim: Shim) -> None:
    # Rank 0 would broadcast the whole model to whatever joins at that URL.
    err = shim.call({"type": "trainer-push-weights", "requestId": "p1", "engineUrl": "http://203.0.113.9:30000",
                     "weightVersion": "v1"})
    assert (err["code"], err["retryable"]) == ("REEF_ERR_INVALID_ARGUMENT", False)
    assert "not an engine this shim started" in err["message"]


def test_init_ray_at_an_address_where_nothing_listens_fails_at_once(shim: Shim) -> None:
    # ray.init kept retrying for many minutes while the worker, and every request behind it, waited.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = shim.call({"type": "init-ray", "requestId": "i1", "address": f"127.0.0.1:{port}", "numCpus": None,
                     "numGpus": None, "objectStoreBytes": None})
    assert (err["type"], err["code"], err["retryable"]) == ("error", "REEF_ERR_RAY", True)
    assert f"ray: init failed: no Ray head answers at 127.0.0.1:{port}" in err["message"]
    err = shim.call({"type": "create-placement", "requestId": "c2", "layout": LAYOUT, "timeoutS": 5})
    assert "init-ray" in err["message"]


def test_shutdown_replies_then_exits_zero(shim: Shim) -> None:
    assert shim.call({"type": "shutdown", "requestId": "s1"}) == {"type": "ok", "requestId": "s1"}
    assert shim.proc.wait(timeout=20) == 0


def test_sigterm_exits_zero(shim: Shim) -> None:
    shim.proc.send_signal(signal.SIGTERM)
    assert shim.proc.wait(timeout=20) == 0


def test_stdin_eof_means_the_parent_is_gone() -> None:
    s = Shim("--watch-stdin")
    try:
        assert s.proc.stdin is not None
        s.proc.stdin.close()
        assert s.proc.wait(timeout=20) == 0
    finally:
        s.close()


def test_exits_when_its_parent_dies() -> None:
    # An intermediate parent starts the shim, reports its pid, and exits without cleaning up.
    launcher = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-m', 'reef_shim.server'], "
                "stdout=subprocess.PIPE, stderr=subprocess.DEVNULL); sys.stdout.write(p.stdout.readline().decode()); "
                "sys.stdout.flush()")
    out = subprocess.run([sys.executable, "-c", launcher], capture_output=True, env=shim_env(), timeout=30, check=True)
    pid = json.loads(out.stdout)["pid"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"orphaned shim {pid} kept running after its parent exited")


@pytest.mark.parametrize("cleanup_s, clean", [(0.0, True), (2.0, False)])
def test_a_stop_whose_cleanup_does_not_finish_says_so(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                                      cleanup_s: float, clean: bool) -> None:
    # It logged "shim stopped" and exited 0 whatever the worker was still doing, so engines or Ray
    # processes left running looked like a clean stop.
    from reef_shim import server as server_module

    monkeypatch.setattr(server_module, "CLOSE_WAIT_S", 0.5)
    shim = server_module.ShimServer("tcp://127.0.0.1:*")
    monkeypatch.setattr(shim, "_cleanup", lambda: time.sleep(cleanup_s))
    shim.request_stop("test")
    with caplog.at_level("INFO", logger=server_module.log.name):
        assert shim.serve() is clean
    messages = [r.getMessage() for r in caplog.records]
    if clean:
        assert "shim stopped" in messages
    else:
        assert any(m.startswith("shim stopped before its cleanup finished") for m in messages), messages
