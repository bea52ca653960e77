"""Many LoRA adapters on the hf engine's one base, measured on this CPU (docs/benchmarks.md "LoRA adapters").

    PYTHONPATH=python_shim .venv/bin/python bench/lora_adapters.py --model .cache/smollm2-135m-instruct \\
        [--adapters 64] [--r 16] [--max-loaded 64] [--requests 20] [--tokens 16] [--threads 2]

`measure()` (what the bench suite calls; this prints its result as one JSON line) writes `--adapters`
PEFT adapter directories of rank `--r` on every linear layer of the decoder (q/k/v/o and the MLP),
with random non-zero weights (an adapter's cost does not depend on its values, and B = 0 would
leave a reader unsure the adapter ran at all), registers them with an `HFEngine` through
`load_lora_adapter`, and reports:

- `bytes_per_adapter`: the adapter tensors in memory over the number held, and the process's RSS
  growth per adapter over the same loads;
- `base_ms` / `adapter_ms` (p50, p90): one request of `--tokens` greedy tokens on the base alone and
  on an adapter, interleaved in one run, each in the engine's single-request path;
- `swap`: with `--max-loaded` below `--adapters`, requests cycling through every adapter, so that
  each one evicts the least recently used and reads its own back from disk: the read time per
  swap, and the request latency with a swap against one without;
- with `--train-steps N`, `train`: one trainer rank (gloo, this process, `--threads`) stepping a
  4-turn batch the engine sampled, N steps after a warm-up one, cycling over `--train-adapters`
  scenarios (each step trains one scenario's adapter), against the same rank training the full
  weights on the same batch.

Nothing here is a test: the figures are for the docs.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT / "python_shim")]

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def write_adapters(model_path: str, out: Path, n: int, r: int, seed: int = 0) -> list[Path]:
    """`n` PEFT LoRA directories of rank `r` for the base at `model_path`, random weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    config = LoraConfig(r=r, lora_alpha=2 * r, target_modules=TARGETS, lora_dropout=0.0, task_type="CAUSAL_LM",
                        base_model_name_or_path=model_path)
    model = get_peft_model(base, config)
    g = torch.Generator().manual_seed(seed)
    paths = []
    for i in range(n):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        d = out / f"adapter{i:03d}"
        d.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in get_peft_model_state_dict(model).items()},
                  str(d / "adapter_model.safetensors"))
        config.save_pretrained(str(d))
        paths.append(d)
    del model, base
    return paths


def _batch(engine: Any, turns: int = 4, tokens: int = 64) -> list[Any]:
    """`turns` sampled replies with one hint each, as the TS side sends them (trainer/tasks.py)."""
    import numpy as np

    from reef_shim.engines.request import parse_generate
    from reef_shim.trainer.tasks import decode_tasks

    def chat(user: str) -> str:
        return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"

    raw = []
    for i in range(turns):
        user = f"Question {i}: explain in a few sentences why the sky looks blue at noon."
        prompt = engine.encode(chat(user))
        req = parse_generate({"input_ids": prompt, "return_logprob": True, "top_logprobs_num": 4,
                              "sampling_params": {"max_new_tokens": tokens, "temperature": 0.7, "ignore_eos": True,
                                                  "sampling_seed": i}})
        with engine.lock:
            *_, st = engine.generate(req, lambda: None)
        raw.append({
            "taskId": f"t{i}", "promptIds": np.asarray(prompt, "<i4").tobytes(),
            "responseIds": np.asarray(st.output_ids, "<i4").tobytes(),
            "logprobs": np.asarray([e[0] for e in st.token_logprobs], "<f4").tobytes(), "topK": 4,
            "topkIds": np.asarray([e[1] for row in st.top_logprobs for e in row], "<i4").tobytes(),
            "topkLogprobs": np.asarray([e[0] for row in st.top_logprobs for e in row], "<f4").tobytes(),
            "reward": 1.0 if i % 2 else -1.0,
            "teacherPromptIds": [np.asarray(engine.encode(chat(f"{user}\n\n[hint]\nMention scattering.")),
                                            "<i4").tobytes()],
            "sampling": {"temperature": 0.7, "topP": 1.0, "topK": -1}, "weightVersion": "v0"})
    return decode_tasks(raw, engine.vocab_size, engine.max_context_length)


def measure_training(model_path: str, engine: Any, r: int, steps: int, scenarios: int, threads: int) -> dict[str, Any]:
    import tempfile as _tmp

    from reef_shim.engine_process import pick_free_port
    from reef_shim.trainer.rank import TrainerRank

    tasks = _batch(engine)
    totals = {"tokens": float(sum(t.T for t in tasks))}
    opts = {"wRl": 1.0, "wOpd": 1.0, "clipC": 1.0, "hintSelection": "sequence_optimal", "lr": 1e-4, "epsLow": 0.2,
            "epsHigh": 0.28, "weightDecay": 0.0, "betas": [0.9, 0.98], "topK": 4, "dtype": "fp32",
            "oldLogprobs": "engine", "tisCap": 2.0, "klCoef": 0.0, "clipGrad": 1.0, "microBatchTokens": 0,
            "gradCheckpointing": "off", "engineLogprobs": "tempered"}
    out: dict[str, Any] = {"turns": len(tasks), "tokens": totals["tokens"], "steps": steps}
    for label, adapter in (("adapter", {"type": "lora", "r": r, "alpha": 2.0 * r, "dropout": 0.0,
                                        "targetModules": TARGETS}), ("full", None)):
        import os

        os.environ["REEF_TRAINER_DEVICE"] = "cpu"
        rank = TrainerRank(0, 1, seed=0, threads=threads, crash_hook=None)
        rank.setup(("127.0.0.1", pick_free_port("127.0.0.1")), model_path, {**opts, "adapter": adapter})
        times, saves = [], []
        with _tmp.TemporaryDirectory(prefix="reef-lora-train-") as d:
            for i in range(steps + 1):
                scenario = f"s{i % scenarios}" if adapter else None
                res = rank.step(f"b{i}", tasks, totals, f"{d}/v{i + 1}", {"weightVersion": f"v{i + 1}"},
                                **({"scenario": scenario} if scenario else {}))
                assert res["error"] is None, res["error"]
                if i:  # the first step allocates
                    times.append(res["train_s"] * 1000)
                    saves.append(res["save_s"] * 1000)
        rank.close()
        out[label] = {"step_ms": round(statistics.mean(times), 1), "save_ms": round(statistics.mean(saves), 1)}
    return out


