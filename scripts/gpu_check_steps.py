"""The steps of `gpu_check.py`, each run as a subprocess of its own, and the peer processes they start.

    python gpu_check_steps.py STEP RESULT OPTIONS_JSON     # a step: 0, 1a, 1b, 2, 3, 4, 5
    python gpu_check_steps.py ROLE ARGS...                 # fake-engine, gloo-receiver, ipc-receiver

A step notes what it sees into RESULT as it goes (`{observed, outcome}`, rewritten whole each time),
so a step killed by the driver's timeout, or one that hangs and is shot by its own watchdog, still
says how far it got. Imports: the standard library, torch, transformers (through reef_shim) and
safetensors; reef_shim modules only where they need nothing more (`trainer.weight_push`,
`weight_group`, `engine_process`; steps 4 and 5, in `gpu_check_train.py`: `trainer.rank`/`scoring`/`loss`,
`engines`, `tiny_model`).
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python_shim")]
sys.path.append(str(ROOT))  # recipes/ imports as a top-level package
STARTED = time.monotonic()
REFUSAL = "gpu-check: this fake engine refuses the update without broadcasting"
# (vocab, hidden, layers, heads, kv heads, head dim, intermediate): published Qwen3-0.6B, and a tiny one.
SHAPES = {"qwen3-0.6b": (151_936, 1024, 28, 16, 8, 128, 3072), "tiny": (2048, 64, 2, 4, 2, 16, 128)}


class Recorder:
    def __init__(self, path: Path) -> None:
        self.path, self.observed, self.lock = path, {}, threading.Lock()
        self._write(None)

    def note(self, **values: Any) -> None:
        with self.lock:
            self.observed.update(values)
            self._write(None)
        print(f"[{time.monotonic() - STARTED:6.1f} s] {json.dumps(values, default=str)[:2000]}", flush=True)

    def finish(self, status: str, line: str, reason: str | None = None) -> None:
        with self.lock:
            self._write({"status": status, "line": line, "reason": reason})

    def _write(self, outcome: dict[str, Any] | None) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"observed": self.observed, "outcome": outcome}, default=str))
        os.replace(tmp, self.path)


def time_left(opts: dict[str, Any]) -> float:
    """Seconds this step has before the driver kills it, less a margin to say why."""
    return opts["budget_s"] - (time.monotonic() - STARTED) - 3.0


def watchdog(rec: Recorder, seconds: float, what: str) -> Callable[[], None]:
    """Shoot this process if the caller has not called the returned function within `seconds`,
    after noting the hang and every thread's stack: a hang here is a finding, not a crashed check."""

    def fire() -> None:
        frames = sys._current_frames()
        stacks = {t.name: traceback.format_stack(frames[t.ident])[-3:] for t in threading.enumerate()
                  if t.ident in frames}
        rec.note(hung=f"{what} within {seconds:.0f} s", stacks=stacks)
        faulthandler.dump_traceback(all_threads=True)
        rec.finish("failed", f"{what} within {seconds:.0f} s (shot by its own watchdog)")
        os._exit(3)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer.cancel


def spawn(role: str, *args: str, **popen: Any) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), role, *args], **popen)


def read_port(proc: subprocess.Popen, timeout_s: float) -> int:
    """The `port N` line a peer prints once it serves; fails if it died or stayed silent."""
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not line or not line[0].startswith("port "):
        raise RuntimeError(f"the peer printed no port in {timeout_s:.0f} s (exit {proc.poll()}, {line!r})")
    return int(line[0].split()[1])


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def digest(t: Any) -> str:
    import torch

    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy()).hexdigest()


def digests(tensors: list[Any]) -> list[str]:
    with ThreadPoolExecutor(8) as pool:  # hashlib lets go of the GIL on large buffers
        return list(pool.map(digest, tensors))


