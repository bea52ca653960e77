"""The shim's ROUTER with the stack's bus key: only a client holding that key is answered."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import pytest
import zmq

from reef_shim.bus_key import read_bus_key
from reef_shim.errors import ShimError
from reef_shim.messages import pack, unpack
from test_server import Shim


def write_key(path: Path) -> tuple[bytes, bytes]:
    public, secret = zmq.curve_keypair()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"publicKey": public.decode(), "secretKey": secret.decode()}, f)
    return public, secret


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[tuple[Shim, bytes, bytes]]:
    public, secret = write_key(tmp_path / "bus.key")
    shim = Shim(env={"REEF_BUS_KEY": str(tmp_path / "bus.key")}, connect=False)
    yield shim, public, secret
    shim.close()


def dealer(ctx: zmq.Context, endpoint: str, public: bytes | None, secret: bytes | None, server: bytes | None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if public is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server
    sock.connect(endpoint)
    return sock


def handshake_refused(sock: zmq.Socket) -> bool:
    """Waits for the first handshake outcome on `sock` (bounded by the monitor's own timeout)."""
    mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                  | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_DISCONNECTED)
    mon.setsockopt(zmq.RCVTIMEO, 10_000)
    try:
        from zmq.utils.monitor import recv_monitor_message
        event = recv_monitor_message(mon)["event"]
    finally:
        sock.disable_monitor()
        mon.close()
    return event != zmq.EVENT_HANDSHAKE_SUCCEEDED


def test_only_a_client_with_the_key_is_answered(keyed: tuple[Shim, bytes, bytes]) -> None:
    shim, public, secret = keyed
    ctx = zmq.Context()
    try:
        endpoint = shim.ready["endpoint"]
        plain = dealer(ctx, endpoint, None, None, None)
        own_public, own_secret = zmq.curve_keypair()
        # Knows the server's public key: with CURVE alone that would have been enough.
        foreign = dealer(ctx, endpoint, own_public, own_secret, public)
        for sock in (plain, foreign):
            sock.send(pack({"type": "shutdown", "requestId": "attacker"}))
        assert handshake_refused(foreign)
        good = dealer(ctx, endpoint, public, secret, public)
        good.setsockopt(zmq.RCVTIMEO, 10_000)
        good.send(pack({"type": "ping", "requestId": "p1"}))
        reply = unpack(good.recv())
        assert reply["type"] == "ok" and reply["pid"] == shim.proc.pid
        # The shutdown the keyless peers queued never arrived: the shim still answers.
        good.send(pack({"type": "ping", "requestId": "p2"}))
        assert unpack(good.recv())["requestId"] == "p2"
        assert shim.proc.poll() is None
    finally:
        ctx.destroy(linger=0)


def test_a_key_file_open_to_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bus.key"
    write_key(path)
    os.chmod(path, 0o644)
    with pytest.raises(ShimError, match="mode 0600"):
        read_bus_key(str(path))
    os.chmod(path, 0o600)
    assert len(read_bus_key(str(path))[0]) == 40
