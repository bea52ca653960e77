"""A throwaway directory where an agent's shell commands run, one separate process each, under limits.

Each `Sandbox` owns one directory for one episode. `run(command)` starts `sh -c command` in it
with a wall-time limit, an output cap, rlimits (address space, processes, file size, CPU) and, as
far as this host allows, no network and no write access outside the directory. Which isolation
held is named in every result (`RunResult.isolation`), never implied:

- ``bwrap``: bubblewrap with every namespace unshared (user, pid, net, ipc, uts, mount). The
  process sees read-only system directories, a private /tmp and /dev, and its own directory as
  the only writable place. It needs bubblewrap and unprivileged user namespaces.
- ``uid``: the command runs as an unused uid of its own (root only), in a network namespace of
  its own when `unshare(2)` allows it. It can still write where any user may (/tmp, /var/tmp,
  /dev/shm), and a network is cut only if ``net_isolated`` says so.
- ``rlimits``: neither is available (not root, no working bwrap): limits only; the command can
  write wherever the calling user can. Use it for trusted code only.

Every run gets a uid of its own when the shim runs as root (`_UidSlot`): the process limit then
bounds this run alone rather than every sandbox's processes together, and anything the command
leaves behind (a `sleep 1000 &`) is found by that uid and killed when the run ends.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import itertools
import logging
import math
import os
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Literal

log = logging.getLogger("reef_shim.envs.sandbox")

Isolation = Literal["bwrap", "uid", "rlimits"]
ISOLATIONS: tuple[str, ...] = ("bwrap", "uid", "rlimits")

# Unused by any account on a normal system (useradd stops at 60000; container remaps start at
# 100000 and take 65536). A range of its own keeps `kill every process of this uid` safe.
UID_BASE = 720_000
UID_SLOTS = 256
_CLONE_NEWNET = 0x40000000
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Limits:
    """What one command may use. Every limit is per run, not per episode."""

    wall_s: float = 10.0  # @default 10: then the whole process tree is killed
    output_bytes: int = 16 * 1024  # @default 16 KiB: of stdout and stderr together; the rest is cut
    memory_bytes: int = 512 * 1024 * 1024  # @default 512 MiB: RLIMIT_AS of each process
    processes: int = 64  # @default 64: RLIMIT_NPROC, for the run's own uid (bwrap, uid)
    file_bytes: int = 16 * 1024 * 1024  # @default 16 MiB: RLIMIT_FSIZE, the largest file it may write
    cpu_s: int = 30  # @default 30: RLIMIT_CPU, a backstop below the wall limit's kill

    def __post_init__(self) -> None:
        for name in ("wall_s", "output_bytes", "memory_bytes", "processes", "file_bytes", "cpu_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"sandbox limits.{name} must be a positive number, got {v!r}")


@dataclass(frozen=True)
class RunResult:
    """One command's outcome, as the agent sees it and as the logs should record it."""

    command: str
    exit_code: int | None  # None when it was killed (timeout, output flood)
    signal: int | None  # the signal that ended it, if one did
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool  # output went past `Limits.output_bytes` and was cut (the run is then killed)
    wall_s: float
    isolation: str
    net_isolated: bool

    def as_tool_output(self) -> str:
        """The text an agent gets back: exit status, then each stream, and what was cut or killed."""
        lines = []
        if self.timed_out:
            lines.append(f"[killed: still running after {self.wall_s:.1f} s, the time limit]")
        if self.truncated:
            lines.append("[output cut at the size limit; the command was stopped]")
        status = f"exit code {self.exit_code}" if self.exit_code is not None else f"killed by signal {self.signal}"
        lines.append(status)
        if self.stdout:
            lines.append("stdout:\n" + self.stdout)
        if self.stderr:
            lines.append("stderr:\n" + self.stderr)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _bwrap_path() -> str | None:
    return shutil.which("bwrap")


_BWRAP_WORKS: dict[str, bool] = {}


def bwrap_works() -> bool:
    """Whether bubblewrap runs here with every namespace unshared (tried once per process).

    Installed is not enough: inside many containers unprivileged user namespaces are off, and
    bwrap then fails at start."""
    path = _bwrap_path()
    if path is None:
        return False
    if path not in _BWRAP_WORKS:
        try:
            r = subprocess.run([path, *_bwrap_mounts(None), "--", "/bin/sh", "-c", "true"],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                               preexec_fn=_drop_to(_probe_uid()) if os.geteuid() == 0 else None)
            _BWRAP_WORKS[path] = r.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _BWRAP_WORKS[path] = False
    return _BWRAP_WORKS[path]


def _probe_uid() -> int:
    return UID_BASE + UID_SLOTS  # one past the slots: the probe never holds one


