"""HTTP routes of the `hf` engine (behaviour documented in `hf_server.py`)."""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from .admin_key import authorized
from ..weight_group import dtype_name
from .hf_engine import DTYPES, GenState, HFEngine
from .request import GenRequest, RequestError, parse_generate
from .scheduler import NotStarted, Ticket
from .weights import WeightError

log = logging.getLogger("reef_shim.hf_server")
# A 128k-token prompt is ~1 MiB of JSON; a body far past that is a mistake, not a prompt to buffer.
MAX_BODY_BYTES = 64 << 20
PAUSE_MODES = ("abort", "retract", "in_place")


class ServerState:
    """What the handler threads share: the engine, the pause gate, the admission count and the
    rids of the requests admitted."""

    def __init__(self, max_running: int) -> None:
        self.engine: HFEngine | None = None
        self.max_running = max_running
        self.stopping = threading.Event()
        self._cond = threading.Condition()
        self._paused = False
        self._admitted = 0
        self._rids: set[str] = set()
        # Bumped by a pause in `abort` mode: a request admitted under an older value ends at its
        # next token (`EngineHandler._should_stop`).
        self.abort_epoch = 0

    def set_paused(self, paused: bool, abort: bool = False) -> None:
        with self._cond:
            self._paused = paused
            if abort:
                self.abort_epoch += 1
            self._cond.notify_all()

    def release_waiters(self) -> None:
        self.set_paused(False)

    def admit(self, rid: str | None) -> None:
        """Wait while paused, then count the request in (503 when too many are admitted, 400 when
        its rid is that of a request admitted and not yet left)."""
        with self._cond:
            while self._paused and not self.stopping.is_set():
                self._cond.wait(0.5)
            if self.stopping.is_set():
                raise RequestError("the engine is stopping", "REEF_ERR_ENGINE_DOWN", 503)
            if self._admitted >= self.max_running:
                raise RequestError(f"engine is unavailable: {self._admitted} requests already admitted",
                                   "REEF_ERR_ENGINE_DOWN", 503)
            # SGLang keys a request's state (and its abort when the client leaves) by rid and
            # refuses a second one in flight under the same rid; accepting it here would hide a
            # client that reuses rids until it meets SGLang.
            if rid is not None and rid in self._rids:
                raise RequestError(f"rid {rid!r}: a request with this rid is already in flight")
            self._admitted += 1
            if rid is not None:
                self._rids.add(rid)

    def admitted(self) -> int:
        with self._cond:
            return self._admitted

    def release_rid(self, rid: str | None) -> None:
        """Let another request take `rid`: called before the last of a reply goes out, since the
        client may reuse the rid as soon as it has that (the admission itself lasts until `leave`)."""
        if rid is not None:
            with self._cond:
                self._rids.discard(rid)

    def leave(self, rid: str | None) -> None:
        with self._cond:
            self._admitted -= 1
            if rid is not None:
                self._rids.discard(rid)
            self._cond.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every admitted request has left (with `stopping` set, each ends at its next
        token); False if some are still there after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._admitted > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True


def reply_body(state: GenState, req: GenRequest) -> dict[str, Any]:
    return {
        "text": state.text,
        "output_ids": list(state.output_ids),
        "meta_info": {
            "id": state.rid,
            "finish_reason": state.finish,
            "prompt_tokens": state.prompt_tokens,
            "completion_tokens": len(state.output_ids),
            "output_token_logprobs": list(state.token_logprobs) if req.return_logprob else None,
            "output_top_logprobs": list(state.top_logprobs) if req.return_logprob else None,
            # The version the tokens came from, not the engine's now: a swap may follow the last token.
            "weight_version": state.weight_version,
            # The LoRA adapter that served it (its /load_lora_adapter name), null for the base. SGLang's
            # meta_info has no such key: the hf engine's addition (lora_serving.py).
            "lora_path": state.adapter,
        },
    }


