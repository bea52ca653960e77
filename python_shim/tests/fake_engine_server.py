"""A stand-in engine server for the shim's own tests: stdlib HTTP, no model.

It takes the engine command line (`--model-path --host --port`) and answers `GET /health` and
`GET /model_info` like the real engines. Test knobs, all extra args:
`--startup-delay S` (not healthy for S seconds), `--exit-code N` (die at once with N after
printing to stderr), `--weight-version V`.
Selected with `REEF_ENGINE_MODULE_HF=fake_engine_server` and `python_shim/tests` on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
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
    args = p.parse_args()
    if args.exit_code is not None:
        print(f"fake engine: refusing to start (model {args.model_path})", file=sys.stderr, flush=True)
        return args.exit_code
    ready_at = time.monotonic() + args.startup_delay

    class Handler(BaseHTTPRequestHandler):
        def _json(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            if time.monotonic() < ready_at:
                self._json(503, {"error": "starting"})
            elif self.path == "/health":
                self._json(200, {})
            elif self.path == "/model_info":
                self._json(200, {"model_path": args.model_path, "tokenizer_path": args.model_path,
                                 "is_generation": True, "weight_version": args.weight_version,
                                 "max_context_length": 256, "vocab_size": 64})
            else:
                self._json(404, {"error": "not found"})

        def log_message(self, fmt: str, *a: object) -> None:
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"fake engine listening on {args.host}:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