def default_isolation() -> Isolation:
    """The strongest isolation this host offers: bwrap, else a uid of its own (root), else rlimits."""
    if bwrap_works():
        return "bwrap"
    return "uid" if os.geteuid() == 0 else "rlimits"


def _bwrap_mounts(workdir: str | None) -> list[str]:
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--uid", "1000", "--gid", "1000",
            "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
            "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]
    # Merged-/usr hosts have /bin -> usr/bin; older ones have real directories.
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    if workdir is not None:
        # The same path inside as outside, so a prompt and a checker name one directory.
        args += ["--bind", workdir, workdir, "--chdir", workdir, "--setenv", "HOME", workdir]
    return args


def _drop_to(uid: int | None, limits: Limits | None = None, unshare_net: bool = False):
    """The child's set-up between fork and exec: rlimits, then (as root) a network namespace and the uid."""

    def pre() -> None:
        if limits is not None:
            for res, v in ((resource.RLIMIT_AS, limits.memory_bytes), (resource.RLIMIT_NPROC, limits.processes),
                           (resource.RLIMIT_FSIZE, limits.file_bytes), (resource.RLIMIT_CPU, limits.cpu_s),
                           (resource.RLIMIT_CORE, 0)):
                n = max(1, math.ceil(v))  # a CPU limit of 0 s would kill the command at once
                resource.setrlimit(res, (n, n))
        if unshare_net:
            # Before the uid drop: making a network namespace needs CAP_SYS_ADMIN. A failure
            # leaves the network on; the parent learns it through the result's `net_isolated`.
            ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

    return pre


_NET_UNSHARE: list[bool] = []


