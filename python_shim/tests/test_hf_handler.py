"""The `hf` engine's HTTP handler in-process, over a stand-in engine, for failures a real model
does not produce on demand."""

from __future__ import annotations

import http.client
import json
import threading
from http.server import ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from reef_shim.engines.hf_engine import GenState
from reef_shim.engines.http_handler import EngineHandler, ServerState


class FailingTicket:
    """Hands out one token, then fails as a model or a decode could."""

    def states(self) -> Iterator[GenState]:
        yield GenState(rid="r", prompt_tokens=1, output_ids=[5], text="a")
        raise RuntimeError("the model broke")

    def cancel(self) -> None:
        pass


class FailingEngine:
    weight_version = "w"

    def serving_refusal(self) -> None:
        return None

    def submit(self, req: Any, should_stop: Any) -> FailingTicket:
        return FailingTicket()


@pytest.fixture()
def server() -> Iterator[tuple[str, int]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), EngineHandler)
    httpd.daemon_threads = True
    httpd.state = ServerState(max_running=4)  # type: ignore[attr-defined]
    httpd.state.engine = FailingEngine()  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[:2]  # type: ignore[misc]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_stream_that_fails_midway_ends_with_an_error_event_and_done(server: tuple[str, int]) -> None:
    conn = http.client.HTTPConnection(*server, timeout=30)
    conn.request("POST", "/generate", json.dumps({"text": "x", "stream": True}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    body = resp.read().decode()  # a well-formed chunked body, read to its end
    events = [line[len("data: "):] for line in body.split("\n\n") if line.startswith("data: ")]
    assert json.loads(events[0])["output_ids"] == [5]
    assert json.loads(events[1])["error"]["message"] == "generation failed: the model broke"
    assert events[2:] == ["[DONE]"]
    conn.close()
