"""Rank 0 of a weight update group, driven line by line, for the engine conformance suite
(`test/engine/conformance.ts`): the test makes the engine's HTTP calls itself and this process
does the trainer's half of the collectives, so the suite sees each endpoint's answer.

    python weight_rank0.py --model-path DIR_OR_HUB_ID --out DIR --backend gloo|nccl [--seed S]

At start it writes to `--out` a copy of the model whose floating-point tensors carry seeded noise
(the config and tokenizer files copied unchanged), so a disk load of `--out` serves exactly the
weights this process sends. Then it prints
    {"event": "ready", "names": [...], "dtypes": [...], "shapes": [...]}
and reads JSON commands from stdin, answering each with one JSON line:
    {"op": "listen", "world_size": W, "group_name": G}
        → {"event": "listening", "master_address", "master_port"}, and once the engine joined
          → {"event": "joined"}
    {"op": "send", "count": N | null}   broadcast the first N tensors (all when null) → {"event": "sent", "count"}
    {"op": "leave"}                    → {"event": "left"}
A command that fails answers {"event": "error", "op", "message"}. The process ends at EOF on stdin.
With `nccl` the tensors go out from CUDA device 0 of this process, which must not be the engine's
(NCCL refuses two ranks of one group on the same GPU).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from reef_shim.engine_process import pick_free_port
from reef_shim.engines.weights import safetensors_files
from reef_shim.weight_group import broadcast, dtype_name, join_group, leave_group

HOST = "127.0.0.1"


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def model_dir(path: str) -> Path:
    if Path(path).is_dir():
        return Path(path)
    # A hub id (what SGLang accepts): the copy it downloaded, without going online.
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path, local_files_only=True))


def perturbed_copy(src: Path, out: Path, seed: int) -> list[tuple[str, torch.Tensor]]:
    """Write `src` with noise on every floating tensor to `out`; returns the new tensors in file order."""
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    gen = torch.Generator().manual_seed(seed)
    items: list[tuple[str, torch.Tensor]] = []
    for shard in safetensors_files(src):
        state = load_file(str(shard))
        for name in sorted(state):
            t = state[name]
            if t.is_floating_point():
                x = t.float()
                # Noise scaled to each tensor's size (norm weights are ones, projections ~0.02), so
                # every layer changes and nothing becomes NaN in low precision.
                x = x + 0.05 * (x.abs().mean() + 1e-3) * torch.randn(x.shape, generator=gen)
                state[name] = x.to(t.dtype).contiguous()
            items.append((name, state[name]))
        save_file(state, str(out / shard.name), metadata={"format": "pt"})
    return items


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--backend", choices=["gloo", "nccl"], required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=120.0)
    args = p.parse_args()

    items = perturbed_copy(model_dir(args.model_path), Path(args.out), args.seed)
    device = torch.device("cuda", 0) if args.backend == "nccl" else torch.device("cpu")
    say("ready", names=[n for n, _ in items], dtypes=[dtype_name(t.dtype) for _, t in items],
        shapes=[list(t.shape) for _, t in items])

    group: Any = None
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd.get("op")
        try:
            if op == "listen":
                port = pick_free_port(HOST)
                say("listening", master_address=HOST, master_port=port)
                group = join_group(HOST, port, 0, int(cmd["world_size"]), str(cmd["group_name"]), args.backend,
                                   args.timeout_s)
                say("joined")
            elif op == "send":
                if group is None:
                    raise RuntimeError("send before listen")
                count = len(items) if cmd.get("count") is None else int(cmd["count"])
                tensors = [t.to(device) for _, t in items[:count]]
                for work in [broadcast(t, group) for t in tensors]:
                    work.wait()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                say("sent", count=count)
            elif op == "leave":
                if group is not None:
                    leave_group(group)
                    group = None
                say("left")
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as e:  # reported to the test, which decides; the process stays usable
            say("error", op=op, message=f"{type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