def _can_unshare_net() -> bool:
    """Whether this process may make a network namespace (tried once, in a throwaway child)."""
    if os.geteuid() != 0:
        return False
    if not _NET_UNSHARE:
        def pre() -> None:
            if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET) != 0:
                os._exit(1)  # the child's exit status is the answer

        try:
            ok = subprocess.run(["/bin/true"], preexec_fn=pre, timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        _NET_UNSHARE.append(ok)
    return _NET_UNSHARE[0]


def _process_count(uid: int) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


_SLOT_TURN = itertools.count()


class _UidSlot:
    """A uid from `UID_BASE…+UID_SLOTS` held by this process alone, by an flock on its lock file.

    The lock files live in one directory for every process on the host, so parallel workers
    (Ray actors are processes) never share a uid, and a crashed holder's lock goes with it."""

    def __init__(self, lock_dir: str) -> None:
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        # Spread the first tries so workers rarely contend, and move on with each sandbox: a fresh
        # uid does not start with the process count of a tree still being torn down.
        start = (os.getpid() * 7 + next(_SLOT_TURN)) % UID_SLOTS
        for i in range(UID_SLOTS):
            n = (start + i) % UID_SLOTS
            fd = os.open(os.path.join(lock_dir, f"uid-{n}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    continue
                raise
            self.fd: int | None = fd
            self.uid = UID_BASE + n
            return
        raise RuntimeError(f"sandbox: all {UID_SLOTS} uids under {lock_dir} are in use")

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def kill_uid(uid: int) -> int:
    """SIGKILLs every process whose real uid is `uid`; returns how many. Repeats until none is
    left, since a fork bomb forks between the scan and the kill."""
    killed = 0
    for _ in range(50):
        found = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status", "rb") as f:
                    status = f.read()
            except OSError:
                continue  # gone between the listing and the read
            fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
            try:
                ruid = int(fields[b"Uid"].split()[0])
            except (KeyError, ValueError, IndexError):
                continue
            # A zombie is dead already and stays listed until its parent reaps it.
            if ruid == uid and not fields.get(b"State", b"").strip().startswith(b"Z"):
                try:
                    os.kill(int(entry), signal.SIGKILL)
                    found += 1
                except ProcessLookupError:
                    pass
        killed += found
        if found == 0:
            return killed
        time.sleep(0.01)
    return killed


def _uid_processes(uid: int) -> tuple[int, int]:
    """(live, zombie) processes whose real uid is `uid`."""
    live = zombies = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                head = f.read(512)
        except OSError:
            continue
        fields = dict(line.split(b":", 1) for line in head.splitlines() if b":" in line)
        try:
            if int(fields[b"Uid"].split()[0]) != uid:
                continue
        except (KeyError, ValueError, IndexError):
            continue
        if fields.get(b"State", b"").strip().startswith(b"Z"):
            zombies += 1
        else:
            live += 1
    return live, zombies


def _wait_uid_gone(uid: int, processes: int, timeout_s: float = 5.0) -> None:
    """Waits until no process of `uid` is alive and few zombies are left.

    Orphans of a run go to the host's init, which may reap them only every few seconds; until
    then they count against the uid's process limit. One or two (a pid namespace's init) do not
    matter; a fork bomb's hundreds would make the next run fail to fork, so then it waits."""
    deadline = time.monotonic() + timeout_s
    while True:
        live, zombies = _uid_processes(uid)
        if live == 0 and zombies <= processes // 4:
            return
        if time.monotonic() > deadline:
            log.warning("sandbox: uid %d still has %d live and %d unreaped processes %.0f s after the kill",
                        uid, live, zombies, timeout_s)
            return
        if live:
            kill_uid(uid)
        time.sleep(0.02)


@dataclass
class _Output:
    limit: int
    parts: dict[str, bytearray] = field(default_factory=lambda: {"stdout": bytearray(), "stderr": bytearray()})
    total: int = 0
    truncated: bool = False

    def add(self, stream: str, data: bytes) -> None:
        room = self.limit - self.total
        if len(data) > room:
            data = data[:max(room, 0)]
            self.truncated = True
        self.parts[stream].extend(data)
        self.total += len(data)

    def text(self, stream: str) -> str:
        return self.parts[stream].decode("utf-8", "replace")


class Sandbox:
    """One episode's directory and the runs in it. `close()` kills leftovers and deletes the directory.

    `isolation` is ``"auto"`` (the strongest available, `default_isolation`) or one of
    `ISOLATIONS`; asking for one this host lacks is an error, not a silent downgrade."""

    def __init__(self, limits: Limits | None = None, isolation: str = "auto", parent_dir: str | None = None,
                 lock_dir: str | None = None) -> None:
        self.limits = limits or Limits()
        if isolation == "auto":
            isolation = default_isolation()
        if isolation not in ISOLATIONS:
            raise ValueError(f"sandbox isolation must be auto or one of {', '.join(ISOLATIONS)}, got {isolation!r}")
        if isolation == "bwrap" and not bwrap_works():
            raise RuntimeError("sandbox isolation bwrap: bubblewrap is missing or cannot create namespaces here")
        if isolation == "uid" and os.geteuid() != 0:
            raise RuntimeError("sandbox isolation uid needs root (to switch to an unused uid)")
        if isolation == "rlimits" and os.geteuid() == 0:
            # Root ignores RLIMIT_NPROC and may write anywhere: that would be no sandbox at all.
            raise RuntimeError("sandbox isolation rlimits would run commands as root; use uid")
        self.isolation: str = isolation
        self._slot = _UidSlot(lock_dir or os.path.join(tempfile.gettempdir(), "reef-sandbox-uids")) \
            if os.geteuid() == 0 else None
        self.uid = self._slot.uid if self._slot else None
        self.net_isolated = isolation == "bwrap" or (isolation == "uid" and _can_unshare_net())
        if self.uid is not None:
            _check_reachable(os.path.realpath(parent_dir or tempfile.gettempdir()))
        # The directory sits in a parent of its own that the run's uid may cross but not write:
        # `echo x > ../x` then fails under every isolation, not only where /tmp is private.
        self._parent = os.path.realpath(tempfile.mkdtemp(prefix="reef-sbx-", dir=parent_dir))
        os.chmod(self._parent, 0o711)
        self.path = os.path.join(self._parent, "work")
        os.mkdir(self.path, 0o755)
        if self.uid is not None:
            os.chown(self.path, self.uid, self.uid)
        self._closed = False

    # --- set-up and inspection, by the host (for tasks and checkers) ---------------------------

    def write_file(self, rel: str, content: str | bytes, mode: int = 0o644) -> str:
        """Writes a task's file into the directory, owned by the run's uid so commands may edit it."""
        path = self._inside(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(path, mode)
        if self.uid is not None:
            d = path
            while d != self.path:
                os.chown(d, self.uid, self.uid, follow_symlinks=False)
                d = os.path.dirname(d)
        return path

    def read_file(self, rel: str, max_bytes: int = 1 << 20) -> str | None:
        """A regular file's text, or None if it is absent, not a regular file, or a symlink.

        A checker must not follow a link the agent planted (`answer.txt -> /etc/shadow`): every
        component is opened without following links."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                parts = [p for p in rel.split("/") if p not in ("", ".")]
                if any(p == ".." for p in parts) or not parts:
                    return None
                for p in parts[:-1]:
                    nfd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    os.close(fd)
                    fd = nfd
                ffd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
            finally:
                os.close(fd)
            with os.fdopen(ffd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return None
                return f.read(max_bytes).decode("utf-8", "replace")
        except OSError:
            return None

    def listing(self) -> list[str]:
        """Every path under the directory, relative, sorted; links are listed, not followed."""
        out = []
        for root, dirs, files in os.walk(self.path):
            for n in dirs + files:
                out.append(os.path.relpath(os.path.join(root, n), self.path))
        return sorted(out)

    def _inside(self, rel: str) -> str:
        path = os.path.normpath(os.path.join(self.path, rel))
        if os.path.isabs(rel) or not path.startswith(self.path + os.sep):
            raise ValueError(f"sandbox: {rel!r} is not a path inside the sandbox directory")
        return path

    # --- running -------------------------------------------------------------------------------

    def run(self, command: str, limits: Limits | None = None) -> RunResult:
        if self._closed:
            raise RuntimeError("sandbox: run after close")
        if not isinstance(command, str) or not command.strip():
            raise ValueError("sandbox: command must be a non-empty string")
        lim = limits or self.limits
        if self.uid is None:
            # Not root: RLIMIT_NPROC counts every process of the calling user, so the run's
            # budget is on top of what that user already runs.
            lim = dataclasses.replace(lim, processes=lim.processes + _process_count(os.getuid()))
        env = {"PATH": _SAFE_PATH, "HOME": self.path, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
        if self.isolation == "bwrap":
            bwrap = _bwrap_path()
            assert bwrap is not None
            argv = [bwrap, *_bwrap_mounts(self.path), "--", "/bin/sh", "-c", command]
            pre = _drop_to(self.uid, lim)
        else:
            argv = ["/bin/sh", "-c", command]
            pre = _drop_to(self.uid, lim, unshare_net=self.net_isolated)
        started = time.monotonic()
        proc = subprocess.Popen(argv, cwd=self.path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, preexec_fn=pre, start_new_session=True)
        out = _Output(lim.output_bytes)
        timed_out = False
        sel = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        for pipe, stream in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ, stream)
        try:
            while sel.get_map():
                left = lim.wall_s - (time.monotonic() - started)
                if left <= 0:
                    timed_out = True
                    break
                # Short: a finished command whose child holds the pipes is noticed by `poll` below.
                for key, _ in sel.select(timeout=min(left, 0.05)):
                    try:
                        data = os.read(key.fd, 65536)
                    except BlockingIOError:
                        continue
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    out.add(key.data, data)
                if out.truncated:
                    break  # a flood (`yes`): stop it rather than drain it for the rest of the limit
                if proc.poll() is not None:
                    # The command is done; a child it left running (`sleep 1000 &`) may hold the
                    # pipes open. Take what is written already, and stop waiting for more.
                    _drain(sel, out)
                    break
            if not timed_out and not out.truncated:
                try:
                    proc.wait(timeout=max(lim.wall_s - (time.monotonic() - started), 0.01))
                except subprocess.TimeoutExpired:
                    timed_out = True  # it closed its output but kept running
        finally:
            sel.close()
            self._kill(proc, lim)
            proc.stdout.close()
            proc.stderr.close()
        rc = proc.returncode
        killed_by_us = timed_out or out.truncated
        return RunResult(
            command=command,
            exit_code=None if killed_by_us or rc is None or rc < 0 else rc,
            signal=-rc if rc is not None and rc < 0 else None,
            stdout=out.text("stdout"),
            stderr=out.text("stderr"),
            timed_out=timed_out,
            truncated=out.truncated,
            wall_s=time.monotonic() - started,
            isolation=self.isolation,
            net_isolated=self.net_isolated,
        )

    def _kill(self, proc: subprocess.Popen, lim: Limits) -> None:
        """Ends the run's whole tree: its process group, then (with a uid of its own) every
        process of that uid, which catches a child that left the group with `setsid`."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if self.uid is not None:
            kill_uid(self.uid)
            _wait_uid_gone(self.uid, lim.processes)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.uid is not None:
            kill_uid(self.uid)
        _rmtree(self._parent)
        if self._slot is not None:
            self._slot.release()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_reachable(directory: str) -> None:
    """The run's uid must cross every directory above its own; else each run fails at `cd`."""
    d = directory
    while True:
        if not os.stat(d).st_mode & stat.S_IXOTH:
            raise ValueError(f"sandbox: parent directory {directory} is unreachable for the sandbox's uid: "
                             f"{d} is not searchable by others (chmod o+x, or choose another parent_dir)")
        if d == "/":
            return
        d = os.path.dirname(d)


def _drain(sel: selectors.BaseSelector, out: _Output) -> None:
    for key in list(sel.get_map().values()):
        while not out.truncated:
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            out.add(key.data, data)


def _rmtree(path: str) -> None:
    """Deletes a directory the command may have made hard to delete (a mode-000 subdirectory)."""

    def fix(func, p, _exc):  # make the entry's parent writable and searchable, then try again
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=fix)
