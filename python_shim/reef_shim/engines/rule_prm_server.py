"""A PRM engine double that judges by rules: the closed-loop demo's PRM on a CPU.

    python -m reef_shim.engines.rule_prm_server --port P [--host H] [--tokenizer-path DIR]
        [--prompts-dir DIR] [--accept-hint TEXT]

It speaks the subset of the engine API the PRM actors use (docs/internals.md, "Engine HTTP API"):
`POST /generate` (`text`, or `input_ids` decoded with the tokenizer of `--tokenizer-path`;
`stream` gives one cumulative event and `[DONE]`), `GET /health`, `GET /model_info`
(`/get_model_info`), and the OpenAI `POST /v1/chat/completions` (`n` choices, `stream` as chunks)
with `GET /v1/models`. The answer is decided by `rule_prm_rules.py` (how the judge's prompt is read,
and the rule table); it is deterministic: the same prompt always gets the same text, whatever the
temperature or seed. `output_ids` are the answer's tokens followed by `<|im_end|>` (finish `stop`)
when a tokenizer is given, else empty; `max_new_tokens` / `max_tokens` cut the answer (`length`).
It prints `{"event": "ready", "url", "pid"}` once listening (`--port 0` picks a port); SIGTERM exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .rule_prm_rules import JudgePrompt, answer

log = logging.getLogger("reef_shim.rule_prm_server")
DEFAULT_PROMPTS = Path(__file__).resolve().parents[3] / "recipes" / "openclawrl" / "prompts"
MODEL_NAME = "reef-rule-prm"


class RulePRM:
    def __init__(self, tokenizer_path: str | None, prompts_dir: Path | None, accept_hint: str | None) -> None:
        self.tokenizer = None
        self.tokenizer_path = tokenizer_path
        self.vocab_size = 0
        self.eos: int | None = None
        if tokenizer_path:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(Path(tokenizer_path) / "tokenizer.json"))
            self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
            self.eos = self.tokenizer.token_to_id("<|im_end|>")
        self.prompts = JudgePrompt(prompts_dir)
        self.accept_hint = accept_hint

    def prompt_text(self, body: dict[str, Any]) -> str:
        if isinstance(body.get("text"), str):
            return body["text"]
        ids = body.get("input_ids")
        if isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            if self.tokenizer is None:
                raise ValueError("input_ids need --tokenizer-path to be read")
            return self.tokenizer.decode(ids, skip_special_tokens=False)
        raise ValueError("give text (a string) or input_ids (a non-empty list of integers)")

    def respond(self, prompt: str, max_tokens: int | None) -> tuple[str, list[int], dict[str, Any]]:
        text = answer(self.prompts.parse(prompt), self.accept_hint)
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids if self.tokenizer is not None else []
        if max_tokens is not None and self.tokenizer is not None and len(ids) >= max_tokens:
            ids = ids[:max_tokens]
            return self.tokenizer.decode(ids), ids, {"type": "length", "matched": None}
        if max_tokens is not None and self.tokenizer is None and len(text) > 4 * max_tokens:
            return text[:4 * max_tokens], [], {"type": "length", "matched": None}
        if self.eos is not None:
            return text, ids + [self.eos], {"type": "stop", "matched": self.eos}
        return text, ids, {"type": "stop", "matched": None}

    def info(self) -> dict[str, Any]:
        return {"model_path": MODEL_NAME, "tokenizer_path": self.tokenizer_path, "is_generation": True,
                "weight_version": "rules", "max_context_length": 1 << 20, "vocab_size": self.vocab_size}


def _count(body: dict[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    """An optional integer field in [low, high]; ValueError (400) for anything else."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        raise ValueError(f"{key}: expected an integer in [{low}, {high if high is not None else 'inf'}]")
    return value


