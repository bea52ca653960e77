"""Finding and ending leftover descendants (what the shim does after ray.shutdown)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from reef_shim.proc_tree import descendants, proc_stat, reap

# A child that starts a grandchild ignoring SIGTERM, prints its pid, and waits.
LAUNCHER = (
    "import subprocess, sys, time; "
    "g = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); "
    "print(g.pid, flush=True); time.sleep(60)"
)


def test_finds_grandchildren_and_kills_what_is_left() -> None:
    child = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        found = descendants(os.getpid())
        assert child.pid in found and grandchild in found
        killed = reap({p: t for p, t in found.items() if p in (child.pid, grandchild)}, grace_s=0.2)
        assert sorted(killed) == sorted([child.pid, grandchild])
        child.wait(timeout=5)
        deadline = time.monotonic() + 5
        while proc_stat(grandchild) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc_stat(grandchild) is None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_process_that_exits_in_the_grace_period_is_left_alone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    found = {child.pid: descendants(os.getpid())[child.pid]}
    reaper_result = None
    try:
        # Reap waits up to 5 s; the child exits on its own after 0.3 s (a zombie counts as gone).
        reaper_result = reap(found, grace_s=5)
    finally:
        child.wait()
    assert reaper_result == []
