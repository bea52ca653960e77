"""The `hf` engine as a real subprocess on a free port, against a tiny model built in a tmp dir."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from reef_shim import tiny_model
from reef_shim.engines.sampling import LOGPROB_FLOOR, sampling_logprobs, tempered_logprobs

SHIM = Path(__file__).resolve().parents[1]
PROMPT = "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n"


class Engine:
    def __init__(self, proc: subprocess.Popen[str], url: str, log_path: Path) -> None:
        self.proc, self.url, self.log_path = proc, url, log_path

    def call(self, path: str, body: Any = None, method: str | None = None, key: str | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **({} if key is None else {"Authorization": f"Bearer {key}"})}
        req = urllib.request.Request(self.url + path, data=data, method=method or ("POST" if data else "GET"),
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def generate(self, **body: Any) -> dict[str, Any]:
        status, reply = self.call("/generate", body)
        assert status == 200, reply
        return reply

    def stream(self, **body: Any) -> Iterator[Any]:
        host, port = self.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        conn.request("POST", "/generate", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
        try:
            for line in resp:
                line = line.decode().strip()
                if line.startswith("data: "):
                    payload = line[len("data: "):]
                    yield payload if payload == "[DONE]" else json.loads(payload)
        finally:
            conn.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("models")
    tiny_model.build(root / "seed0", seed=0, quiet=True)
    tiny_model.build(root / "seed1", seed=1, quiet=True)
    return root / "seed0", root / "seed1"


@contextmanager
def launch(model_dir: Path, log_path: Path, *args: str, module: str = "reef_shim.engines.hf_server",
           env_extra: dict[str, str] | None = None) -> Iterator[Engine]:
    """The hf engine as a subprocess on a free port; SIGTERM at the end must exit it with 0."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SHIM), str(SHIM / "tests")]), "PYTHONUNBUFFERED": "1",
           **(env_extra or {})}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", module, "--model-path", str(model_dir),
                                 "--host", "127.0.0.1", "--port", "0", *args],
                                stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline() or "{}")
        assert ready.get("event") == "ready", log_path.read_text()
        yield Engine(proc, ready["url"], log_path)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0, f"engine exited with {code} after SIGTERM:\n{log_path.read_text()}"


