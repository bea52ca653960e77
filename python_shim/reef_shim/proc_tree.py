"""Finding and ending the processes below ours, by pid, from /proc (Linux).

Ray's agents can outlive `ray.shutdown()` (they hang reporting the raylet's death to a GCS that is
already gone), so the shim notes its descendants before shutdown and ends the ones left after.
An engine's workers are found by process group instead (`group_alive`): once the engine's main
process has exited they are no longer below anything of ours.
"""

from __future__ import annotations

import logging
import os
import signal
import time

log = logging.getLogger("reef_shim.ray")


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the command name (state first); None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == b"Z" else fields


def proc_stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process from /proc; None if gone or a zombie."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[1]), fields[19].decode())


def group_alive(pgid: int) -> bool:
    """Whether a live process is left in process group `pgid`.

    Zombies do not count: a worker reparented to an init that does not reap (a container's PID 1
    often does not) stays a zombie in the group forever, holding nothing.
    """
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None and int(fields[2]) == pgid:
            return True
    return False


def descendants(root: int) -> dict[int, str]:
    """pid -> start time of every process below `root` (Linux; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit() and (stat := proc_stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append(int(entry))
            starts[int(entry)] = stat[1]
    found: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = starts[pid]
        todo.extend(children.get(pid, []))
    return found


def reap(procs: dict[int, str], grace_s: float = 2.0) -> list[int]:
    """Give `procs` (from `descendants`) `grace_s` to exit, then SIGKILL the rest; return those."""
    deadline = time.monotonic() + grace_s
    alive = dict(procs)
    while alive:
        # Same pid and same start time: still the process we saw, not a reused pid.
        alive = {p: t for p, t in alive.items() if (st := proc_stat(p)) is not None and st[1] == t}
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    for pid in alive:
        log.info("ending process %d, still running after shutdown", pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return list(alive)
