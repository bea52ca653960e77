"""The shim process: a ZeroMQ ROUTER answering bridge requests (docs/internals.md "Bridge protocol").

    python -m reef_shim.server --endpoint tcp://127.0.0.1:PORT [--log-level info] [--watch-stdin]

`ping`, `plan-placement` and `status` are answered on the socket thread; the slow requests
(Ray start, placement, engines) run one at a time on a worker thread, so a caller can always
tell a busy shim from a dead one. The worker hands replies back through a queue and a pipe the
socket thread polls, because a ZeroMQ socket must only be used from one thread.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from typing import Any, Callable

import zmq

from . import __version__
from .bus_key import secure_router
from .errors import ShimError
from .messages import ok_reply, pack, request_id_of, unpack, validate_request
from .placement import plan_placement
from .policy import ShimPolicy
from .ray_driver import RayDriver
from .trainer import TrainerGroup

log = logging.getLogger("reef_shim.server")

INLINE = frozenset({"ping", "plan-placement", "status"})
_STOP = object()
# How long a stopping shim waits for its worker to finish the request in hand and clean up:
# engines (30 s each, stopped together), the trainer group, then Ray itself.
CLOSE_WAIT_S = 120.0


class ShimServer:
    def __init__(self, endpoint: str) -> None:
        self.policy = ShimPolicy.from_env()
        self.driver = RayDriver()
        self.trainer = TrainerGroup(self.driver)
        self.stopping = threading.Event()
        self._ctx = zmq.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 2000)  # time for the last replies (shutdown's) to leave
        self._router.setsockopt(zmq.SNDHWM, 1000)
        self._router.setsockopt(zmq.RCVHWM, 1000)
        self._auth = None
        try:
            self._auth = secure_router(self._ctx, self._router)
            self._router.bind(endpoint)
        except BaseException:
            self._router.close(linger=0)
            if self._auth is not None:
                self._auth.stop()
            self._ctx.term()
            raise
        self.endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._work: queue.Queue[Any] = queue.Queue()
        self._replies: queue.Queue[tuple[bytes, bytes]] = queue.Queue()
        self._wake_r, self._wake_w = os.pipe()
        self._parent = os.getppid()
        self._signals_after_ray = False
        self._worker = threading.Thread(target=self._work_loop, name="shim-worker", daemon=True)
        self._handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "ping": lambda m: {"pid": os.getpid(), "version": __version__, "rayConnected": self.driver.connected},
            "init-ray": lambda m: self._allowed("ray", m["address"]) or self.driver.init_ray(m["address"], m["numCpus"], m["numGpus"], m["objectStoreBytes"]),
            "plan-placement": lambda m: {"plan": plan_placement(m["layout"])},
            "create-placement": lambda m: {"groups": self.driver.create_placement(m["layout"], m["timeoutS"])},
            "remove-placement": lambda m: {"removed": self.driver.remove_placement(m["names"])},
            "start-engine": lambda m: self._allowed("engine", m["spec"]) or {"engine": self.driver.start_engine(m["spec"])},
            "stop-engine": lambda m: {"stopped": self.driver.stop_engine(m["name"])},
            "status": lambda m: self.driver.status(),
            "shutdown": lambda m: {},
            "trainer-start": lambda m: self._allowed("trainer", m["spec"]) or self.trainer.start(m["spec"]),
            "trainer-step": lambda m: self.trainer.step(m["batchId"], m["tasks"], m.get("scenario")),
            "trainer-load": lambda m: self._allowed("checkpoint", m["checkpointPath"]) or self.trainer.load(m["checkpointPath"]),
            "trainer-push-weights": self._push_weights,
            "trainer-stop": lambda m: self.trainer.stop(),
        }

    def _allowed(self, what: str, value: Any) -> None:
        """Raises unless the stack's policy allows `value` (returns None, so handlers chain with `or`)."""
        if self.policy is not None:
            getattr(self.policy, f"check_{what}")(value)

    def _push_weights(self, m: dict[str, Any]) -> dict[str, Any]:
        # Rank 0 hosts a rendezvous and broadcasts every weight to whoever joins at the URL's
        # engine: only an engine of this stack may be that (a forged request would exfiltrate the model).
        if not self.driver.started_engine(m["engineUrl"]):
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"trainer-push-weights: {m['engineUrl']} is not an engine "
                            "this shim started; weights are pushed only into those")
        return self.trainer.push_weights(m["engineUrl"], m["weightVersion"], self.driver.engine_versions(m["engineUrl"]))

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def request_stop(self, why: str) -> None:
        if not self.stopping.is_set():
            log.info("stopping: %s", why)
        self.stopping.set()
        self.driver.closing.set()  # long waits on the worker give up instead of holding the exit
        self.wake()

    # --- requests -----------------------------------------------------------------------------

    def _execute(self, msg: dict[str, Any]) -> dict[str, Any]:
        kind, rid = msg["type"], msg["requestId"]
        started = time.monotonic()
        try:
            fields = self._handlers[kind](msg)
        except ShimError as e:
            log.warning("%s %s failed: %s: %s", kind, rid, e.code, e.message)
            return e.to_reply(rid)
        except Exception as e:  # a bug, or a library error we did not map: report it, stay up
            log.exception("%s %s crashed", kind, rid)
            return ShimError("REEF_ERR_HANDLER", f"handler for {kind} failed: {type(e).__name__}: {e}").to_reply(rid)
        if kind not in INLINE:
            log.info("%s %s done in %.1f s", kind, rid, time.monotonic() - started)
        try:
            return ok_reply(kind, rid, **fields)
        except ShimError as e:
            log.error("%s produced an invalid reply: %s", kind, e.message)
            return ShimError("REEF_ERR_SHIM", f"python shim failed: invalid {kind} reply: {e.message}").to_reply(rid)

    def _on_frames(self, frames: list[bytes]) -> None:
        identity = frames[0]
        if len(frames) != 2:
            err = ShimError("REEF_ERR_BAD_MESSAGE", f"malformed message: expected 1 payload frame, got {len(frames) - 1}")
            self._send(identity, err.to_reply(None))
            return
        try:
            raw = unpack(frames[1])
        except Exception as e:  # msgpack raises several types for garbage input
            self._send(identity, ShimError("REEF_ERR_BAD_MESSAGE", f"malformed message: not msgpack ({e})").to_reply(None))
            return
        try:
            msg = validate_request(raw)
        except ShimError as e:
            self._send(identity, e.to_reply(request_id_of(raw)))
            return
        if self.stopping.is_set():
            self._send(identity, ShimError("REEF_ERR_SHIM", "python shim failed: shutting down").to_reply(msg["requestId"]))
        elif msg["type"] == "shutdown":
            self._send(identity, self._execute(msg))
            self.request_stop("shutdown requested")
        elif msg["type"] in INLINE:
            self._send(identity, self._execute(msg))
        else:
            self._work.put((identity, msg))

    def _send(self, identity: bytes, reply: dict[str, Any]) -> None:
        self._router.send_multipart([identity, pack(reply)])

    def _work_loop(self) -> None:
        while True:
            item = self._work.get()
            if item is _STOP:
                # Cleanup runs here, not on the socket thread: Ray starts its head processes with
                # PR_SET_PDEATHSIG, which fires when the *thread* that ran ray.init exits, so this
                # thread must outlive ray.shutdown() or the raylet dies first and orphans its agents.
                self._cleanup()
                return
            identity, msg = item
            if self.stopping.is_set():
                reply = ShimError("REEF_ERR_SHIM", "python shim failed: shutting down").to_reply(msg["requestId"])
            else:
                reply = self._execute(msg)
            self._replies.put((identity, pack(reply)))
            self.wake()

    def _flush_replies(self) -> None:
        while True:
            try:
                identity, payload = self._replies.get_nowait()
            except queue.Empty:
                return
            self._router.send_multipart([identity, payload])

    # --- lifecycle ----------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop("SIGTERM"))
        signal.signal(signal.SIGINT, lambda *_: self.request_stop("SIGINT"))

    def serve(self) -> bool:
        """Serves until asked to stop; False when the cleanup at the end did not finish."""
        self._worker.start()
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self.stopping.is_set():
            events = dict(poller.poll(500))
            if self._wake_r in events:
                os.read(self._wake_r, 4096)
            self._flush_replies()
            while self._router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._on_frames(self._router.recv_multipart())
            if os.getppid() != self._parent:
                self.request_stop(f"parent process {self._parent} is gone")
            if self.driver.connected and not self._signals_after_ray:
                # Ray's core installs a crash handler for SIGTERM that dumps a stack and aborts;
                # take SIGTERM back (only the main thread may) so it still means a clean stop.
                self.install_signal_handlers()
                self._signals_after_ray = True
        return self._close()

    def _cleanup(self) -> None:
        try:
            if self.driver.connected:
                self.trainer.stop()
        except Exception:
            log.exception("stopping the trainer failed")
        try:
            self.driver.close()
        except Exception:
            log.exception("cleanup failed")

    def _close(self) -> bool:
        """Stops the worker (which cleans up after the request in hand); False if it did not finish."""
        self._work.put(_STOP)
        self._worker.join(timeout=CLOSE_WAIT_S)
        clean = not self._worker.is_alive()
        self._flush_replies()
        self._router.close()
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()
        if clean:
            log.info("shim stopped")
        else:
            # Said, and the exit status says it too: a clean-looking exit here left engines, trainer
            # ranks or Ray processes running with nothing to stop them.
            log.error("shim stopped before its cleanup finished (waited %.0f s): engines, trainer ranks or Ray "
                      "processes it started may still be running; check with `ray status` or `ps`", CLOSE_WAIT_S)
        return clean