@pytest.fixture(scope="module")
def engine(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with launch(models[0], tmp_path_factory.mktemp("log") / "engine.log", "--seed", "7", "--weight-version", "v0") as e:
        yield e


def recompute(model_dir: Path, prompt_ids: list[int], output_ids: list[int], **sampling: Any) -> tuple[Any, Any]:
    """Full forward over prompt + output: what the engine reports (log-softmax of logits / T, before
    top-k / top-p) and the truncated distribution it draws from."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([prompt_ids + output_ids])).logits[0][len(prompt_ids) - 1:-1]
    return tempered_logprobs(logits, sampling["temperature"]), sampling_logprobs(logits, **sampling)


def prompt_ids(model_dir: Path) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(PROMPT, add_special_tokens=False).ids


def test_health_and_model_info(engine: Engine, models: tuple[Path, Path]) -> None:
    assert engine.call("/health")[0] == 200
    status, info = engine.call("/model_info")
    assert status == 200
    assert info == {"model_path": str(models[0].resolve()), "tokenizer_path": str(models[0].resolve()),
                    "is_generation": True, "weight_version": "v0", "max_context_length": 4096, "vocab_size": 2048}
    # What a trainer's weight push reads to choose gloo for an engine on the CPU.
    for route in ("/server_info", "/get_server_info"):
        assert engine.call(route) == (200, {"tp_size": 1, "device": "cpu", "dtype": "float32"})


def test_greedy_is_deterministic_and_text_equals_input_ids(engine: Engine, models: tuple[Path, Path]) -> None:
    params = {"max_new_tokens": 12, "temperature": 0}
    a = engine.generate(text=PROMPT, sampling_params=params, return_logprob=True, top_logprobs_num=3)
    b = engine.generate(input_ids=prompt_ids(models[0]), sampling_params=params, return_logprob=True,
                        top_logprobs_num=3)
    assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]
    assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]
    assert a["meta_info"]["finish_reason"] == {"type": "length", "matched": None}
    assert a["meta_info"]["prompt_tokens"] == len(prompt_ids(models[0]))
    assert a["meta_info"]["completion_tokens"] == len(a["output_ids"]) == 12


@pytest.mark.parametrize("sampling", [
    {"temperature": 0.0, "top_k": -1, "top_p": 1.0},
    {"temperature": 0.8, "top_k": 40, "top_p": 0.9},
    {"temperature": 1.3, "top_k": -1, "top_p": 0.5},
    # top_k below K: every top-K entry is still a finite logprob (SGLang's convention), none the floor.
    {"temperature": 0.8, "top_k": 2, "top_p": 1.0},
])
def test_logprobs_are_tempered_before_truncation_as_a_full_forward_recomputes_them(
        engine: Engine, models: tuple[Path, Path], sampling: dict[str, Any]) -> None:
    k = 5
    reply = engine.generate(text=PROMPT, sampling_params={"max_new_tokens": 16, "sampling_seed": 3, **sampling},
                            return_logprob=True, top_logprobs_num=k)
    out = reply["output_ids"]
    lp, drawn_from = recompute(models[0], prompt_ids(models[0]), out, **sampling)
    meta = reply["meta_info"]
    assert len(meta["output_token_logprobs"]) == len(meta["output_top_logprobs"]) == len(out)
    for t, (entry, top) in enumerate(zip(meta["output_token_logprobs"], meta["output_top_logprobs"])):
        assert entry[1] == out[t] and entry[2] is None
        assert abs(entry[0] - float(lp[t, out[t]])) < 1e-5
        assert len(top) == k
        values = [x[0] for x in top]
        assert values == sorted(values, reverse=True)
        for value, tid, none in top:
            assert none is None and value > LOGPROB_FLOOR and abs(value - float(lp[t, tid])) < 1e-5
        # The top-K are the K best of the reported distribution, not of the truncated one.
        assert [x[1] for x in top] == lp[t].topk(k).indices.tolist()
        # The token was drawn from the truncated distribution: it is in its support.
        assert float(drawn_from[t, out[t]]) > float("-inf")


def test_a_temperature_too_small_to_divide_by_is_greedy(engine: Engine) -> None:
    body = {"text": PROMPT, "return_logprob": True, "top_logprobs_num": 3}
    greedy = engine.generate(**body, sampling_params={"max_new_tokens": 6, "temperature": 0})
    tiny = engine.generate(**body, sampling_params={"max_new_tokens": 6, "temperature": 1e-40})
    assert tiny["output_ids"] == greedy["output_ids"]
    assert tiny["meta_info"]["output_top_logprobs"] == greedy["meta_info"]["output_top_logprobs"]


def test_sampling_seed_and_server_seed_with_rid_fix_the_output(engine: Engine) -> None:
    params = {"max_new_tokens": 10, "temperature": 1.0}
    a = engine.generate(text=PROMPT, sampling_params={**params, "sampling_seed": 11})
    b = engine.generate(text=PROMPT, sampling_params={**params, "sampling_seed": 11})
    assert a["output_ids"] == b["output_ids"]
    c = engine.generate(text=PROMPT, sampling_params=params, rid="req-1")
    d = engine.generate(text=PROMPT, sampling_params=params, rid="req-1")
    assert c["output_ids"] == d["output_ids"] and c["meta_info"]["id"] == "req-1"


def test_stop_token_ids_and_stop_strings(engine: Engine) -> None:
    first = engine.generate(text=PROMPT, sampling_params={"max_new_tokens": 6, "temperature": 0})
    stop_id = first["output_ids"][0]
    r = engine.generate(text=PROMPT, sampling_params={"max_new_tokens": 6, "temperature": 0, "stop_token_ids": [stop_id]})
    assert r["output_ids"] == [stop_id] and r["text"] == ""
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    stop_str = first["text"][1:3]
    assert stop_str
    s = engine.generate(text=PROMPT, sampling_params={"max_new_tokens": 6, "temperature": 0, "stop": [stop_str]})
    assert s["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_str}
    assert stop_str not in s["text"] and first["text"].startswith(s["text"])


def test_stream_is_incremental_and_ends_like_the_plain_reply(engine: Engine) -> None:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0}, "return_logprob": True,
            "top_logprobs_num": 2}
    plain = engine.generate(**body)
    events = list(engine.stream(**body))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    lengths = [len(c["output_ids"]) for c in chunks]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    final = chunks[-1]
    assert final["text"] == plain["text"] and final["output_ids"] == plain["output_ids"]
    assert final["meta_info"]["output_token_logprobs"] == plain["meta_info"]["output_token_logprobs"]
    assert final["meta_info"]["output_top_logprobs"] == plain["meta_info"]["output_top_logprobs"]
    assert final["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]


def test_client_leaving_a_stream_stops_its_generation(engine: Engine) -> None:
    events = engine.stream(text=PROMPT, rid="leaver",
                           sampling_params={"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True})
    next(events)
    events.close()  # closes the connection after the first event
    _expect_served_after_leaving(engine, "client left stream leaver")


def test_client_leaving_a_plain_request_stops_its_generation(engine: Engine) -> None:
    import socket

    body = json.dumps({"text": PROMPT, "rid": "quitter",
                       "sampling_params": {"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True}}).encode()
    host, port = engine.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: e\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    _expect_served_after_leaving(engine, "client left request quitter")


def test_a_rid_in_flight_is_refused_and_free_again_once_its_request_ended(engine: Engine) -> None:
    host, port = engine.url.removeprefix("http://").split(":")
    headers = {"Content-Type": "application/json"}
    body = {"text": PROMPT, "rid": "twice", "stream": True,
            "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", "/generate", json.dumps(body), headers)
        first = conn.getresponse()  # the headers come once the request is admitted and generating
        assert first.status == 200
        status, reply = engine.call("/generate", {"text": PROMPT, "rid": "twice", "sampling_params": {"max_new_tokens": 1}})
        assert status == 400 and reply["error"]["code"] == "REEF_ERR_INVALID_ARGUMENT", reply
        assert "twice" in reply["error"]["message"]
        assert first.read().decode().rstrip().endswith("data: [DONE]")
        # One connection's requests are handled in turn: this one starts after the first one's ended.
        conn.request("POST", "/generate", json.dumps({**body, "stream": False}), headers)
        again = conn.getresponse()
        assert again.status == 200 and json.loads(again.read())["meta_info"]["id"] == "twice"
    finally:
        conn.close()


def test_a_rid_is_free_again_once_its_reply_arrived(engine: Engine) -> None:
    # The client may reuse a rid the moment it has the answer: the engine must have let go of it
    # before sending that answer, not after.
    for body in ({"stream": False}, {"stream": True}):
        for _ in range(100):
            if body["stream"]:
                assert list(engine.stream(text=PROMPT, rid="again", sampling_params={"max_new_tokens": 1}))[-1] == "[DONE]"
            else:
                assert engine.generate(text=PROMPT, rid="again", sampling_params={"max_new_tokens": 1})["meta_info"]["id"] == "again"


def test_a_server_told_to_stop_answers_the_stream_in_flight_with_abort(models: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    # Each token takes seconds here (hf_server_slow.py): the server must wait for the request's
    # abort to go out rather than exit under it.
    with launch(models[0], tmp_path / "slow.log", module="hf_server_slow") as slow:
        events = slow.stream(input_ids=list(range(10, 18)),
                             sampling_params={"max_new_tokens": 50, "temperature": 0, "ignore_eos": True})
        assert next(events)["meta_info"]["finish_reason"] is None
        slow.proc.send_signal(signal.SIGTERM)
        rest = list(events)
    assert rest[-1] == "[DONE]", rest
    # SGLang's abort carries a message; the gateway puts it in the error it answers.
    assert rest[-2]["meta_info"]["finish_reason"] == {"type": "abort", "matched": None,
                                                      "message": "the engine is stopping"}


def _expect_served_after_leaving(engine: Engine, logged: str) -> None:
    """The next request is served (the 3000-token one behind it was cut off), and the log says why."""
    after = engine.generate(text=PROMPT, sampling_params={"max_new_tokens": 2, "temperature": 0})
    assert len(after["output_ids"]) == 2
    deadline = time.monotonic() + 60
    while logged not in engine.log_path.read_text():
        assert time.monotonic() < deadline, "the engine did not notice the client leaving"
        time.sleep(0.2)


def test_bad_requests_are_400_with_a_code(engine: Engine) -> None:
    for body in ({"input_ids": [1] * 4096}, {"input_ids": [5000]}, {}, {"text": "x", "input_ids": [1]},
                 {"text": "x", "sampling_params": {"top_k": 0}}, {"text": "x", "sampling_params": {"max_new_tokens": "9"}},
                 {"text": "x", "sampling_params": {"temperature": float("nan")}},
                 {"text": "x", "sampling_params": {"temperature": float("inf")}},
                 {"text": "x", "sampling_params": {"sampling_seed": 1 << 70}}):
        status, reply = engine.call("/generate", body)
        assert status == 400, body
        assert reply["error"]["code"] == "REEF_ERR_INVALID_ARGUMENT" and reply["error"]["message"]
    assert engine.call("/nope")[0] == 404


def raw_exchange(engine: Engine, data: bytes) -> list[tuple[int, Any]]:
    """Send bytes as they are, then read every (JSON, Content-Length) response until the engine closes
    (the last request should say `Connection: close`)."""
    import socket

    host, port = engine.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(data)  # not half-closed: the engine takes that for a client that left
        stream = sock.makefile("rb")
        replies = []
        while status_line := stream.readline():
            headers = {}
            while (line := stream.readline().decode()) not in ("\r\n", ""):
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
            replies.append((int(status_line.split()[1]), json.loads(stream.read(int(headers["content-length"])))))
        return replies


def test_a_body_that_cannot_be_read_is_4xx_and_the_engine_keeps_serving(engine: Engine) -> None:
    for head, body, status, code in [
        (b"Content-Length: many", b"{}", 400, "REEF_ERR_BODY"),
        (b"Content-Length: 99999999999", b"{}", 413, "REEF_ERR_TOO_LARGE"),
        (b"Content-Length: 200000", b"[" * 100_000 + b"]" * 100_000, 400, "REEF_ERR_INVALID_ARGUMENT"),
    ]:
        replies = raw_exchange(engine, b"POST /generate HTTP/1.1\r\nHost: e\r\nConnection: close\r\n%s\r\n\r\n%s"
                               % (head, body))
        assert [(s, r["error"]["code"]) for s, r in replies] == [(status, code)], head
    assert engine.call("/health")[0] == 200


def test_a_chunked_body_is_read_whole_and_the_connection_stays_usable(engine: Engine) -> None:
    body = json.dumps({"text": PROMPT, "sampling_params": {"max_new_tokens": 3, "temperature": 0}}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:])) + b"0\r\n\r\n"
    replies = raw_exchange(engine, b"POST /generate HTTP/1.1\r\nHost: e\r\nTransfer-Encoding: chunked\r\n\r\n"
                           + chunked + b"GET /health HTTP/1.1\r\nHost: e\r\nConnection: close\r\n\r\n")
    assert [s for s, _ in replies] == [200, 200], replies
    assert replies[0][1]["output_ids"] == engine.generate(text=PROMPT, sampling_params={
        "max_new_tokens": 3, "temperature": 0})["output_ids"]


def test_update_weights_changes_outputs_and_reload_restores_them(engine: Engine, models: tuple[Path, Path]) -> None:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0}, "return_logprob": True}
    before = engine.generate(**body)
    status, r = engine.call("/update_weights_from_disk", {"model_path": str(models[1]), "weight_version": "v1"})
    assert (status, r["success"], r["weight_version"]) == (200, True, "v1")
    changed = engine.generate(**body)
    assert changed["meta_info"]["weight_version"] == "v1"
    assert changed["meta_info"]["output_token_logprobs"] != before["meta_info"]["output_token_logprobs"]
    assert engine.call("/model_info")[1]["model_path"] == str(models[1].resolve())
    status, r = engine.call("/update_weights_from_disk", {"model_path": str(models[0]), "weight_version": "v0"})
    assert status == 200 and r["success"]
    restored = engine.generate(**body)
    assert restored["output_ids"] == before["output_ids"]
    assert restored["meta_info"]["output_token_logprobs"] == before["meta_info"]["output_token_logprobs"]
    assert restored["meta_info"]["weight_version"] == "v0"


def test_update_weights_rejects_a_bad_checkpoint_and_keeps_serving(engine: Engine, tmp_path: Path,
                                                                     models: tuple[Path, Path]) -> None:
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    config = json.loads((models[0] / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps({**config, "hidden_size": 32}))
    for path in (str(tmp_path / "missing"), str(wrong)):
        status, r = engine.call("/update_weights_from_disk", {"model_path": path, "weight_version": "bad"})
        assert status == 400 and r["success"] is False and r["message"] and r["weight_version"] == "v0"
    assert engine.generate(text=PROMPT, sampling_params={"max_new_tokens": 1})["meta_info"]["weight_version"] == "v0"


def test_pause_holds_new_requests_until_continue(engine: Engine) -> None:
    assert engine.call("/pause_generation", {})[0] == 200
    assert engine.call("/health")[0] == 200
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(
        engine.generate(text=PROMPT, sampling_params={"max_new_tokens": 2, "temperature": 0})))
    worker.start()
    worker.join(1.0)
    assert worker.is_alive() and not result, "a request completed while the engine was paused"
    assert engine.call("/continue_generation", {})[0] == 200
    worker.join(60)
    assert len(result["output_ids"]) == 2
    # SGLang answers /flush_cache in plain text; a client must not read it as JSON.
    with urllib.request.urlopen(urllib.request.Request(engine.url + "/flush_cache", b"{}", method="POST"),
                                timeout=60) as r:
        assert r.status == 200 and r.headers.get_content_type() == "text/plain"
        assert r.read().startswith(b"Cache flushed")


def test_pause_aborts_the_requests_in_flight_unless_asked_to_hold_them(engine: Engine) -> None:
    # SGLang 0.5.23: `/pause_generation {}` is mode `abort`, which aborts what is running; `in_place`
    # and `retract` keep it (here: it finishes, as this engine cannot hold a request mid-way).
    long = {"text": PROMPT, "sampling_params": {"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True}}
    events = engine.stream(**long)
    next(events)  # it is running
    assert engine.call("/pause_generation", {})[0] == 200
    last = [e for e in events if e != "[DONE]"][-1]
    assert last["meta_info"]["finish_reason"] == {"type": "abort", "matched": None,
                                                  "message": "aborted by /pause_generation"}
    assert engine.call("/continue_generation", {})[0] == 200

    short = {"text": PROMPT, "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}
    events = engine.stream(**short)
    next(events)
    assert engine.call("/pause_generation", {"mode": "in_place"})[0] == 200
    last = [e for e in events if e != "[DONE]"][-1]
    assert last["meta_info"]["finish_reason"]["type"] == "length" and len(last["output_ids"]) == 24
    assert engine.call("/continue_generation", {})[0] == 200
    status, r = engine.call("/pause_generation", {"mode": "later"})
    assert status == 400 and "in_place" in r["error"]["message"]
    assert len(engine.generate(**short)["output_ids"]) == 24  # served after an abort-mode pause, too


def test_a_burst_of_clients_connecting_while_the_engine_cannot_accept_all_get_in(engine: Engine) -> None:
    import select
    import socket

    host, port = engine.url.removeprefix("http://").split(":")
    n = 64
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    # Stopped, the engine accepts nothing: the kernel completes as many handshakes as the listen
    # backlog holds and drops the rest (socketserver's default backlog, 5, held 6).
    engine.proc.send_signal(signal.SIGSTOP)
    try:
        for s in socks:
            s.setblocking(False)
            s.connect_ex((host, int(port)))
        connected: set[socket.socket] = set()
        deadline = time.monotonic() + 2.0
        while len(connected) < n and time.monotonic() < deadline:
            _, writable, _ = select.select([], [s for s in socks if s not in connected], [], 0.1)
            connected.update(s for s in writable if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
    finally:
        engine.proc.send_signal(signal.SIGCONT)
    try:
        assert len(connected) == n
        for s in socks:
            s.setblocking(True)
            s.settimeout(60)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: e\r\nConnection: close\r\n\r\n")
        for s in socks:
            assert s.makefile("rb").readline().split()[1] == b"200"
    finally:
        for s in socks:
            s.close()


def _same_outputs(batched: dict[str, Any], alone: dict[str, Any]) -> None:
    """Tokens, text and finish equal; logprobs and top-K equal up to float rounding (another batch
    shape sums in another order)."""
    assert batched["output_ids"] == alone["output_ids"]
    assert batched["text"] == alone["text"]
    got, want = batched["meta_info"], alone["meta_info"]
    assert got["finish_reason"] == want["finish_reason"]
    if want["output_token_logprobs"] is None:
        assert got["output_token_logprobs"] is None
        return
    for (a, ida, _), (b, idb, _) in zip(got["output_token_logprobs"], want["output_token_logprobs"], strict=True):
        assert ida == idb and abs(a - b) < 1e-5
    for row_a, row_b in zip(got["output_top_logprobs"], want["output_top_logprobs"], strict=True):
        assert [x[1] for x in row_a] == [x[1] for x in row_b]
        assert all(abs(x[0] - y[0]) < 1e-5 for x, y in zip(row_a, row_b))


def _concurrently(engine: Engine, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    replies: list[Any] = [None] * len(bodies)

    def one(i: int) -> None:
        replies[i] = engine.call("/generate", bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(r is not None and r[0] == 200 for r in replies), replies
    return [r[1] for r in replies]


def test_a_request_gets_the_same_output_alone_and_inside_a_busy_batch(engine: Engine) -> None:
    probes = [
        {"text": PROMPT, "return_logprob": True, "top_logprobs_num": 3,
         "sampling_params": {"max_new_tokens": 12, "temperature": 0.9, "top_p": 0.8, "sampling_seed": 5}},
        {"input_ids": list(range(30, 34)), "return_logprob": True, "top_logprobs_num": 2,
         "sampling_params": {"max_new_tokens": 10, "temperature": 1.1, "top_k": 20, "sampling_seed": 6,
                             "ignore_eos": True}},
        {"text": PROMPT, "return_logprob": True, "sampling_params": {"max_new_tokens": 9, "temperature": 0}},
        # Seeded by (--seed, rid), not by sampling_seed.
        {"text": PROMPT, "rid": "probe-rid", "sampling_params": {"max_new_tokens": 11, "temperature": 1.0}},
    ]
    alone = [engine.generate(**p) for p in probes]
    # Company of other lengths (one longer, one shorter than the probes' prompts) and other sampling,
    # generating all along: each has sent its first event before the probes arrive.
    long_prompt = PROMPT.replace("What is 12 + 7?", "Count the apples: " + "one apple, " * 20)
    company = [
        {"text": long_prompt, "sampling_params": {"temperature": 0}},
        {"text": "Hi", "sampling_params": {"temperature": 1.3, "top_k": 5}},
        {"text": PROMPT, "sampling_params": {"temperature": 0.7, "top_p": 0.5}},
    ]
    streams = [engine.stream(**{**c, "return_logprob": True, "top_logprobs_num": 4, "sampling_params": {
        **c["sampling_params"], "max_new_tokens": 3000, "ignore_eos": True}}) for c in company]
    try:
        for s in streams:
            assert next(s)["meta_info"]["finish_reason"] is None
        for batched, ref in zip(_concurrently(engine, probes), alone):
            _same_outputs(batched, ref)
    finally:
        for s in streams:
            s.close()  # the client leaves: its row ends


def _wait_for_log(engine: Engine, text: str) -> None:
    deadline = time.monotonic() + 60
    while text not in engine.log_path.read_text():
        assert time.monotonic() < deadline, f"the engine never logged {text!r}"
        time.sleep(0.05)


def test_a_weight_update_waits_for_the_running_batch_and_requests_sent_meanwhile_wait_for_it(
        models: tuple[Path, Path], tmp_path: Path) -> None:
    with launch(models[0], tmp_path / "swap.log", "--weight-version", "v0") as eng:
        bodies = [{"text": PROMPT, "sampling_params": {"temperature": 0.9, "sampling_seed": i, "ignore_eos": True}}
                  for i in range(3)]
        before = [eng.generate(**{**b, "sampling_params": {**b["sampling_params"], "max_new_tokens": 20}})
                  for b in bodies]
        streams = [eng.stream(**{**b, "sampling_params": {**b["sampling_params"], "max_new_tokens": 3000}})
                   for b in bodies]
        try:
            for s in streams:  # all three are generating
                assert next(s)["meta_info"]["finish_reason"] is None
            update: dict[str, Any] = {}
            updater = threading.Thread(target=lambda: update.update(zip(("status", "reply"), eng.call(
                "/update_weights_from_disk", {"model_path": str(models[1]), "weight_version": "v1"}))))
            updater.start()
            _wait_for_log(eng, "weight swap waits for")
            # Sent while the swap waits: it must not start on the old weights.
            probe: dict[str, Any] = {}
            prober = threading.Thread(target=lambda: probe.update(eng.generate(
                text=PROMPT, sampling_params={"max_new_tokens": 8, "temperature": 0})))
            prober.start()
            for s, ref in zip(streams, before):
                event = next(e for e in s if len(e["output_ids"]) >= 20)
                # Still the old weights, token for token, and the reply says so.
                assert event["output_ids"][:20] == ref["output_ids"]
                assert event["meta_info"]["weight_version"] == "v0"
        finally:
            for s in streams:
                s.close()  # the clients leave; the batch drains and the swap can go
        updater.join(120)
        prober.join(120)
        assert update["status"] == 200 and update["reply"]["weight_version"] == "v1", update
        after = eng.generate(text=PROMPT, sampling_params={"max_new_tokens": 8, "temperature": 0})
        assert probe["meta_info"]["weight_version"] == after["meta_info"]["weight_version"] == "v1"
        assert probe["output_ids"] == after["output_ids"]


def test_a_bf16_engine_serves_near_fp32_logprobs_and_casts_loaded_weights_to_bf16(
        models: tuple[Path, Path], tmp_path: Path) -> None:
    body = {"text": PROMPT, "return_logprob": True, "top_logprobs_num": 3,
            "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    with launch(models[0], tmp_path / "bf16.log", "--dtype", "bf16") as eng:
        first = eng.generate(**body)
        lp, _ = recompute(models[0], prompt_ids(models[0]), first["output_ids"], temperature=0.0)
        gaps = [abs(e[0] - float(lp[t, e[1]])) for t, e in enumerate(first["meta_info"]["output_token_logprobs"])]
        # bf16 weights: near the fp32 numbers, not equal to them.
        assert 1e-4 < max(gaps) < 0.1, gaps
        for path in (models[1], models[0]):  # fp32 checkpoints, loaded into the bf16 model
            status, r = eng.call("/update_weights_from_disk", {"model_path": str(path), "weight_version": None})
            assert status == 200 and r["success"], r
        again = eng.generate(**body)
        assert again["output_ids"] == first["output_ids"]
        assert again["meta_info"]["output_token_logprobs"] == first["meta_info"]["output_token_logprobs"]


def test_openmp_threads_wait_passively_unless_the_environment_says_otherwise() -> None:
    # Read by libgomp once, when torch loads: the server module sets it before importing torch.
    code = "import os; import reef_shim.engines.hf_server; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = str(SHIM)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "PASSIVE"
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "ACTIVE"


def test_threads_are_one_for_a_tiny_model_and_one_per_cpu_for_a_large_one_whatever_ray_set() -> None:
    from reef_shim.engines.hf_server import choose_threads

    assert choose_threads(None, 1_000_000, 2) == 1
    assert choose_threads(None, 135_000_000, 2) == 2  # not torch's 1 under Ray's OMP_NUM_THREADS=1
    assert choose_threads(3, 135_000_000, 2) == 3
    assert choose_threads(None, 135_000_000, 0) == 1


def test_with_an_admin_key_only_generation_and_the_info_routes_are_open(models: tuple[Path, Path], tmp_path: Path) -> None:
    # Whatever runs on the machine reaches the port: a weight load from its own path, or a pause,
    # must take the stack's key.
    key_file = tmp_path / "engine-admin.key"
    key_file.write_text("s3cret-admin-key\n")
    key_file.chmod(0o600)
    with launch(models[0], tmp_path / "engine.log", "--weight-version", "v0",
                env_extra={"REEF_ENGINE_ADMIN_KEY_FILE": str(key_file)}) as e:
        for path, body in (("/update_weights_from_disk", {"model_path": str(models[1]), "weight_version": "evil"}),
                           ("/pause_generation", {}), ("/flush_cache", {}), ("/release_memory_occupation", {}),
                           ("/init_weights_update_group", {"master_address": "203.0.113.9", "master_port": 1,
                                                          "rank_offset": 1, "world_size": 2})):
            for key in (None, "wrong"):
                status, reply = e.call(path, body, key=key)
                assert (status, reply["error"]["code"]) == (401, "REEF_ERR_UNAUTHORIZED"), (path, key, reply)
        assert e.call("/model_info")[1]["weight_version"] == "v0"
        assert e.generate(text=PROMPT, sampling_params={"max_new_tokens": 2, "temperature": 0})["meta_info"]
        status, reply = e.call("/pause_generation", {}, key="s3cret-admin-key")
        assert status == 200 and reply["success"] is True
        assert e.call("/continue_generation", {}, key="s3cret-admin-key")[0] == 200
