"""The `hf` engine: a CPU inference server on transformers speaking Reef's SGLang subset.

    python -m reef_shim.engines.hf_server --model-path DIR --host 127.0.0.1 --port P
        [--weight-version V] [--seed S] [--max-running N] [--max-batch B] [--dtype fp32|bf16]
        [--threads T] [--weight-sync-timeout-s S] [--scripted-outputs FILE]

Routes (docs/internals.md, "Engine HTTP API"): `POST /generate`, `GET /health`,
`GET /model_info` (also `/get_model_info`), `GET /get_server_info` (tp_size and device only),
`POST /update_weights_from_disk`,
`POST /init_weights_update_group`, `POST /update_weights_from_distributed`,
`POST /destroy_weights_update_group`, `POST /pause_generation`, `POST /continue_generation`,
`POST /flush_cache` (answered in plain text, as SGLang does).

Behaviour a client can rely on:
- Continuous batching (`scheduler.py`): one model thread decodes every running request in one
  forward per token (KV-cached, `torch.inference_mode`); a new request joins the batch between two
  steps (its prompt prefilled alone), a finished one leaves. At most `--max-batch` (32) run at
  once, the others queue; at most `--max-running` (256) are admitted, queued or running (more → 503
  `REEF_ERR_ENGINE_DOWN`, retryable). `--dtype bf16` holds the weights in bf16 (default fp32);
  logits are cast to fp32 before any softmax.
- Everything below holds per request, whatever else is in the batch: a request's tokens and
  logprobs are those it gets alone (logprobs up to float rounding, ~1e-6).
- Sampling and logprobs: see `sampling.py`. The reported logprob and top-K are SGLang's:
  `log_softmax(logits / temperature)` before top-k / top-p (a temperature below 1e-6 = greedy,
  reporting `log_softmax(logits)`), so every top-K entry is finite; `tempered_logprobs` recomputes
  them from (prompt, output). The token itself is drawn from the truncated distribution
  (temperature, then top-k, then top-p, renormalised: `sampling_logprobs`). SGLang parameters it
  does not implement (min_p, penalties, n, grammars...) are 400 unless they hold the value that
  changes nothing (`request.UNIMPLEMENTED`).
- Randomness: each request gets its own `torch.Generator`, seeded by `sampling_params.sampling_seed`
  when given, else by sha256(f"{--seed}:{rid}") when the server has a seed and the client a rid,
  else randomly. So (seed, rid, weights, prompt, params) fixes the output, batch or not.
- Finishing: a stop token (`stop_token_ids` and the model's eos ids; `ignore_eos` turns both off,
  as SGLang) ends with `{type: 'stop', matched: <id>}`; the token is in `output_ids` and its
  logprobs, not in `text`. A stop string ends with `matched: <string>` and `text` cut before it.
  `max_new_tokens` (clipped to the context) ends with `length`, checked last as SGLang 0.5.23 does
  (stop string, stop token, length): a stop token or string completed by the last token allowed
  ends with `stop`; a client that disconnects or a server that stops ends it with `abort` and a `message`
  saying which, as SGLang's abort carries one (on SIGTERM the
  server waits up to 8 s for those answers before it exits; a request still queued gets 503).
  `text` is decoded without special tokens.
- Streaming (`stream: true`): SSE events `data: {<full reply shape>}` whose `text`, `output_ids`
  and logprob lists are cumulative (the whole output so far, as SGLang's native API), with
  `finish_reason` null until the last event, then `data: [DONE]`. An event is held back while the
  text ends inside a UTF-8 character or a possible stop string, so `text` never shrinks. A failure
  after the first event ends the stream with `data: {error: {message, code}}`, then `[DONE]`.
- A client that closes its connection (streaming or not) is noticed between tokens: its request
  ends there (or does not start, if it was queued) and the engine moves on.
- Pause: `/pause_generation` makes new `/generate` calls wait (they are not failed) until
  `/continue_generation`. As in SGLang 0.5.23, its default `mode: "abort"` ends the requests in
  flight (`finish_reason {type: abort, message: "aborted by /pause_generation"}`; one still queued
  gets 503); `in_place` and `retract` keep them in SGLang, and here let them finish, as this engine
  cannot hold a request mid-way. `/health` stays 200 while paused (SGLang's does too, launched with
  `SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0`, as Reef launches it).
- Scripted outputs (`--scripted-outputs FILE`, `scripted.py`): a stand-in for a policy in
  examples and tests. A sampled request whose prompt matches a rule gets one of its replies, forced
  token by token (then the end-of-turn token), with the model's own logprobs and top-K for each
  forced token; greedy requests and prompts no rule matches are generated as usual.
- Weights: every request's tokens come from one weight version, the `weight_version` of its reply.
  `/update_weights_from_disk {model_path, weight_version}` loads and checks the safetensors of a
  same-shaped checkpoint, then waits until no request is generating (the running batch drains;
  new requests wait meanwhile), swaps them in (cast to `--dtype`), and admission resumes. It
  answers `{success, message, weight_version}` (400 with `success: false` and nothing changed when
  the checkpoint does not fit).
- The distributed update is SGLang's protocol over gloo (`engines/dist_weights.py`): join a weight
  group as rank `rank_offset`, then receive the announced tensors from rank 0. Tensors are received
  while requests keep generating and swapped in as a disk update's are; a broken or
  refused transfer answers 400 `success: false` and leaves the weights that were serving. `nccl`
  is refused (the weights live on the CPU). `--weight-sync-timeout-s` (300) bounds the join and
  each transfer.
- Up to 1024 connections wait to be accepted (the listen backlog), so a burst of clients
  connecting at once all get in.
- Threads: `--threads`, else 1 under 50M parameters and one per usable CPU above; OpenMP
  threads wait passively (`OMP_WAIT_POLICY=PASSIVE` unless the environment sets it).
- Errors: `{error: {message, code}}` with a Reef code; 400 for a bad request, an input at or
  past the context length, or a `rid` of a request still in flight (as SGLang), 413 for a body
  over 64 MiB, 503 while loading. A body is read by Content-Length or chunked; one that cannot
  be read closes the connection after the error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from http.server import ThreadingHTTPServer
from typing import Any

# Read once, when torch loads its OpenMP runtime (libgomp), so set before the imports below. By
# default its threads spin between parallel regions; on a busy machine (the trainer, gateway and
# tests share the two cores with the engine) a spinning or descheduled thread stalls every
# matmul: SmolLM2 at 4 concurrent requests with one other process busy gave 4.8 tokens/s with 2
# spinning threads, 53 tokens/s with them passive, as with 1 thread. An explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .admin_key import admin_key  # noqa: E402
from .http_handler import EngineHandler, ServerState  # noqa: E402
from .sampling import sampling_logprobs, tempered_logprobs  # noqa: E402

# The choices of --dtype (hf_engine.DTYPES, which needs transformers, imported once /health answers).
DTYPES = ("bf16", "fp32")

log = logging.getLogger("reef_shim.hf_server")


class EngineHTTPServer(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: 32 clients connecting at once overflowed it while
    # the model thread was busy, and the kernel reset one of the connections it had dropped.
    request_queue_size = 1024
    daemon_threads = True

# How long a stopping server waits for the requests in flight to answer `abort`.
STOP_GRACE_S = 8.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m reef_shim.engines.hf_server", description="Reef's CPU engine")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port (see the ready line)")
    p.add_argument("--weight-version", default="default")
    p.add_argument("--seed", type=int, default=None, help="server seed for per-request RNGs")
    p.add_argument("--max-running", type=int, default=256, help="requests admitted at once, queued or running")
    p.add_argument("--max-batch", type=int, default=32, help="requests generating at once, in one batch")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="the weights' dtype")
    p.add_argument("--max-loaded-adapters", type=int, default=8,
                   help="LoRA adapters held in memory at once; more registered ones are read back on demand")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: 1 for models under 50M parameters, else one per CPU "
                        "this process may use)")
    p.add_argument("--weight-sync-timeout-s", type=float, default=300.0,
                   help="how long a weight group join or transfer may wait for its peer")
    p.add_argument("--scripted-outputs", default=None,
                   help="a JSON script of replies forced on matching sampled requests (scripted.py): a stand-in "
                        "for a policy, for examples and tests; greedy requests are never scripted")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    if args.max_batch < 1:
        p.error("--max-batch must be at least 1")
    return args


def choose_threads(requested: int | None, params: int, cpus: int) -> int:
    """Intra-op threads: `--threads` if given; 1 for a model under 50M parameters (it decodes a
    token in well under a millisecond, and thread hand-offs then cost more than they save:
    measured ~10x slower with 2 threads on the tiny model); else one per usable CPU, which is
    torch's own default except under Ray: its workers get OMP_NUM_THREADS=1 (num_cpus below 1),
    and the engine, started from one, inherited that."""
    if requested is not None:
        return requested
    return 1 if params < 50_000_000 else max(1, cpus)


def _set_threads(threads: int | None, engine: Any) -> None:
    import torch

    params = sum(p.numel() for p in engine.model.parameters())
    torch.set_num_threads(choose_threads(threads, params, len(os.sched_getaffinity(0))))


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    state = ServerState(max_running=args.max_running)
    httpd = EngineHTTPServer((args.host, args.port), EngineHandler)
    httpd.state = state  # type: ignore[attr-defined]
    # From a file the environment names, not argv: /proc/<pid>/cmdline is world-readable.
    httpd.admin_key = admin_key()  # type: ignore[attr-defined]
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        state.stopping.set()
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Serve /health (503) while the model loads, so a launcher can tell "loading" from "dead".
    serving = threading.Thread(target=httpd.serve_forever, name="http", daemon=True)
    serving.start()
    host, port = httpd.server_address[:2]
    log.info("listening on http://%s:%d, loading %s", host, port, args.model_path)
    try:
        from .hf_engine import HFEngine

        from .scripted import Script

        script = Script.load(args.scripted_outputs) if args.scripted_outputs else None
        engine = HFEngine(args.model_path, weight_version=args.weight_version, seed=args.seed,
                          weight_sync_timeout_s=args.weight_sync_timeout_s, dtype=args.dtype, script=script,
                          max_loaded_adapters=args.max_loaded_adapters)
        if script is not None:
            log.warning("scripted outputs from %s: %d rule(s) answer matching sampled requests; greedy ones are the "
                        "model's own", args.scripted_outputs, len(script.rules))
        _set_threads(args.threads, engine)
        engine.start(args.max_batch)
        state.engine = engine
    except Exception:
        log.exception("cannot load %s", args.model_path)
        httpd.shutdown()
        return 1
    url = f"http://{host}:{port}"
    print(json.dumps({"event": "ready", "url": url, "pid": os.getpid()}), flush=True)
    log.info("ready at %s (weight_version %s, %s, batches of up to %d, %d threads)", url, args.weight_version,
             args.dtype, args.max_batch, torch_threads())
    while not stop.wait(0.5):
        pass
    state.release_waiters()
    # The handler threads are daemons, gone when this returns: let the requests in flight send
    # their `abort` first (within the shim's 10 s SIGTERM grace).
    if not state.wait_idle(STOP_GRACE_S):
        log.warning("stopping with requests still in flight after %.0f s", STOP_GRACE_S)
    if engine.scheduler is not None:
        engine.scheduler.close()
    httpd.shutdown()
    httpd.server_close()
    log.info("stopped")
    return 0


__all__ = ["main", "sampling_logprobs", "tempered_logprobs"]

if __name__ == "__main__":
    sys.exit(main())
