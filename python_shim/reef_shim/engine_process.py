"""An engine server as a child process: its command line, start, health probe, stop.

No Ray here: `ray_driver.EngineActor` owns one `EngineProcess` inside its bundle, and the tests
drive the same class directly against `tests/fake_engine_server.py`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Mapping

from . import log_rotate
from .errors import ShimError
from .proc_tree import group_alive

log = logging.getLogger("reef_shim.engine")

DEFAULT_MODULES = {"hf": "reef_shim.engines.hf_server", "sglang": "sglang.launch_server"}
DEFAULT_ENGINE_START_TIMEOUT_S = 290.0
# A first SGLang start does far more than load the weights (65 GB for the reference Qwen3-32B):
# it captures CUDA graphs for every batch size and JIT-compiles flashinfer/deep_gemm kernels on a
# fresh machine, which together can run past 10 min. 900 s is what the SGLang conformance test
# allows (test/engine/sglang.conformance.gpu.test.ts); an engine that dies fails at once anyway.
SGLANG_ENGINE_START_TIMEOUT_S = 900.0
# SGLang's /health by default runs a one-token generation and looks for its answer after a 1 s
# sleep, so it never answers within 1 s; a busy engine takes a few seconds more. Reef launches it
# with that generation off (engine_env), but an environment that turns it back on still works.
HEALTH_TIMEOUT_S = 5.0
# The values SGLang 0.5.23 reads as true: EnvBool (srt/environ.py:143-151) and get_bool_env_var
# (srt/utils/common.py:1424-1441) both lower-case the value, unstripped.
_SGLANG_TRUE = ("true", "1", "yes", "y")


def engine_module(kind: str) -> str:
    """The module run for an engine kind.

    `REEF_ENGINE_MODULE_HF` / `REEF_ENGINE_MODULE_SGLANG` replace it: tests point them at
    `tests/fake_engine_server.py` so the production launch path runs unchanged around a stand-in.
    """
    if kind not in DEFAULT_MODULES:
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"unknown engine kind {kind!r}")
    return os.environ.get(f"REEF_ENGINE_MODULE_{kind.upper()}") or DEFAULT_MODULES[kind]


def engine_start_timeout_s(env: Mapping[str, str] = os.environ, kind: str = "hf") -> float:
    """The budget for starting one engine, launch and health together: REEF_ENGINE_START_TIMEOUT_S.

    Read as `engineStartTimeoutS` (bridge/client.ts) reads it, because the client's start-engine
    timeout is this plus a margin: blank means the kind's default (SGLANG_ENGINE_START_TIMEOUT_S
    for sglang); anything but a finite positive number is refused by both, at the call, rather
    than crashing the shim at import or waiting forever.
    """
    raw = env.get("REEF_ENGINE_START_TIMEOUT_S")
    if raw is None or raw.strip() == "":
        return SGLANG_ENGINE_START_TIMEOUT_S if kind == "sglang" else DEFAULT_ENGINE_START_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0 or "_" in raw:
        raise ShimError("REEF_ERR_CONFIG_INVALID", "invalid config: REEF_ENGINE_START_TIMEOUT_S must be a positive "
                        f"number of seconds, got {json.dumps(raw)}")
    return seconds


def engine_command(module: str, model_path: str, host: str, port: int, extra_args: list[str]) -> list[str]:
    return [sys.executable, "-m", module, "--model-path", model_path, "--host", host, "--port", str(port), *extra_args]


# Where Reef's SGLang plugin is found (`engines/sglang_plugin.py`): its dist-info directory, and
# the directory `reef_shim` is imported from.
_SHIM_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SGLANG_PLUGIN_PATH = os.path.join(_SHIM_ROOT, "sglang_plugins")
SGLANG_PLUGIN_NAME = "reef_weight_group_timeout"
# How long SGLang's end of a weight-update group waits on it: a push's own bound (the trainer's
# PUSH_TIMEOUT_S) and the minute the shim waits past it, instead of torch's 30 minutes.
SGLANG_WEIGHT_GROUP_TIMEOUT_S = 360.0


def engine_env(kind: str, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment an engine of `kind` is launched with: `base`, and for SGLang these settings.

    - SGLANG_RETURN_ORIGINAL_LOGPROB set true is refused: SGLang then reports the log-softmax of
      the raw logits (srt/layers/sampler.py:82,192,322; srt/layers/logprob_processor.py:417), not
      the tempered convention the trainer scores ℓold in, and every record would train wrong.
    - SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0 unless `base` sets it: `/health` then answers 200
      as soon as the server is up (srt/entrypoints/http_server.py:735-748), instead of generating
      a token, which takes a second at least, waits out a paused engine and answers 503 after 20 s
      (:218, :775-799). It still answers 503 until SGLang's own warm-up generation passed (:735-736,
      :2491-2502), so a start is seen healthy only once the engine can generate (unless it runs
      with --skip-server-warmup, :2589-2593).
    - Reef's SGLang plugin on the path (`engines/sglang_plugin.py`), with its bound
      REEF_SGLANG_WEIGHT_GROUP_TIMEOUT_S (SGLANG_WEIGHT_GROUP_TIMEOUT_S unless `base` sets it), and
      named in SGLANG_PLUGINS where `base` limits the plugins SGLang loads to a list.
    """
    env = dict(base)
    if kind != "sglang":
        return env
    if env.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in _SGLANG_TRUE:
        raise ShimError("REEF_ERR_CONFIG_INVALID", "invalid config: SGLANG_RETURN_ORIGINAL_LOGPROB="
                        f"{json.dumps(env['SGLANG_RETURN_ORIGINAL_LOGPROB'])} in the engine's environment makes "
                        "SGLang report raw logprobs (the log-softmax of the logits before temperature), not the "
                        "tempered ones the trainer scores the records in: unset it before starting Reef")
    env.setdefault("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "0")
    from .engines.sglang_plugin import ENV as PLUGIN_TIMEOUT_ENV

    env.setdefault(PLUGIN_TIMEOUT_ENV, f"{SGLANG_WEIGHT_GROUP_TIMEOUT_S:g}")
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([SGLANG_PLUGIN_PATH, _SHIM_ROOT] + [p for p in paths if p not in (SGLANG_PLUGIN_PATH, _SHIM_ROOT)])
    allowed = [p.strip() for p in env.get("SGLANG_PLUGINS", "").split(",") if p.strip()]
    if allowed and SGLANG_PLUGIN_NAME not in allowed:
        env["SGLANG_PLUGINS"] = ",".join(allowed + [SGLANG_PLUGIN_NAME])
    return env


# SGLang's own rendezvous (srt/distributed/bootstrap.py `_resolve_dist_init_method`) is a
# `tcp://host:nccl_port` init method: rank 0 then hosts a c10d TCPStore, whose server binds `::`
# whatever host it is given (see `dist_net`), for the engine's whole life, with no authentication,
# even at one GPU. The override SGLang reads instead (srt/environ.py) takes any init method torch
# accepts; a `file://` one is a FileStore, which listens on nothing.
SGLANG_INIT_OVERRIDE = "SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE"


def sglang_rendezvous_file(env: Mapping[str, str], extra_args: list[str], store_dir: str, tag: str) -> str | None:
    """The FileStore path for one SGLang start on one node, or None where the operator chose the
    rendezvous (the override already set, or `--dist-init-addr`) or it spans nodes (`--nnodes` > 1,
    where a file would have to be on a shared disk). `store_dir` must be this user's alone (the
    engine log directory is); `tag` must be unique per start: torch's FileStore must not find an
    earlier run's file (torch.distributed docs, "Shared file-system initialization")."""
    if env.get(SGLANG_INIT_OVERRIDE):
        return None
    for i, arg in enumerate(extra_args):
        if arg == "--dist-init-addr" or arg.startswith("--dist-init-addr="):
            return None
        value = arg.split("=", 1)[1] if arg.startswith("--nnodes=") else (
            extra_args[i + 1] if arg == "--nnodes" and i + 1 < len(extra_args) else None)
        if value is not None and value.strip() != "1":
            return None
    return os.path.join(store_dir, f"{tag}.tpstore")


def pick_free_port(host: str) -> int:
    # The port is released before the engine binds it; the window is tiny and a clash shows up
    # as a dead child with "address in use" in its log, not as a silent hang.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("", "0.0.0.0") else "0.0.0.0", 0))
        return int(s.getsockname()[1])


def _load_prctl() -> Callable[[int, int], int] | None:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Loaded up front: the child must not import anything between fork and exec.
_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # If the actor process holding this engine is killed outright, take the engine down with it.
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def open_engine_log(path: str) -> int:
    """Opens an engine's log for appending, in a directory that is this user's alone.

    The default directory was a fixed name under /tmp: another local user could create it first,
    or put a symlink where a log goes, and the engine's output (requests among it) went to them or
    was appended to one of our files. A directory of another owner, or a symlink, is refused; one
    of ours that others may enter is closed; the log itself is never followed through a symlink.
    """
    d = os.path.dirname(path) or "."
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ShimError("REEF_ERR_ENGINE_START", f"engine log directory {d} is a symlink or not a directory: "
                        "refusing to write engine output through it", retryable=False)
    if st.st_uid != os.getuid():
        raise ShimError("REEF_ERR_ENGINE_START", f"engine log directory {d} belongs to uid {st.st_uid}, not to this "
                        f"user (uid {os.getuid()}): set REEF_ENGINE_LOG_DIR to a directory of your own", retryable=False)
    if st.st_mode & 0o077:
        os.chmod(d, 0o700)
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise ShimError("REEF_ERR_ENGINE_START", f"cannot open the engine log {path}: {e}", retryable=False) from e


class EngineProcess:
    """One engine server subprocess in its own process group, logging to `log_path`, rotated by size
    (`log_rotate`: `log_max_bytes` per file, `log_backups` earlier files kept)."""

    def __init__(self, name: str, argv: list[str], probe_host: str, port: int, log_path: str,
                 env: dict[str, str] | None = None, log_max_bytes: int = log_rotate.MAX_BYTES,
                 log_backups: int = log_rotate.BACKUPS, scratch: tuple[str, ...] = ()) -> None:
        self.name = name
        self.argv = argv
        self.base = f"http://{probe_host}:{port}"
        self.log_path = log_path
        self.env = env
        # Files the engine makes that mean nothing once its process group is gone (its rendezvous
        # store): removed at stop.
        self.scratch = scratch
        self.log_max_bytes, self.log_backups = log_max_bytes, log_backups
        self.proc: subprocess.Popen[bytes] | None = None
        self._pump: Any = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> int:
        out = log_rotate.RotatingLog(self.log_path, open_engine_log, self.log_max_bytes, self.log_backups)
        # Through a pipe, so that the log can move to a new file: an engine writing to the file
        # itself kept writing to the one it was given, however large it grew.
        read_end, write_end = os.pipe()
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=write_end, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        except BaseException:
            os.close(read_end)
            out.close()
            raise
        finally:
            os.close(write_end)
        self._pump = log_rotate.pump(read_end, out)
        return self.proc.pid

    def tail(self, max_chars: int = 2000) -> str:
        return log_rotate.tail(self.log_path, self.log_backups, max_chars)

    def _get(self, path: str, timeout: float = 1.0) -> tuple[int, bytes] | None:
        try:
            with urllib.request.urlopen(self.base + path, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, b""
        except (OSError, ValueError):
            return None

    def healthy(self) -> bool:
        got = self._get("/health", timeout=HEALTH_TIMEOUT_S)
        return got is not None and got[0] == 200

    def weight_version(self) -> str | None:
        """The version of the weights the engine serves now (None if it does not say)."""
        # /model_info first: SGLang 0.5.23 still serves /get_model_info, but logs a deprecation
        # warning on every call (srt/entrypoints/http_server.py:802-809), and status probes often;
        # older releases serve /get_model_info only. The hf engine answers both.
        got = self._get("/model_info", timeout=2.0)
        if got is not None and got[0] == 404:
            got = self._get("/get_model_info", timeout=2.0)
        if got is None or got[0] != 200:
            return None
        try:
            version = json.loads(got[1]).get("weight_version")
        except (ValueError, AttributeError):
            return None
        return None if version is None else str(version)

    def probe(self) -> dict[str, Any]:
        """`{alive, returncode, healthy, tail}`: one poll of the child and its /health."""
        code = self.proc.poll() if self.proc else None
        alive = self.proc is not None and code is None
        if not alive and self._pump is not None:
            # Its last words (a traceback) may still be in the pipe; a worker it forked may hold
            # the pipe open, so not for long.
            self._pump.join(timeout=2.0)
        return {
            "alive": alive,
            "returncode": code,
            "healthy": alive and self.healthy(),
            "tail": "" if alive else self.tail(),
        }

    def stop(self, grace_s: float = 10.0) -> bool:
        """Stop the whole process group: SIGTERM, SIGKILL after `grace_s`; True if the main process was running.

        The group is signalled even when the main process has already exited: engines fork
        workers (SGLang's scheduler and detokenizer hold the GPU and ports), PDEATHSIG reaches only
        the main process, and a worker left behind is reparented to init, where nothing ends it.
        """
        if self.proc is None:
            return False
        was_running = self.proc.poll() is None
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            if self._wait_group_gone(wait_s):
                break
            log.warning("engine %s (process group %d) ignored %s", self.name, self.proc.pid, sig.name)
        for path in self.scratch:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("engine %s: could not remove %s: %s", self.name, path, e)
        return was_running

    def _wait_group_gone(self, timeout_s: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            self.proc.poll()  # reaps the main process once it exits, so it does not linger as our zombie
            if not group_alive(self.proc.pid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def wait_healthy(name: str, probe: Callable[[], dict[str, Any]], timeout_s: float,
                 cancelled: Callable[[], bool] = lambda: False, interval_s: float = 1.0,
                 since: float | None = None, output: Callable[[], str] | None = None) -> None:
    """Poll `probe` until the engine answers /health, `timeout_s` after `since` (monotonic; default
    now) at the latest; fail fast, with its log tail, if it dies. A timeout carries `output()`, the
    tail of the engine's log, too: an engine stuck loading says in it where it is stuck."""
    start = time.monotonic() if since is None else since
    next_log = 0.0
    while True:
        state = probe()
        if state["healthy"]:
            log.info("engine %s healthy after %.1f s", name, time.monotonic() - start)
            return
        if not state["alive"]:
            raise ShimError(
                "REEF_ERR_ENGINE_START",
                f"engine {name} failed to start: process exited with code {state['returncode']}; "
                f"last output:\n{state['tail']}",
            )
        elapsed = time.monotonic() - start
        if elapsed > timeout_s:
            raise ShimError("REEF_ERR_ENGINE_START",
                            f"engine {name} failed to start: /health not ready after {timeout_s:.0f} s; "
                            f"{_last_output(output)}")
        if cancelled():
            raise ShimError("REEF_ERR_SHIM", f"python shim failed: shutting down while engine {name} was starting")
        if elapsed >= next_log:
            log.info("engine %s: waiting for /health (%.0f s)", name, elapsed)
            next_log += 5.0
        time.sleep(interval_s)


def _last_output(output: Callable[[], str] | None) -> str:
    if output is None:
        return "no output read"
    try:
        tail = output()
    except Exception as e:  # the actor holding the engine may be gone by now
        return f"its output could not be read ({type(e).__name__}: {e})"
    return f"last output:\n{tail}" if tail else "no output yet"