def _watch_stdin(server: ShimServer) -> None:
    # The parent holds our stdin open; EOF means it is gone, even if we were reparented to a
    # subreaper whose pid we cannot tell apart from a live parent.
    # os.read, not sys.stdin: a daemon thread blocked inside a buffered reader holds its lock and
    # aborts the interpreter at exit.
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    server.request_stop("stdin closed (parent gone)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reef_shim.server", description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default="tcp://127.0.0.1:*", help="ROUTER bind address (port * = any free)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--watch-stdin", action="store_true", help="exit when stdin reaches EOF (the parent died)")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server = ShimServer(args.endpoint)
    except zmq.ZMQError as e:
        log.error("cannot bind %s: %s", args.endpoint, e)
        return 1
    except ShimError as e:
        log.error("cannot start: %s: %s", e.code, e.message)
        return 1
    server.install_signal_handlers()
    sys.stdout.write(json.dumps({"event": "ready", "endpoint": server.endpoint, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    # From here on stdout is stderr: Ray's child processes inherit fd 1, and nothing else may
    # ever appear on the channel the parent reads the ready line from.
    os.dup2(2, 1)
    if args.watch_stdin:
        threading.Thread(target=_watch_stdin, args=(server,), name="stdin-watch", daemon=True).start()
    log.info("reef shim %s listening on %s (pid %d)", __version__, server.endpoint, os.getpid())
    return 0 if server.serve() else 1


if __name__ == "__main__":
    sys.exit(main())