def qwen3_layout(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """A Qwen3 state dict's names and shapes (tied: no lm_head)."""
    vocab, h, layers, heads, kv, hd, inter = SHAPES[shape]
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,)), (p + "self_attn.q_proj.weight", (heads * hd, h)),
                (p + "self_attn.k_proj.weight", (kv * hd, h)), (p + "self_attn.v_proj.weight", (kv * hd, h)),
                (p + "self_attn.o_proj.weight", (h, heads * hd)), (p + "self_attn.q_norm.weight", (hd,)),
                (p + "self_attn.k_norm.weight", (hd,)), (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h)),
                (p + "mlp.down_proj.weight", (h, inter))]
    return out + [("model.norm.weight", (h,))]


# ---- 0: the environment ------------------------------------------------------------------------

def step_env(rec: Recorder, opts: dict[str, Any]) -> tuple[bool, str]:
    import importlib
    import importlib.util
    import platform

    t0 = time.monotonic()
    import torch
    import transformers

    rec.note(python=platform.python_version(), torch=torch.__version__, torch_cuda=torch.version.cuda,
             transformers=transformers.__version__, import_s=round(time.monotonic() - t0, 1), cpus=os.cpu_count())
    modules: dict[str, str | None] = {}
    for name in ("safetensors", "numpy", "tokenizers", "ray", "zmq", "msgpack", "pytest", "sglang"):
        try:
            modules[name] = str(getattr(importlib.import_module(name), "__version__", "?")) \
                if importlib.util.find_spec(name) else None
        except Exception as e:  # installed but broken: say so
            modules[name] = f"import failed: {type(e).__name__}: {e}"
    env = {k: v for k, v in os.environ.items() if k.startswith(("TORCH_NCCL", "NCCL_", "CUDA_VISIBLE"))}
    rec.note(modules=modules, env=env)
    try:
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        rec.note(nvidia_smi=(smi.stdout or smi.stderr).strip().splitlines())
    except (OSError, subprocess.TimeoutExpired) as e:
        rec.note(nvidia_smi=f"{type(e).__name__}: {e}")
    cuda = torch.cuda.is_available()
    rec.note(cuda_available=cuda)
    if not cuda:
        return opts["device"] == "cpu", f"torch {torch.__version__}, no CUDA device"
    nccl = torch.cuda.nccl.version()
    free, total = torch.cuda.mem_get_info(0)
    rec.note(nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
             devices=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
             free_gib=round(free / 2**30, 1), total_gib=round(total / 2**30, 1))
    return True, (f"torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.cuda.get_device_name(0)}, "
                  f"{free / 2**30:.0f} of {total / 2**30:.0f} GiB free")


# ---- 1a / 1b: the pusher's failure paths against a fake engine ----------------------------------

