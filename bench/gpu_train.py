"""Trainer throughput on one GPU: the real trainer rank (`reef_shim.trainer.rank.TrainerRank`, FSDP2
over a one-rank NCCL group) stepping synthetic batches on randomly initialised Qwen3-shaped models.

    PYTHONPATH=python_shim python bench/gpu_train.py [--sizes 0.6b,1.7b,4b] [--dtype fp32|bf16] [--budget-s 300] [--json OUT]

Needs CUDA; with none it says so and exits 2. `npm run bench -- train` runs it when `nvidia-smi`
finds a GPU. No checkpoint is needed (none can be downloaded there): each model is built from a
config with the shapes of a published Qwen3 size, and its weights are random, which changes what
the model says but not the work of a step. `--dtype` is the trainer's option of that name (fp32
by default: docs/training.md), and the baseline, measured in the same run, is this GPU's matrix
product rate in that dtype; each step is also shown as a fraction of it (model FLOPs: 6·N per
policy token, 2·N per teacher token, N the parameter count).

Per size it reports: load (policy + frozen teacher), the first step (CUDA and cuBLAS warm-up), the
mean of the timed steps, tokens/s through the models, the full-weight gather (every step: each
step is a release) and the checkpoint write a disk weight sync costs, and the peak GPU memory.
A size that runs out of GPU memory is tried again with half the tasks (down to `--min-tasks`), so
the largest model that fits shows up with the batch it fits with. Sizes run smallest first; a size
whose predicted time does not fit what is left of `--budget-s` is skipped, and says so.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT / "python_shim")]
sys.path.append(str(_ROOT))

# Published Qwen3 shapes (hidden, layers, heads, kv heads, intermediate); vocabulary 151,936, tied.
SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "0.6b": (1024, 28, 16, 8, 3072),
    "1.7b": (2048, 28, 16, 8, 6144),
    "4b": (2560, 36, 32, 8, 9728),
}
VOCAB = 151_936


def log(msg: str) -> None:
    print(f"[gpu-train] {msg}", flush=True)


def matmul_tflops(torch: Any, dtype: Any) -> float:
    """The GPU's GEMM rate in the trainer's compute dtype (fp32 with TF32 off, as in the trainer): the baseline."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    reps = 10
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (start.elapsed_time(end) / 1000) / 1e12


def build_model(torch: Any, size: str, out: Path) -> int:
    from transformers import AutoModelForCausalLM, Qwen3Config
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    hidden, layers, heads, kv, inter = SIZES[size]
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, head_dim=128, intermediate_size=inter, max_position_embeddings=8192,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device("cuda"):  # random init on the GPU: seconds instead of minutes on the CPU
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(str(out))
    del model
    torch.cuda.empty_cache()
    return params


def synthetic_tasks(n: int, prompt: int, response: int, hint: int, k: int, seed: int) -> list[Any]:
    from reef_shim.trainer.tasks import TrainTask

    rng = np.random.default_rng(seed)
    tasks = []
    for i in range(n):
        p = rng.integers(0, VOCAB, prompt)
        ids = rng.integers(0, VOCAB, (response, k))
        lp = np.sort(rng.uniform(-8.0, -0.05, (response, k)).astype(np.float32), axis=1)[:, ::-1].copy()
        tasks.append(TrainTask(
            task_id=f"bench-{i}", prompt_ids=p, response_ids=ids[:, 0].copy(), logprobs=lp[:, 0].copy(), topk_ids=ids,
            topk_logprobs=lp, reward=1.0 if i % 2 else -1.0,
            teacher_prompt_ids=[np.concatenate([p, rng.integers(0, VOCAB, hint)])], temperature=1.0))
    return tasks


