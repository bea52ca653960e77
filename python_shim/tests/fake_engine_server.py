"""A stand-in engine server for the shim's own tests: stdlib HTTP, no model.

It takes the engine command line (`--model-path --host --port`) and answers `GET /health`,
`GET /model_info` and `/get_model_info`, and `POST /update_weights_from_disk` (always succeeds,
takes the body's `weight_version`) like the real engines. Test knobs, all extra args:
`--startup-delay S` (not healthy for S seconds), `--exit-code N` (die at once with N after
printing to stderr), `--weight-version V`, `--health-delay S` (each /health answers after S
seconds: SGLang's runs a one-token generation and answers no sooner than 1 s), `--api sglang`
(an SGLang older than `/model_info`: only `/get_model_info`, and a weight update answers without
`weight_version`), `--stop-delay S` (takes S seconds to exit after SIGTERM, as a GPU engine
freeing its memory does), `--stop-log FILE` (appends `term <port>` when SIGTERM arrives and
`exit <port>` as it exits: the order of the lines shows whether stops overlapped), `--request-log
FILE` (appends `GET <path>` for each GET: which routes a client asked, in order).
`POST /fake/health {"code": N}` makes /health answer N from then on.
Selected with `REEF_ENGINE_MODULE_HF=fake_engine_server` and `python_shim/tests` on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--startup-delay", type=float, default=0.0)
    p.add_argument("--exit-code", type=int, default=None)
    p.add_argument("--weight-version", default="v0")
    p.add_argument("--health-delay", type=float, default=0.0)
    p.add_argument("--api", choices=["hf", "sglang"], default="hf")
    p.add_argument("--stop-delay", type=float, default=0.0)
    p.add_argument("--stop-log", default=None)
    p.add_argument("--request-log", default=None)
    args = p.parse_args()

    def note(what: str, log: str | None = args.stop_log) -> None:
        if log is not None:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{what} {args.port}\n".encode())
            finally:
                os.close(fd)

    def on_term(*_: object) -> None:
        note("term")
        time.sleep(args.stop_delay)
        note("exit")
        os._exit(0)

    if args.stop_delay > 0 or args.stop_log is not None:
        signal.signal(signal.SIGTERM, on_term)
    if args.exit_code is not None:
        print(f"fake engine: refusing to start (model {args.model_path})", file=sys.stderr, flush=True)
        return args.exit_code
    ready_at = time.monotonic() + args.startup_delay
    state = {"weight_version": args.weight_version, "health": 200}
    info_routes = ("/get_model_info",) if args.api == "sglang" else ("/model_info", "/get_model_info")

    class Handler(BaseHTTPRequestHandler):
        def _json(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            note(f"GET {self.path}", args.request_log)
            if time.monotonic() < ready_at:
                self._json(503, {"error": "starting"})
            elif self.path == "/health":
                time.sleep(args.health_delay)
                self._json(state["health"], {})
            elif self.path == "/fake/rendezvous":
                self._json(200, {"init_method": rendezvous})
            elif self.path in info_routes:
                self._json(200, {"model_path": args.model_path, "tokenizer_path": args.model_path,
                                 "is_generation": True, "weight_version": state["weight_version"],
                                 "max_context_length": 256, "vocab_size": 64})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
            if self.path == "/fake/health":
                state["health"] = int(body["code"])
                self._json(200, {})
            elif self.path == "/update_weights_from_disk":
                if body.get("weight_version") is not None:
                    state["weight_version"] = str(body["weight_version"])
                reply = {"success": True, "message": f"loaded {body.get('model_path')}"}
                if args.api == "hf":
                    reply["weight_version"] = state["weight_version"]
                self._json(200, reply)
            else:
                self._json(404, {"error": "not found"})

        def log_message(self, fmt: str, *a: object) -> None:
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    rendezvous = os.environ.get("SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE")
    if args.api == "sglang" and rendezvous and rendezvous.startswith("file://"):
        # As SGLang's rank 0 does through torch's FileStore: the store is a file the engine makes.
        with open(rendezvous[len("file://"):], "ab"):
            pass
    print(f"fake engine listening on {args.host}:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