def fake_engine(mode: str, device: str) -> None:
    """SGLang's weight routes for one GPU, as far as the pusher sees them: joins the group lazily
    (no collective, so NCCL never sees two ranks on one GPU) and never broadcasts. `refuse`: the
    update is answered 400 at once; `silent`: it is accepted and never answered."""
    import torch

    from reef_shim.weight_group import join_group

    if device == "cuda":
        torch.cuda.set_device(0)
    groups: dict[str, Any] = {}
    calls: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:
            print(f"[fake-engine] {fmt % args}", file=sys.stderr, flush=True)

        def answer(self, status: int, body: dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            if self.path in ("/server_info", "/get_server_info"):
                self.answer(200, {"tp_size": 1, "device": device})
            elif self.path == "/_calls":
                self.answer(200, {"calls": calls})
            else:
                self.answer(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            route = self.path.strip("/")
            calls.append(route)
            if route == "init_weights_update_group":
                groups[body["group_name"]] = join_group(
                    body["master_address"], body["master_port"], body["rank_offset"], body["world_size"],
                    body["group_name"], body["backend"], 120)
                self.answer(200, {"success": True, "message": "Succeeded to initialize custom process group."})
            elif route in ("begin_weight_update", "end_weight_update", "destroy_weights_update_group"):
                self.answer(200, {"success": True, "message": "Success"})
            elif route == "update_weights_from_distributed" and mode == "refuse":
                self.answer(400, {"success": False, "message": REFUSAL})
            elif route == "update_weights_from_distributed":
                threading.Event().wait()  # accepted: never broadcasts, never answers
            else:
                self.answer(404, {"detail": "Not Found"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


def hold(rec: Recorder, device: str, backend: str, hold_s: float) -> bool:
    """After the push: a matmul every 5 s for `hold_s` (torch's NCCL watchdog would tear the process
    down in that time if work were left behind; the group's timeout is the push's), then a fresh
    world-1 group and an all_reduce over it."""
    import torch
    import torch.distributed as dist

    from reef_shim.engine_process import pick_free_port
    from reef_shim.weight_group import join_group

    ticks: list[dict[str, Any]] = []
    start = time.monotonic()
    while True:
        x = torch.randn(512, 512, device=device)
        fine = bool(torch.isfinite((x @ x).sum()))
        sync(device)
        stuck = any(t.name == "weight-push-broadcast" and t.is_alive() for t in threading.enumerate())
        ticks.append({"t": round(time.monotonic() - start, 1), "matmul": fine, "broadcast_thread_alive": stuck})
        rec.note(health=ticks)
        left = hold_s - (time.monotonic() - start)
        if left <= 0:
            break
        time.sleep(min(5.0, left))
    done = watchdog(rec, 30, f"a fresh world-1 {backend} group and its all_reduce did not return")
    group = join_group("127.0.0.1", pick_free_port("127.0.0.1"), 0, 1, f"gpu-check-{uuid.uuid4().hex[:8]}",
                       backend, 30)
    t = torch.ones(4, device=device)
    dist.all_reduce(t, group=group)
    sync(device)
    done()
    reduced = t.tolist() == [1.0] * 4
    rec.note(fresh_all_reduce=reduced)
    return reduced and all(tick["matmul"] for tick in ticks)


def step_push(rec: Recorder, opts: dict[str, Any], mode: str) -> tuple[bool, str]:
    import torch

    from reef_shim.engine_process import pick_free_port
    from reef_shim.trainer.weight_push import (CLOSE_TIMEOUT_S, WeightPusher, WeightPushError, engine_server_info,
                                               push_backend)

    device, timeout_s = opts["device"], float(opts["push_timeout_s"])
    if device == "cuda":
        torch.cuda.set_device(0)
    engine = spawn("fake-engine", mode, device, stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{read_port(engine, 60)}"
        info = engine_server_info(url)
        backend = push_backend(device, info.get("device"))
        rec.note(engine_info=info, backend=backend, timeout_s=timeout_s)
        pusher = WeightPusher(url, backend, ("127.0.0.1", pick_free_port("127.0.0.1")), int(info.get("tp_size") or 1),
                              timeout_s=timeout_s)
        t0 = time.monotonic()
        pusher.connect()
        rec.note(connect_s=round(time.monotonic() - t0, 2))
        tensors = [("model.a.weight", torch.randn(64, 64, device=device)), ("model.b.weight", torch.randn(128, device=device))]
        # 1a should raise at once; 1b within timeout_s. The pusher promises timeout_s + 2 × CLOSE_TIMEOUT_S.
        bound = 30.0 if mode == "refuse" else timeout_s + 2 * CLOSE_TIMEOUT_S + 5
        done = watchdog(rec, bound, "push() and close() did not return")
        t0 = time.monotonic()
        raised: BaseException | None = None
        try:
            pusher.push(tensors, "v1")
        except Exception as e:  # what it raises is the observation
            raised = e
        push_s = time.monotonic() - t0
        rec.note(push_s=round(push_s, 2), push=f"{type(raised).__name__}: {raised}" if raised else "returned")
        t0 = time.monotonic()
        pusher.close()
        done()
        rec.note(close_s=round(time.monotonic() - t0, 2))
        healthy = hold(rec, device, backend, float(opts["hold_s"]))
        with urllib.request.urlopen(f"{url}/_calls", timeout=10) as r:
            rec.note(engine_calls=json.loads(r.read())["calls"])
    finally:
        engine.kill()
    limit = 5.0 if mode == "refuse" else timeout_s + 5.0
    carried = mode != "refuse" or REFUSAL in str(raised)
    ok = isinstance(raised, WeightPushError) and push_s <= limit and carried and healthy
    what = f"raised {type(raised).__name__}" if raised else "returned"
    return ok, (f"{backend}: push {what} after {push_s:.1f} s (limit {limit:.0f} s"
                f"{'' if carried else ', without the engine message'}); healthy {opts['hold_s']:g} s after: {healthy}")


# ---- 2: gloo from the CPU into CUDA tensors ----------------------------------------------------

def gloo_receiver(port: str, shape: str, device: str, result: str) -> None:
    """Rank 1: receives every tensor of the layout into `device` tensors, as SGLang's single-GPU path does."""
    import torch

    from reef_shim.weight_group import broadcast, join_group

    if device == "cuda":
        torch.cuda.set_device(0)
    bufs = [torch.empty(s, dtype=torch.bfloat16, device=device) for _, s in qwen3_layout(shape)]
    group = join_group("127.0.0.1", int(port), 1, 2, "gpu-check-gloo", "gloo", 60)
    broadcast(torch.zeros(1), group).wait()  # both ranks are in: what follows is the transfer alone
    sync(device)
    t0 = time.monotonic()
    for work in [broadcast(t, group) for t in bufs]:
        work.wait()
    sync(device)
    receive_s = time.monotonic() - t0
    Path(result).write_text(json.dumps({"device": str(bufs[0].device), "receive_s": receive_s,
                                        "digests": digests(bufs)}))


def step_gloo(rec: Recorder, opts: dict[str, Any]) -> tuple[bool, str]:
    import torch

    from reef_shim.engine_process import pick_free_port
    from reef_shim.weight_group import broadcast, join_group

    torch.set_num_threads(int(opts["threads"]))
    device, layout = opts["device"], qwen3_layout(opts["shape"])
    port = pick_free_port("127.0.0.1")
    theirs = Path(opts["work"]) / "gloo-receiver.json"
    receiver = spawn("gloo-receiver", str(port), opts["shape"], device, str(theirs))
    try:
        t0 = time.monotonic()
        torch.manual_seed(0)
        tensors = [torch.empty(s, dtype=torch.bfloat16).uniform_(-1, 1) for _, s in layout]
        total = sum(t.numel() * t.element_size() for t in tensors)
        want = digests(tensors)
        rec.note(tensors=len(tensors), gb=round(total / 1e9, 3), make_and_hash_s=round(time.monotonic() - t0, 1))
        t0 = time.monotonic()
        group = join_group("127.0.0.1", port, 0, 2, "gpu-check-gloo", "gloo", 60)
        broadcast(torch.zeros(1), group).wait()
        rec.note(join_s=round(time.monotonic() - t0, 1))
        t0 = time.monotonic()
        for work in [broadcast(t, group) for t in tensors]:
            work.wait()
        rec.note(send_s=round(time.monotonic() - t0, 2))
        rc = receiver.wait(max(5.0, time_left(opts)))
    finally:
        receiver.kill()
    got = json.loads(theirs.read_text())
    wrong = [name for (name, _), a, b in zip(layout, want, got["digests"]) if a != b]
    rate = total / got["receive_s"] / 1e9
    # The push sends the engine's dtype (`push_dtype`): a 4B model in bf16 is 8.0 GB.
    rec.note(receiver_device=got["device"], receive_s=round(got["receive_s"], 2), gb_per_s=round(rate, 2),
             mismatched=wrong[:10], projected_4b_bf16_push_s=round(8.04 / rate, 1))
    ok = rc == 0 and not wrong and len(got["digests"]) == len(layout) and got["device"].startswith(device)
    return ok, (f"{total / 1e9:.2f} GB into {got['device']} in {got['receive_s']:.2f} s ({rate:.2f} GB/s), "
                f"{len(layout) - len(wrong)} of {len(layout)} tensors match")


# ---- 3: CUDA IPC between two processes on one GPU ----------------------------------------------

def ipc_receiver(result: str) -> None:
    """Opens the CUDA tensor pickled on stdin (its IPC handle), copies it into a tensor of its own."""
    import pickle

    import torch

    torch.cuda.set_device(0)
    torch.cuda.init()
    size = int.from_bytes(sys.stdin.buffer.read(8), "little")
    payload = sys.stdin.buffer.read(size)
    t0 = time.monotonic()
    shared = pickle.loads(payload)  # torch.multiprocessing.reductions.rebuild_cuda_tensor: opens the handle
    open_s = time.monotonic() - t0
    mine = torch.empty_like(shared)
    torch.cuda.synchronize()
    t0 = time.monotonic()
    mine.copy_(shared)
    torch.cuda.synchronize()
    copy_s = time.monotonic() - t0
    del shared  # the sender frees its tensor only once this process has let go of it
    torch.cuda.synchronize()
    Path(result).write_text(json.dumps({"open_s": open_s, "copy_s": copy_s, "digest": digest(mine),
                                        "device": str(mine.device)}))


def step_ipc(rec: Recorder, opts: dict[str, Any]) -> tuple[bool, str]:
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing  # noqa: F401  registers reduce_tensor for CUDA tensors with ForkingPickler

    torch.cuda.set_device(0)
    n = int(opts["ipc_gib"] * 2**30) // 2
    t = torch.empty(n, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
    torch.cuda.synchronize()
    want = digest(t)
    t0 = time.monotonic()
    payload = bytes(ForkingPickler.dumps(t))  # what SGLang's MultiprocessingSerializer sends for a CUDA tensor
    rec.note(gib=opts["ipc_gib"], handle_bytes=len(payload), pickle_s=round(time.monotonic() - t0, 3))
    theirs = Path(opts["work"]) / "ipc-receiver.json"
    receiver = spawn("ipc-receiver", str(theirs), stdin=subprocess.PIPE)
    try:
        receiver.stdin.write(len(payload).to_bytes(8, "little") + payload)
        receiver.stdin.close()
        rc = receiver.wait(max(5.0, time_left(opts)))
    finally:
        receiver.kill()
    end_to_end = time.monotonic() - t0
    got = json.loads(theirs.read_text())
    rate = t.numel() * 2 / got["copy_s"] / 1e9
    rec.note(open_s=round(got["open_s"], 3), copy_s=round(got["copy_s"], 4), gb_per_s=round(rate, 1),
             end_to_end_s=round(end_to_end, 1), match=got["digest"] == want, receiver_device=got["device"])
    ok = rc == 0 and got["digest"] == want
    return ok, (f"{opts['ipc_gib']:g} GiB: handle {len(payload)} B, opened in {got['open_s'] * 1e3:.0f} ms, copied "
                f"at {rate:.0f} GB/s; sha256 {'matches' if got['digest'] == want else 'DIFFERS'}")


STEP_FUNCS: dict[str, Callable[[Recorder, dict[str, Any]], tuple[bool, str]]] = {
    "0": step_env, "1a": lambda r, o: step_push(r, o, "refuse"), "1b": lambda r, o: step_push(r, o, "silent"),
    "2": step_gloo, "3": step_ipc,
    "4": lambda r, o: _train().step_trainer(r, o), "5": lambda r, o: _train().step_bench(r, o, time_left(o) - 5),
}


def _train() -> Any:
    import gpu_check_train  # beside this file (sys.path[0]); imports nothing from here

    return gpu_check_train
ROLES: dict[str, Callable[..., None]] = {"fake-engine": fake_engine, "gloo-receiver": gloo_receiver,
                                         "ipc-receiver": ipc_receiver}


def main(argv: list[str]) -> None:
    if argv[0] in ROLES:
        ROLES[argv[0]](*argv[1:])
        sys.stdout.flush()
        os._exit(0)  # as below: a peer's exit must not wait on its process group
    rec = Recorder(Path(argv[1]))
    try:
        ok, line = STEP_FUNCS[argv[0]](rec, json.loads(argv[2]))
        rec.finish("ok" if ok else "failed", line)
    except Exception as e:
        rec.note(error=traceback.format_exc(limit=12))
        rec.finish("failed", f"{type(e).__name__}: {str(e)[:300]}")
    print(f"[gpu-check] step {argv[0]} done", flush=True)
    sys.stderr.flush()
    # Not a normal exit: a thread stuck in NCCL (the finding of 1a/1b) can hang the interpreter's exit.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