# route -> field -> (accepted types, default when absent: SGLang's defaults; REQUIRED = none)
REQUIRED = object()
_INT_LIST = "list[list[int]]"
DISTRIBUTED_ROUTES: dict[str, dict[str, tuple[Any, Any]]] = {
    "/init_weights_update_group": {
        "master_address": (str, REQUIRED), "master_port": (int, REQUIRED), "rank_offset": (int, REQUIRED),
        "world_size": (int, REQUIRED), "group_name": (str, "weight_update_group"), "backend": (str, "nccl"),
    },
    "/update_weights_from_distributed": {
        "names": ("list[str]", REQUIRED), "dtypes": ("list[str]", REQUIRED), "shapes": (_INT_LIST, REQUIRED),
        "group_name": (str, "weight_update_group"), "flush_cache": (bool, True), "weight_version": ((str, type(None)), None),
    },
    "/destroy_weights_update_group": {"group_name": (str, "weight_update_group")},
    # SGLang 0.5.17+'s update session; `selector` picks target or draft model runners there, and
    # this engine has only the one model.
    "/begin_weight_update": {"selector": (str, "all")},
    "/end_weight_update": {},
    # The colocated layout's routes: weights in shared memory, and the engine's memory given back
    # while the trainer steps (SGLang 0.5.23 `srt/entrypoints/http_server.py:1436-1455, 1575-1597`).
    "/update_weights_from_tensor": {
        "serialized_named_tensors": ("list[str]", REQUIRED), "load_format": ((str, type(None)), None),
        "flush_cache": (bool, True), "weight_version": ((str, type(None)), None),
    },
    "/release_memory_occupation": {"tags": (("list[str]", type(None)), None)},
    "/resume_memory_occupation": {"tags": (("list[str]", type(None)), None)},
}


# SGLang 0.5.23's bodies (srt/managers/io_struct.py:2516-2539). `pinned` keeps an adapter in SGLang's
# GPU pool; here every registered adapter may be evicted from memory and read back, so it is taken
# and changes nothing.
LORA_ROUTES: dict[str, dict[str, tuple[Any, Any]]] = {
    "/load_lora_adapter": {"lora_name": (str, REQUIRED), "lora_path": (str, REQUIRED), "pinned": (bool, False),
                           "lora_id": ((str, type(None)), None)},
    "/unload_lora_adapter": {"lora_name": (str, REQUIRED), "lora_id": ((str, type(None)), None)},
}


