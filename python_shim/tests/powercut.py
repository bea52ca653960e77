"""The power-loss emulation at fsync granularity, for Python writers: the same LD_PRELOAD library
as the TypeScript harness (test/helpers/powercut/powercut.c, built into the same cache) and the
same cut (SIGKILL, then the durable image in place of the watched directory). Not a real power
cut: docs/benchmarks.md "The power-loss emulation" says what it models and what it does not."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
SOURCE = _ROOT / "test" / "helpers" / "powercut" / "powercut.c"


def _compiler() -> tuple[str, str]:
    tried = [c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c]
    for cc in tried:
        try:
            return cc, subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
    raise RuntimeError(f"the power-loss emulation builds an LD_PRELOAD library from {SOURCE}, and no C compiler was "
                       f"found (tried {', '.join(tried)}): install gcc (Debian/Ubuntu: apt-get install gcc) or set CC to one")


def library() -> Path:
    """Built once per source and compiler into ${XDG_CACHE_HOME:-~/.cache}/reef/powercut/<key>/
    (the key is the TypeScript helper's too, so either side's build serves both)."""
    cc, version = _compiler()
    key = hashlib.sha256(SOURCE.read_bytes() + version.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    lib = cache / "reef" / "powercut" / key / "libpowercut.so"
    if not lib.exists():
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_name(f"{lib.name}.{os.getpid()}.tmp")
        out = subprocess.run([cc, "-O2", "-Wall", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE), "-ldl"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"building {SOURCE} with {cc} failed:\n{out.stderr}")
        os.replace(tmp, lib)
    return lib


def env(watched: Path, shadow: Path) -> dict[str, str]:
    """The environment for a writer whose files under `watched` are imaged into `shadow`."""
    shadow.mkdir(parents=True, exist_ok=True)
    prior = os.environ.get("LD_PRELOAD")
    return {**os.environ, "LD_PRELOAD": f"{library()}:{prior}" if prior else str(library()),
            "REEF_POWERCUT_DIR": str(watched), "REEF_POWERCUT_SHADOW": str(shadow)}


def watched_pids(shadow: Path) -> list[int]:
    f = shadow / "loaded"
    return [int(x) for x in f.read_text().split()] if f.exists() else []


def cut(proc: subprocess.Popen, watched: Path, shadow: Path) -> list[str]:
    """SIGKILL the writer's process group (start it with start_new_session=True), wait until it is
    gone, and put the durable image in place of `watched`. Returns the paths kept."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while True:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"process group {proc.pid} still alive 10 s after SIGKILL")
        time.sleep(0.005)
    for p in watched.iterdir():
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    tree = shadow / "tree"
    kept = []
    if tree.exists():
        shutil.copytree(tree, watched, dirs_exist_ok=True, ignore=lambda d, names: [n for n in names if n.endswith("-shm")])
        kept = sorted(str(p.relative_to(watched)) for p in watched.rglob("*") if p.is_file())
    return kept