def _chat_prompt(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: expected a non-empty list")
    parts = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        parts.append(content if isinstance(content, str) else "")
    # The judge sends one user message; with more, the last user message holds the turn.
    users = [p for m, p in zip(messages, parts) if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1] if users else parts[-1]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "reef-rule-prm"

    @property
    def prm(self) -> RulePRM:
        return self.server.prm  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    def _json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, events: list[Any]) -> None:
        data = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._json(200, {})
        elif path in ("/model_info", "/get_model_info"):
            self._json(200, self.prm.info())
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "reef"}]})
        else:
            self._json(404, {"error": {"message": f"{path} not found", "code": "REEF_ERR_NOT_FOUND"}})

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        try:
            raw = self._read_body()
            try:
                body = json.loads(raw or b"{}")
            except RecursionError as e:  # arrays nested thousands deep
                raise ValueError(f"the body is not JSON: {e}") from e
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            if path == "/generate":
                self._generate(body)
            elif path == "/v1/chat/completions":
                self._chat(body)
            else:
                self._json(404, {"error": {"message": f"{path} not found", "code": "REEF_ERR_NOT_FOUND"}})
        except ValueError as e:
            self._json(400, {"error": {"message": str(e), "code": "REEF_ERR_INVALID_ARGUMENT"}})
        except Exception as e:  # a bug must answer 500, not drop the connection without a reply
            log.exception("%s failed", path)
            self.close_connection = True
            self._json(500, {"error": {"message": f"handler for {path} failed: {e}", "code": "REEF_ERR_HANDLER"}})

    def _read_body(self) -> bytes:
        # A body that cannot be delimited is refused, and the connection closed: left unread, it
        # would be parsed as the next request; read with a negative length, it waits for EOF.
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self.close_connection = True
            raise ValueError("a chunked body is not read here: send it with Content-Length")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise ValueError("Content-Length is not a byte count")
        return self.rfile.read(length)

    def _generate(self, body: dict[str, Any]) -> None:
        sp = {} if body.get("sampling_params") is None else body["sampling_params"]
        if not isinstance(sp, dict):
            raise ValueError("sampling_params: expected an object")
        prompt = self.prm.prompt_text(body)
        text, ids, finish = self.prm.respond(prompt, _count(sp, "max_new_tokens", 0))
        prompt_tokens = len(body["input_ids"]) if isinstance(body.get("input_ids"), list) else (
            len(self.prm.tokenizer.encode(prompt).ids) if self.prm.tokenizer is not None else 0)
        logprobs = [[0.0, t, None] for t in ids] if body.get("return_logprob") else None
        top = [[[0.0, t, None]] for t in ids] if body.get("return_logprob") else None
        reply = {"text": text, "output_ids": ids, "meta_info": {
            "id": body.get("rid") or f"rule-{time.monotonic_ns()}", "finish_reason": finish,
            "prompt_tokens": prompt_tokens, "completion_tokens": len(ids), "output_token_logprobs": logprobs,
            "output_top_logprobs": top, "weight_version": "rules"}}
        if body.get("stream"):
            self._sse([reply])
        else:
            self._json(200, reply)

    def _chat(self, body: dict[str, Any]) -> None:
        prompt = _chat_prompt(body.get("messages"))
        max_tokens = _count(body, "max_completion_tokens", 0)
        max_tokens = _count(body, "max_tokens", 0) if max_tokens is None else max_tokens
        text, ids, finish = self.prm.respond(prompt, max_tokens)
        n = _count(body, "n", 1, 128) or 1  # OpenAI's bound; a larger n only builds a huge reply
        reason = "length" if finish["type"] == "length" else "stop"
        rid, created, model = f"chatcmpl-rule-{time.monotonic_ns()}", int(time.time()), body.get("model") or MODEL_NAME
        if body.get("stream"):
            chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
            self._sse([{**chunk, "choices": [{"index": i, "delta": {"role": "assistant", "content": text},
                                               "finish_reason": None} for i in range(n)]},
                       {**chunk, "choices": [{"index": i, "delta": {}, "finish_reason": reason} for i in range(n)]}])
            return
        self._json(200, {"id": rid, "object": "chat.completion", "created": created, "model": model,
                         "choices": [{"index": i, "message": {"role": "assistant", "content": text},
                                      "finish_reason": reason} for i in range(n)],
                         "usage": {"prompt_tokens": 0, "completion_tokens": len(ids) * n,
                                   "total_tokens": len(ids) * n}})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reef_shim.engines.rule_prm_server", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30001, help="0 picks a free port (see the ready line)")
    p.add_argument("--tokenizer-path", default=None, help="model directory whose tokenizer.json reads input_ids")
    p.add_argument("--prompts-dir", default=str(DEFAULT_PROMPTS), help="the judge's prompt templates")
    p.add_argument("--accept-hint", default=None, help="hint for accepted plain replies (default: none, anchor)")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads = True
    httpd.prm = RulePRM(args.tokenizer_path, Path(args.prompts_dir), args.accept_hint)  # type: ignore[attr-defined]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    host, port = httpd.server_address[:2]
    print(json.dumps({"event": "ready", "url": f"http://{host}:{port}", "pid": os.getpid()}), flush=True)
    while not stop.wait(0.5):
        pass
    httpd.shutdown()
    httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