def _fits(value: Any, kind: Any) -> bool:
    if isinstance(kind, tuple) and "list[str]" in kind:
        return value is None if type(None) in kind and value is None else _fits(value, "list[str]")
    if kind == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == _INT_LIST:
        return isinstance(value, list) and all(
            isinstance(s, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in s)
            for s in value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _fields(body: Any, spec: dict[str, tuple[Any, Any]], path: str) -> dict[str, Any]:
    """The route's fields with SGLang's defaults; other keys SGLang accepts (abort_all_requests,
    load_format...) are ignored, as they change nothing here."""
    if not isinstance(body, dict):
        raise RequestError(f"{path}: expected a JSON object")
    out: dict[str, Any] = {}
    for key, (kind, default) in spec.items():
        if key not in body or (body[key] is None and default is not None):
            if default is REQUIRED:
                raise RequestError(f"{path}: {key} is required")
            out[key] = default
        elif not _fits(body[key], kind):
            raise RequestError(f"{path}: {key} has the wrong type")
        else:
            out[key] = body[key]
    return out


class ClientGone(Exception):
    pass


class EngineHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "reef-hf-engine"

    @property
    def st(self) -> ServerState:
        return self.server.state  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    # --- plumbing -------------------------------------------------------------------------------
    def _send_json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj, allow_nan=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, code: str, message: str) -> None:
        self._send_json(status, {"error": {"message": message, "code": code}})

    def _body(self) -> Any:
        try:
            raw = self._raw_body()
        except RequestError:
            # The rest of the body is unread: it would be parsed as the next request.
            self.close_connection = True
            raise
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as e:  # RecursionError: arrays nested thousands deep
            raise RequestError(f"the body is not JSON: {e}") from e

    def _raw_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._chunked_body()
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            raise RequestError("Content-Length is not a byte count", "REEF_ERR_BODY")
        if length > MAX_BODY_BYTES:
            raise RequestError(f"request body is larger than {MAX_BODY_BYTES} bytes", "REEF_ERR_TOO_LARGE", 413)
        raw = self.rfile.read(length) if length else b""
        if len(raw) < length:
            raise ClientGone()
        return raw

    def _chunked_body(self) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            if not line:
                raise ClientGone()
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise RequestError("a malformed chunk in the request body", "REEF_ERR_BODY") from None
            if size < 0:
                raise RequestError("a malformed chunk in the request body", "REEF_ERR_BODY")
            if size == 0:
                break
            total += size
            if total > MAX_BODY_BYTES:
                raise RequestError(f"request body is larger than {MAX_BODY_BYTES} bytes", "REEF_ERR_TOO_LARGE", 413)
            chunk = self.rfile.read(size)
            if len(chunk) < size:
                raise ClientGone()
            parts.append(chunk)
            self.rfile.readline(1024)  # the CRLF after the chunk
        while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
            pass  # trailer fields
        return b"".join(parts)

    def _engine(self) -> HFEngine | None:
        if self.st.engine is None:
            self._error(503, "REEF_ERR_ENGINE_DOWN", "engine is unavailable: the model is loading")
        return self.st.engine

    def _client_gone(self) -> bool:
        """Whether the client closed its end: polled between tokens, so that a request nobody waits
        for stops instead of holding the engine (a client that half-closes counts as gone, as with
        SGLang's uvicorn)."""
        try:
            if not select.select([self.connection], [], [], 0)[0]:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _should_stop(self) -> str | None:
        if self.st.stopping.is_set():
            return "the engine is stopping"
        if self.st.abort_epoch != self._epoch:
            return "aborted by /pause_generation"
        return "the client left" if self._client_gone() else None

    def _chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError) as e:
            raise ClientGone() from e

    # --- routes ---------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        if path == "/health":
            if self._engine() is not None:
                self._send_json(200, {})
        elif path in ("/model_info", "/get_model_info"):
            engine = self._engine()
            if engine is not None:
                self._send_json(200, engine.info())
        elif path in ("/server_info", "/get_server_info"):
            # The fields of SGLang's answer a weight push reads: one receiving rank, on the CPU, and
            # the dtype it serves (what the push sends).
            engine = self._engine()
            if engine is not None:
                self._send_json(200, {"tp_size": 1, "device": "cpu", "dtype": dtype_name(DTYPES[engine.dtype])})
        else:
            self._error(404, "REEF_ERR_NOT_FOUND", f"{path} not found")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        try:
            body = self._body()
            if path == "/generate":
                self._generate(body)
                return
            if not authorized(self.headers.get("Authorization"), getattr(self.server, "admin_key", None)):
                self._error(401, "REEF_ERR_UNAUTHORIZED", f"{path} is an admin route: send Authorization: Bearer "
                            "<the stack's engine admin key>")
                return
            engine = self._engine()
            if engine is None:
                return
            if path in LORA_ROUTES:
                self._lora_route(engine, path, body)
            elif path == "/update_weights_from_disk":
                self._update_weights(engine, body)
            elif path in DISTRIBUTED_ROUTES:
                self._distributed(engine, path, body)
            elif path == "/pause_generation":
                # SGLang 0.5.23's modes (srt/managers/io_struct.py:1927-1946): `abort`, the default,
                # aborts the requests in flight (tokenizer_manager.py:2267-2280); `in_place` and
                # `retract` hold them there, to go on after continue. This engine cannot hold a
                # request mid-generation, so in those two modes the ones in flight finish.
                mode = body.get("mode", "abort") if isinstance(body, dict) else "abort"
                if mode not in PAUSE_MODES:
                    raise RequestError(f"/pause_generation: mode must be one of {', '.join(PAUSE_MODES)}, not {mode!r}")
                self.st.set_paused(True, abort=mode == "abort")
                self._send_json(200, {"success": True, "message": f"paused ({mode})"})
            elif path == "/continue_generation":
                self.st.set_paused(False)
                self._send_json(200, {"success": True, "message": "continued"})
            elif path == "/flush_cache":
                # No cache outlives a request here, so there is nothing to drop. SGLang answers this
                # route in plain text, not JSON: so does this stand-in, so that a client parsing it
                # as JSON fails here as it would there.
                self._send_text(200, "Cache flushed (the hf engine keeps no cache between requests).\n")
            else:
                self._error(404, "REEF_ERR_NOT_FOUND", f"{path} not found")
        except RequestError as e:
            self._error(e.status, e.code, e.message)
        except ClientGone:
            self.close_connection = True
        except Exception as e:  # a bug must answer 500, not drop the connection without a reply
            log.exception("%s failed", path)
            self.close_connection = True
            try:
                self._error(500, "REEF_ERR_HANDLER", f"handler for {path} failed: {e}")
            except OSError:
                pass

    def _update_weights(self, engine: HFEngine, body: Any) -> None:
        path = body.get("model_path") if isinstance(body, dict) else None
        version = body.get("weight_version") if isinstance(body, dict) else None
        if not isinstance(path, str) or not (version is None or isinstance(version, str)):
            raise RequestError("expected {model_path: string, weight_version: string | null}")
        try:
            engine.update_weights_from_disk(path, version)
        except WeightError as e:
            log.warning("update_weights_from_disk %s failed: %s", path, e)
            self._send_json(400, {"success": False, "message": str(e), "weight_version": engine.weight_version})
            return
        log.info("weights loaded from %s, weight_version %s", path, engine.weight_version)
        self._send_json(200, {"success": True, "message": f"loaded {path}", "weight_version": engine.weight_version})

    def _distributed(self, engine: HFEngine, path: str, body: Any) -> None:
        """SGLang's weight-group routes: `{success, message}`, 400 when refused (weights unchanged)."""
        spec = DISTRIBUTED_ROUTES[path]
        args = _fields(body, spec, path)
        try:
            if path == "/init_weights_update_group":
                message = engine.init_weights_update_group(**args)
            elif path == "/update_weights_from_distributed":
                del args["flush_cache"]  # nothing is cached between requests here
                engine.update_weights_from_distributed(**args)
                message = f"received {len(args['names'])} tensor(s) over {args['group_name']!r}"
            elif path == "/update_weights_from_tensor":
                n = engine.update_weights_from_tensor(args["serialized_named_tensors"], args["load_format"],
                                                      args["weight_version"])
                message = f"took {n} tensor(s) from shared memory"
            elif path == "/release_memory_occupation":
                if self.st.admitted():
                    raise WeightError(f"{self.st.admitted()} request(s) in flight: pause generation and let "
                                      "them finish first")
                message = engine.release_memory_occupation(args["tags"])
            elif path == "/resume_memory_occupation":
                message = engine.resume_memory_occupation(args["tags"])
            elif path == "/begin_weight_update":
                message = engine.weight_groups.begin()
            elif path == "/end_weight_update":
                message = engine.weight_groups.end()
            else:
                message = engine.destroy_weights_update_group(**args)
        except WeightError as e:
            log.warning("%s failed: %s", path, e)
            self._send_json(400, {"success": False, "message": str(e), "weight_version": engine.weight_version})
            return
        log.info("%s: %s (weight_version %s)", path, message, engine.weight_version)
        self._send_json(200, {"success": True, "message": message, "weight_version": engine.weight_version})

    def _lora_route(self, engine: HFEngine, path: str, body: Any) -> None:
        """SGLang's `/load_lora_adapter` and `/unload_lora_adapter` (lora_serving.py cites them): its
        LoRAUpdateOutput, 200 on success, 400 when refused (the adapters unchanged)."""
        from .lora_serving import AdapterError

        args = _fields(body, LORA_ROUTES[path], path)
        try:
            if path == "/load_lora_adapter":
                engine.load_lora_adapter(args["lora_name"], args["lora_path"])
            else:
                engine.unload_lora_adapter(args["lora_name"])
        except (AdapterError, WeightError) as e:
            log.warning("%s %s failed: %s", path, args["lora_name"], e)
            self._send_json(400, {"success": False, "error_message": str(e),
                                  "loaded_adapters": engine.adapters.listing()})
            return
        log.info("%s %s: %d adapter(s) registered, %d in memory", path, args["lora_name"],
                 len(engine.adapters.listing()), len(engine.adapters.loaded))
        self._send_json(200, {"success": True, "error_message": None, "loaded_adapters": engine.adapters.listing()})

    def _generate(self, body: Any) -> None:
        req = parse_generate(body)
        engine = self._engine()
        if engine is None:
            return
        self.st.admit(req.rid)
        self._epoch = self.st.abort_epoch
        try:
            # Checked once admitted: a request that waited out a pause may find the memory released.
            refusal = engine.serving_refusal()
            if refusal is not None:
                raise RequestError(refusal, "REEF_ERR_ENGINE_DOWN", 503)
            try:
                ticket = engine.submit(req, self._should_stop)  # a RequestError about the prompt surfaces here
                states = ticket.states()
                first = next(states)
            except NotStarted:
                if self.st.abort_epoch != self._epoch:
                    raise RequestError("aborted by /pause_generation before it started", "REEF_ERR_ENGINE_DOWN",
                                       503) from None
                if self.st.stopping.is_set():
                    # Queued behind others when the server began to stop: not even the prompt runs.
                    raise RequestError("the engine is stopping", "REEF_ERR_ENGINE_DOWN", 503) from None
                # It left while queued (behind other requests, or paused): not even the prompt runs.
                self.close_connection = True
                log.info("client left request %s before it started", req.rid)
                return
            if req.stream:
                self._stream(ticket, first, states, req)
                return
            last = first  # without streaming, the one state handed out is the last
            if last.finish and last.finish["type"] == "abort" and self._client_gone():
                self.close_connection = True
                log.info("client left request %s after %d tokens", last.rid, len(last.output_ids))
                return
            self.st.release_rid(req.rid)
            self._send_json(200, reply_body(last, req))
        finally:
            self.st.leave(req.rid)

    def _stream(self, ticket: Ticket, first: GenState, states: Any, req: GenRequest) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            state: GenState | None = first
            while state is not None:
                if state.finish is not None and state.finish["type"] == "abort" and self._client_gone():
                    raise ClientGone()
                if state.finish is not None:
                    self.st.release_rid(req.rid)
                event = json.dumps(reply_body(state, req), allow_nan=False)
                self._chunk(f"data: {event}\n\n".encode())
                state = next(states, None)
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except ClientGone:
            ticket.cancel()  # its row leaves the batch: no token is computed for a client that left
            self.close_connection = True
            log.info("client left stream %s", req.rid)
        except Exception as e:
            # The 200 and some events are out: an error response now would land inside the chunked
            # body. SGLang ends such a stream with an error event, then [DONE].
            ticket.cancel()
            log.exception("stream %s failed", req.rid)
            self.close_connection = True
            error = json.dumps({"error": {"message": f"generation failed: {e}", "code": "REEF_ERR_HANDLER"}})
            try:
                self._chunk(f"data: {error}\n\n".encode())
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")
            except ClientGone:
                pass
