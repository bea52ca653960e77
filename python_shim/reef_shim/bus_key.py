"""The stack's bus key on the Python side (the TypeScript end is actors/runtime/bus-key.ts).

`reef up` writes one CURVE keypair to `<data_dir>/run/bus.key` (0600) and gives the shim its path
in REEF_BUS_KEY. The shim's ROUTER then encrypts, and its ZAP handler admits only a client that
proves it holds that key: with CURVE alone any client that knows the server's public key gets in.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

from .errors import ShimError

BUS_KEY_ENV = "REEF_BUS_KEY"
ZAP_DOMAIN = "reef"
# As the TypeScript side: a lease reply carries up to two 64 MiB bodies; unbounded, one frame
# could be gigabytes.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
_Z85_KEY = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")


def read_bus_key(path: str) -> tuple[bytes, bytes]:
    """(public, secret) as z85 bytes; a file another user could read, or not a key, is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise ShimError("REEF_ERR_CONFIG_INVALID", f"{BUS_KEY_ENV}: cannot read the bus key {path}: {e}") from e
    with os.fdopen(fd, "r", encoding="utf-8") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise ShimError("REEF_ERR_CONFIG_INVALID", f"the bus key {path} must be a file of this user's alone "
                            f"(mode 0600), is uid {st.st_uid} mode {stat.S_IMODE(st.st_mode):o}")
        try:
            key: Any = json.loads(f.read())
        except ValueError:
            key = None
    if not isinstance(key, dict) or not all(isinstance(key.get(k), str) and _Z85_KEY.match(key[k]) for k in ("publicKey", "secretKey")):
        raise ShimError("REEF_ERR_CONFIG_INVALID", f"{BUS_KEY_ENV}: {path} is not a bus key")
    return key["publicKey"].encode(), key["secretKey"].encode()


class _OnlyStackKey:
    def __init__(self, public: bytes) -> None:
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        return domain == ZAP_DOMAIN and key == self.public


def secure_router(ctx: zmq.Context, sock: zmq.Socket, env: dict[str, str] | None = None) -> ThreadAuthenticator | None:
    """Makes `sock` (not yet bound) a CURVE server of the stack's key; None outside a stack (plain)."""
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    path = (env if env is not None else os.environ).get(BUS_KEY_ENV, "")
    if not path:
        return None
    public, secret = read_bus_key(path)
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=_OnlyStackKey(public))
    sock.curve_server = True
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    sock.zap_domain = ZAP_DOMAIN.encode()
    # With no ZAP handler answering, libzmq would admit every CURVE client; enforced, it refuses.
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    return auth
