"""Where the trainer's torch.distributed groups listen: loopback on one node, the node's address across nodes.

A group brings three kinds of listener, none of which authenticates a peer (PyTorch documents
c10d for trusted networks only), and each is told where to listen in its own way:

- the rendezvous store (c10d's TCPStore) on rank 0. Given a host, torch still listens on every
  interface: its server binds `::`, and the host is only where the other ranks connect. So rank 0
  binds the socket itself, to that one address, and hands it to the store (`host_store`).
- gloo's pair listeners, on every rank: on the interface GLOO_SOCKET_IFNAME names, else on the
  address the host name resolves to, the LAN address on most hosts. Read at each group's creation.
- NCCL's bootstrap and proxy listeners, on every rank: on the interface NCCL_SOCKET_IFNAME
  selects, else on the first that is neither loopback nor docker. Read once, at the process's
  first NCCL call. Between GPUs of one node the data goes over P2P or shared memory, not these
  sockets, so loopback costs a single-node group nothing.

Loopback is right only where every member is on one host (`RayDriver.single_node`); across nodes
the groups keep the node's address, and the network between the nodes must be private
(docs/training.md, "Where the groups listen").
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from datetime import timedelta
from typing import Any

log = logging.getLogger("reef_shim.dist_net")

LOOPBACK_HOST = "127.0.0.1"
# Gloo takes exact interface names; NCCL takes prefixes unless `=` leads, and a bare `lo` would
# also select an interface named `lowpan0`.
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "=lo"}


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def confine_to_loopback(env: Any = os.environ) -> None:
    """Point gloo and NCCL at the loopback interface in `env` (this process's environment by
    default). Call before the process's first NCCL call, which reads it once."""
    for key, value in LOOPBACK_ENV.items():
        held = env.get(key)
        if held not in (None, value):
            # On one node no other interface can carry anything loopback does not, and the
            # operator's choice (made for a multi-node setup) would put the listeners on the LAN.
            log.info("%s=%s replaced by %s: every member of the group is on this node", key, held, value)
        env[key] = value


def bind_listener(host: str, port: int = 0) -> socket.socket:
    """A TCP socket bound to `host`:`port` (0: a free port), not yet listening. Holding it keeps the
    port: a port only picked free could be given to any process's next connection before the
    store bound it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    return sock


def host_store(listener: socket.socket, world_size: int, timeout: timedelta) -> Any:
    """The rendezvous store's server on `listener` (`bind_listener`), which it takes over: it
    listens on that socket's address alone. Blocks until `world_size` members (this one included)
    have connected, as torch's own `tcp://` rendezvous does on rank 0."""
    from torch.distributed import TCPStore

    host, port = listener.getsockname()[:2]
    # The store owns the descriptor from here and closes it; the socket object must not.
    fd = listener.detach()
    return TCPStore(host, port, world_size, True, timeout=timeout, master_listen_fd=fd)


__all__ = ["LOOPBACK_ENV", "LOOPBACK_HOST", "bind_listener", "confine_to_loopback", "host_store", "is_loopback"]