def run_size(torch: Any, size: str, args: argparse.Namespace, work: Path, baseline_tflops: float) -> dict[str, Any]:
    """Build the model once; step it with `--tasks` tasks, and after running out of GPU memory with
    half as many, down to `--min-tasks` (the row says how many fitted)."""
    model_dir = work / size
    t0 = time.monotonic()
    params = build_model(torch, size, model_dir)
    log(f"{size}: {params / 1e9:.2f} B parameters, built and written in {time.monotonic() - t0:.1f} s")
    tasks, ooms = args.tasks, []
    try:
        while True:
            try:
                return {**train_size(torch, size, params, tasks, args, model_dir, work, baseline_tflops),
                        "out_of_memory_at": ooms}
            except torch.cuda.OutOfMemoryError as e:
                ooms.append(tasks)
                log(f"{size}: out of GPU memory with {tasks} tasks ({str(e).splitlines()[0][:120]})")
                gc.collect()
                torch.cuda.empty_cache()
                if tasks // 2 < args.min_tasks:
                    raise
                tasks //= 2
                log(f"{size}: again with {tasks} tasks")
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)


def train_size(torch: Any, size: str, params: int, n_tasks: int, args: argparse.Namespace, model_dir: Path,
               work: Path, baseline_tflops: float) -> dict[str, Any]:
    from reef_shim.engine_process import pick_free_port
    from reef_shim.trainer.rank import TrainerRank

    options = {"wRl": 1.0, "wOpd": 1.0, "clipC": 1.0, "hintSelection": "sequence_optimal", "lr": 1e-6,
               "epsLow": 0.2, "epsHigh": 0.28, "weightDecay": 0.1, "betas": [0.9, 0.98], "topK": args.k,
               "dtype": args.dtype, "oldLogprobs": "trainer", "tisCap": 2.0, "klCoef": 0.0,
               "clipGrad": 1.0, "microBatchTokens": 0, "gradCheckpointing": "off", "engineLogprobs": "tempered"}
    torch.cuda.reset_peak_memory_stats()
    rank = TrainerRank(0, 1, seed=0, threads=8, crash_hook=None)
    try:  # a rank that fails anywhere (out of memory while loading, too) must leave its process group
        t0 = time.monotonic()
        info = rank.setup(("127.0.0.1", pick_free_port("127.0.0.1")), str(model_dir), options)
        load_s = time.monotonic() - t0
        log(f"{size}: policy + teacher on {info['device']} ({info['backend']}) in {load_s:.1f} s")
        tasks = synthetic_tasks(n_tasks, args.prompt, args.response, args.hint, args.k, seed=1)
        totals = {"tokens": float(sum(t.T for t in tasks))}
        policy_tokens = sum(len(t.prompt_ids) + t.T for t in tasks)
        teacher_tokens = sum(len(p) + t.T for t in tasks for p in t.teacher_prompt_ids)
        steps: list[float] = []
        first_s = 0.0
        result: dict[str, Any] = {}
        for s in range(args.steps + 1):
            last = s == args.steps
            out = str(work / f"{size}-ckpt") if last else None
            torch.cuda.synchronize()
            t0 = time.monotonic()
            r = rank.step(f"bench:{size}:{s}", tasks, totals, out, {"weightVersion": f"v{s + 1}", "parent": f"v{s}",
                                                                   "batchId": f"bench:{size}:{s}"})
            torch.cuda.synchronize()
            wall = time.monotonic() - t0
            if r["error"]:
                raise RuntimeError(r["error"])
            if s == 0:
                first_s = r["train_s"]
            else:
                steps.append(r["train_s"])
            log(f"{size}: step {s}: train {r['train_s']:.2f} s, wall {wall:.2f} s"
                + (f" (full-weight gather {wall - r['train_s'] - r['save_s']:.2f} s, checkpoint write {r['save_s']:.2f} s)" if last else ""))
            if last:
                result["gather_s"] = wall - r["train_s"] - r["save_s"]
                result["save_s"] = r["save_s"]
        step_s = float(np.mean(steps))
        flops = 6 * params * policy_tokens + 2 * params * teacher_tokens
        ckpt_bytes = (work / f"{size}-ckpt" / "model.safetensors").stat().st_size
        result.update(size=size, params=params, tasks=n_tasks, policy_tokens=policy_tokens,
                      teacher_tokens=teacher_tokens, response_tokens=int(totals["tokens"]), load_s=load_s,
                      first_step_s=first_s, step_s=step_s, steps=len(steps),
                      tokens_per_s=(policy_tokens + teacher_tokens) / step_s,
                      response_tokens_per_s=totals["tokens"] / step_s, tflops=flops / step_s / 1e12,
                      of_baseline=flops / step_s / 1e12 / baseline_tflops,
                      peak_gib=torch.cuda.max_memory_allocated() / 2**30, checkpoint_gb=ckpt_bytes / 1e9)
        return result
    finally:
        rank.close()
        del rank
        gc.collect()
        torch.cuda.empty_cache()
        shutil.rmtree(work / f"{size}-ckpt", ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0.6b,1.7b,4b", help="comma-separated, of " + ", ".join(SIZES))
    ap.add_argument("--budget-s", type=float, default=300.0, help="skip a size predicted to overrun this")
    ap.add_argument("--tasks", type=int, default=8, help="tasks per step; halved after running out of GPU memory")
    ap.add_argument("--min-tasks", type=int, default=2, help="the fewest tasks a size is tried with")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="the trainer's --dtype option")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--response", type=int, default=256)
    ap.add_argument("--hint", type=int, default=32, help="tokens the teacher prompt adds (the hint)")
    ap.add_argument("--k", type=int, default=8, help="top-K subset size")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after the first")
    ap.add_argument("--json", type=Path, help="also write the rows here, as JSON")
    ap.add_argument("--work-dir", type=Path, help="where models and checkpoints go (default: a temp dir)")
    args = ap.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        ap.error(f"--sizes: unknown {unknown}; known: {', '.join(SIZES)}")

    import torch

    if not torch.cuda.is_available():
        log("no CUDA device: nothing to measure")
        return 2
    started = time.monotonic()
    log(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, TF32 matmul "
        f"{'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}")
    baseline = matmul_tflops(torch, torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    log(f"baseline: {args.dtype} matrix product (8192³) {baseline:.1f} TFLOP/s")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="reef-gpu-train-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    per_param_s: float | None = None  # wall seconds per parameter of the last size, to predict the next
    for size in sizes:
        hidden, layers, _, _, inter = SIZES[size]
        approx = VOCAB * hidden + layers * (4 * hidden * hidden + 3 * hidden * inter)
        left = args.budget_s - (time.monotonic() - started)
        if per_param_s is not None and per_param_s * approx > left:
            skipped.append(f"{size}: predicted {per_param_s * approx:.0f} s, {left:.0f} s left of --budget-s")
            log(f"skipping {skipped[-1]}")
            continue
        t0 = time.monotonic()
        try:
            rows.append(run_size(torch, size, args, work, baseline))
        except torch.cuda.OutOfMemoryError as e:
            skipped.append(f"{size}: out of GPU memory ({str(e).splitlines()[0]})")
            log(f"skipping {skipped[-1]}")
            gc.collect()
            torch.cuda.empty_cache()
            continue
        per_param_s = (time.monotonic() - t0) / rows[-1]["params"]
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"trainer dtype {args.dtype}; {args.dtype} matrix product baseline: {baseline:.1f} TFLOP/s")
    print("| model | params | tasks | load s | first step s | step s | tokens/s | response tokens/s | TFLOP/s | of baseline | gather s | write s | checkpoint GB | peak GiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        oom = f" (out of memory at {', '.join(map(str, r['out_of_memory_at']))})" if r["out_of_memory_at"] else ""
        print(f"| Qwen3-{r['size']} shape | {r['params'] / 1e9:.2f} B | {r['tasks']}{oom} | {r['load_s']:.1f} | {r['first_step_s']:.2f} | "
              f"{r['step_s']:.2f} | {r['tokens_per_s']:,.0f} | {r['response_tokens_per_s']:,.0f} | {r['tflops']:.1f} | "
              f"{r['of_baseline']:.0%} | {r['gather_s']:.1f} | {r['save_s']:.1f} | {r['checkpoint_gb']:.1f} | {r['peak_gib']:.1f} |")
    for s in skipped:
        print(f"skipped {s}")
    if rows:
        print(f"per task: {args.prompt} prompt + {args.response} response tokens, one "
              f"teacher candidate each (+{args.hint} hint tokens), top-{args.k}; tokens/s counts policy and teacher tokens")
    if args.json:
        args.json.write_text(json.dumps({"dtype": args.dtype, "baseline_tflops": baseline, "rows": rows, "skipped": skipped,
                                         "device": torch.cuda.get_device_name(0), "torch": torch.__version__}, indent=1))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
