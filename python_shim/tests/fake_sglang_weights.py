"""SGLang's weight routes, as a process of its own, for `test_weight_push_protocol.py`.

    python fake_sglang_weights.py RELEASE        prints "port N", then serves until killed

RELEASE `0.5.23` answers as that release does: updates only inside a `begin_weight_update` …
`end_weight_update` session, with its messages and status codes
(`srt/managers/scheduler_components/weight_updater.py:187-198, 309-335`, `srt/entrypoints/http_server.py:1458-1505`).
`0.5.16` has no session routes (FastAPI's 404). The group is joined as rank 1 with
`weight_group.join_group`, as SGLang's workers join it. Test-only routes:
`POST /_test/set {refuse?: message | null, session?: bool, busy_s?: seconds}` (`refuse`: every update
answers 400 with that message at once, without taking part in the broadcasts; `busy_s`: a request runs
for that long from now, so the engine is not idle) and `GET /_test/state` (the routes called, in order;
whether a session is open; a sha256 of each received tensor; the weight version the server reports).

The cache flush follows 0.5.23 too. An update with `flush_cache: true` while a request runs loads the
weights, then answers 400 and leaves the reported version as it was
(`scheduler_components/weight_updater.py:120-133, :222-227`; `tokenizer_control_mixin.py:529-531`).
`/flush_cache?timeout=T` waits up to T s for idle, and answers in plain text (`http_server.py:1025-1040`,
`scheduler_components/flush_wrapper.py:22-61`).
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from reef_shim.weight_group import broadcast, dtype_of, join_group, leave_group

OUTSIDE = "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()"


class Engine:
    def __init__(self, release: str) -> None:
        self.sessions = release != "0.5.16"
        self.refuse: str | None = None
        self.session = False
        self.calls: list[str] = []
        self.received: dict[str, str] = {}
        self.groups: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.busy_until = 0.0
        self.weight_version = "default"

    def idle(self) -> bool:
        return time.monotonic() >= self.busy_until

    def flush(self, timeout_s: float) -> tuple[int, str]:
        if timeout_s <= 0:
            return (200, "Cache flushed.\n") if self.idle() else (400, "Flush cache failed.\n")
        deadline = time.monotonic() + timeout_s
        while not self.idle():
            if time.monotonic() >= deadline:
                return 400, "Timed out waiting for idle state."
            time.sleep(0.01)
        return 200, "Cache flushed.\n"

    def route(self, name: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if name == "_test/set":
            for key in ("refuse", "session"):
                if key in body:
                    setattr(self, key, body[key])
            if "busy_s" in body:
                self.busy_until = time.monotonic() + body["busy_s"]
            return 200, {}
        if name == "_test/state":
            return 200, {"calls": self.calls, "session": self.session, "received": self.received,
                         "weight_version": self.weight_version}
        self.calls.append(name)
        if name in ("begin_weight_update", "end_weight_update") and not self.sessions:
            return 404, {"detail": "Not Found"}
        if name == "begin_weight_update":
            with self.lock:
                if self.session:
                    return 400, {"success": False,
                                 "message": "a weight-update session is already open; call end_weight_update() first"}
                self.session = True
            return 200, {"success": True, "message": "Success"}
        if name == "end_weight_update":
            with self.lock:
                if not self.session:
                    return 400, {"success": False,
                                 "message": "no weight-update session is open; call begin_weight_update() first"}
                self.session = False
            return 200, {"success": True, "message": "Success"}
        if name == "init_weights_update_group":
            self.groups[body["group_name"]] = join_group(body["master_address"], body["master_port"], body["rank_offset"],
                                                         body["world_size"], body["group_name"], body["backend"], 30)
            return 200, {"success": True, "message": "Succeeded to initialize custom process group."}
        if name == "update_weights_from_distributed":
            if self.sessions and not self.session:
                return 400, {"success": False, "message": OUTSIDE}
            if self.refuse is not None:
                return 400, {"success": False, "message": self.refuse}
            group = self.groups[body["group_name"]]
            for n, d, shape in zip(body["names"], body["dtypes"], body["shapes"]):
                t = torch.empty(shape, dtype=dtype_of(d))
                broadcast(t, group).wait()
                self.received[n] = hashlib.sha256(t.numpy().tobytes()).hexdigest()
            if body.get("flush_cache", True) and not self.idle():
                return 400, {"success": False, "message": "Weights were updated, but the cache was not flushed because "
                             "requests are still running or queued. Retract or finish them, then call /flush_cache."}
            if body.get("weight_version") is not None:
                self.weight_version = body["weight_version"]
            return 200, {"success": True, "message": "Succeeded to update parameter online."}
        if name == "destroy_weights_update_group":
            group = self.groups.pop(body["group_name"], None)
            if group is None:
                return 400, {"success": False, "message": "no such group"}
            leave_group(group)
            return 200, {"success": True, "message": "Succeeded to destroy custom process group."}
        return 404, {"detail": "Not Found"}


def main() -> int:
    engine = Engine(sys.argv[1])

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, body: dict[str, Any]) -> None:
            route, _, query = self.path.strip("/").partition("?")
            if route == "flush_cache":
                engine.calls.append(route)
                timeout = float(dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("timeout", 0))
                if not engine.sessions:
                    timeout = 0.0  # 0.5.16's route has no timeout parameter: it flushes now or refuses
                status, text = engine.flush(timeout)
                self._send(status, text.encode(), "text/plain; charset=utf-8")
                return
            status, answer = engine.route(route, body)
            self._send(status, json.dumps(answer).encode(), "application/json")

        def _send(self, status: int, raw: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            self._answer({})

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            self._answer(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}"))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"port {server.server_port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