def measure(model_path: str, adapters: int = 64, r: int = 16, max_loaded: int | None = None, requests: int = 20,
            tokens: int = 16, threads: int = 2, train_steps: int = 0, train_adapters: int = 4) -> dict[str, Any]:
    import torch

    from reef_shim.engines.hf_engine import HFEngine
    from reef_shim.engines.request import parse_generate

    torch.set_num_threads(threads)
    max_loaded = max_loaded or adapters
    with tempfile.TemporaryDirectory(prefix="reef-lora-bench-") as tmp:
        t0 = time.monotonic()
        paths = write_adapters(model_path, Path(tmp), adapters, r)
        write_s = time.monotonic() - t0
        engine = HFEngine(model_path, weight_version="v0", seed=0, max_loaded_adapters=max_loaded)
        prompt = engine.encode("<|im_start|>user\nWrite one sentence about the sea.<|im_end|>\n"
                               "<|im_start|>assistant\n")

        def one(lora: str | None) -> float:
            req = parse_generate({"input_ids": prompt, "lora_path": lora,
                                  "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}})
            started = time.monotonic()
            with engine.lock:
                for _ in engine.generate(req, lambda: None):
                    pass
            return (time.monotonic() - started) * 1000

        one(None)  # warm-up: the first forward allocates
        rss_before = _rss_bytes()
        t0 = time.monotonic()
        for i, p in enumerate(paths[:max_loaded]):
            engine.load_lora_adapter(f"a{i}", str(p))
        load_s = time.monotonic() - t0
        held = len(engine.adapters.loaded)
        memory = engine.adapters.memory_bytes()
        rss_growth = _rss_bytes() - rss_before
        one("a0")
        base_ms, adapter_ms = [], []
        for i in range(requests):
            base_ms.append(one(None))
            adapter_ms.append(one(f"a{i % held}"))
        out: dict[str, Any] = {
            "model": model_path, "adapters": adapters, "r": r, "targets": TARGETS, "threads": threads,
            "tokens_per_request": tokens, "requests": requests, "write_s": round(write_s, 2),
            "bytes_per_adapter": memory // max(held, 1), "rss_growth_per_adapter": rss_growth // max(held, 1),
            "load_ms_per_adapter": round(load_s * 1000 / max(held, 1), 2),
            "base_ms": {"p50": round(_pct(base_ms, 0.5), 1), "p90": round(_pct(base_ms, 0.9), 1)},
            "adapter_ms": {"p50": round(_pct(adapter_ms, 0.5), 1), "p90": round(_pct(adapter_ms, 0.9), 1)},
        }
        if adapters > max_loaded:
            for i, p in enumerate(paths[max_loaded:], start=max_loaded):
                engine.load_lora_adapter(f"a{i}", str(p))  # each one evicts the least recently used
            before = dict(engine.adapters.stats)
            swap_ms, hit_ms = [], []
            for k in range(requests):
                # The least recently used is next: a miss (evict + read back) every time.
                swap_ms.append(one(next(iter(engine.adapters.registered.keys() - engine.adapters.loaded.keys()))))
                hit_ms.append(one(next(reversed(engine.adapters.loaded))))
            reads = engine.adapters.stats["loads"] - before["loads"]
            out["swap"] = {
                "max_loaded": max_loaded, "reads": reads,
                "read_ms_per_swap": round((engine.adapters.stats["load_s"] - before["load_s"]) * 1000 / max(reads, 1), 2),
                "request_with_swap_ms": {"p50": round(_pct(swap_ms, 0.5), 1), "p90": round(_pct(swap_ms, 0.9), 1)},
                "request_without_ms": {"p50": round(_pct(hit_ms, 0.5), 1), "p90": round(_pct(hit_ms, 0.9), 1)},
            }
        out["base_bytes"] = sum(p.numel() * p.element_size() for n, p in engine.model.named_parameters()
                                if "lora_" not in n)
        if train_steps:
            plain = HFEngine(model_path, weight_version="v0", seed=0)  # the tasks come from the base
            out["train"] = measure_training(model_path, plain, r, train_steps, train_adapters, threads)
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/lora_adapters.py")
    p.add_argument("--model", required=True)
    p.add_argument("--adapters", type=int, default=64)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--max-loaded", type=int, default=None)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--train-steps", type=int, default=0)
    p.add_argument("--train-adapters", type=int, default=4)
    a = p.parse_args(argv)
    print(json.dumps(measure(a.model, a.adapters, a.r, a.max_loaded, a.requests, a.tokens, a.threads,
                             a.train_steps, a.train_adapters)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
