"""SGLang's weight routes, as a process of its own, for `test_weight_push_protocol.py`.

    python fake_sglang_weights.py RELEASE        prints "port N", then serves until killed

RELEASE `0.5.23` answers as that release does: updates only inside a `begin_weight_update` …
`end_weight_update` session, with its messages and status codes
(`srt/managers/scheduler_components/weight_updater.py:187-198, 309-335`, `srt/entrypoints/http_server.py:1458-1505`).
`0.5.16` has no session routes (FastAPI's 404). The group is joined as rank 1 with
`weight_group.join_group`, as SGLang's workers join it. Test-only routes:
`POST /_test/set {refuse?: message | null, session?: bool}` (`refuse`: every update answers 400 with
that message at once, without taking part in the broadcasts) and `GET /_test/state` (the routes
called, in order; whether a session is open; a sha256 of each received tensor).
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
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

    def route(self, name: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if name == "_test/set":
            for key in ("refuse", "session"):
                if key in body:
                    setattr(self, key, body[key])
            return 200, {}
        if name == "_test/state":
            return 200, {"calls": self.calls, "session": self.session, "received": self.received}
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
            status, answer = engine.route(self.path.strip("/"), body)
            raw = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
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
