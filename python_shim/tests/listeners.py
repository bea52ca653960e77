"""The TCP sockets some processes listen on, read from /proc (Linux), and this host's LAN address.

For the tests that check where torch.distributed and Ray listen: `ss -ltnp` shows the same, but
only to the sockets' owner or root, and not in every container image.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from typing import Iterable


def _inodes(pid: int) -> set[str]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or not ours
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[len("socket:["):-1])
    return out


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    # /proc prints each 32-bit word in host order.
    words = b"".join(struct.pack("=I", struct.unpack(">I", raw[i:i + 4])[0]) for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening(pids: Iterable[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket in LISTEN that one of `pids` holds."""
    owner = {inode: pid for pid in pids for inode in _inodes(pid)}
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in owner:  # 0A: TCP_LISTEN
                continue
            addr, port = fields[1].split(":")
            found.append((owner[fields[9]], _address(addr), int(port, 16)))
    return found


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def not_loopback(found: list[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
    return [f for f in found if not loopback(f[1])]


def lan_address() -> str | None:
    """The address this host reaches other hosts from, or None (no route out). A UDP connect sends
    nothing; it only picks the route."""
    for target in ("192.0.2.1", "10.255.255.255", "203.0.113.1"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((target, 9))
            except OSError:
                continue
            address = s.getsockname()[0]
        if not loopback(address):
            return address
    return None


def refused_from_lan(port: int) -> bool | None:
    """Whether a connection to `port` at the LAN address is refused; None without one."""
    address = lan_address()
    if address is None:
        return None
    try:
        socket.create_connection((address, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False
