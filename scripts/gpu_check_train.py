"""Steps 4 and 5 of `gpu_check.py` (run through `gpu_check_steps.py`, which gives each its recorder):
a bf16 trainer step of the tiny model with ℓold parity, and the trainer's throughput.

Neither needs Ray: the trainer rank (`reef_shim.trainer.rank.TrainerRank`) runs in this process over
a one-rank process group, as bench/gpu_train.py runs it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

QUESTIONS = [("What is 12 + 7?", "Add the ones first."), ("Name a colour.", "Think of the sky."),
             ("Spell the word cat backwards.", "Start from the last letter.")]
T, TOP_P, K, NEW = 0.7, 0.9, 4, 24
TRAINER_OPTIONS = {"wRl": 1.0, "wOpd": 1.0, "clipC": 1.0, "hintSelection": "sequence_optimal", "lr": 1e-3,
                   "epsLow": 0.2, "epsHigh": 0.28, "weightDecay": 0.1, "betas": [0.9, 0.98], "topK": K, "dtype": "bf16",
                   "oldLogprobs": "trainer", "tisCap": 2.0, "klCoef": 0.0, "clipGrad": 1.0, "microBatchTokens": 2048,
                   "gradCheckpointing": "off", "engineLogprobs": "tempered"}


def chat(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def train_task(i: int, prompt: list[int], teacher: list[int], ids: list[int], lps: list[float],
               top: list[list[tuple[int, float]]]) -> Any:
    import numpy as np

    from reef_shim.trainer.tasks import TrainTask

    return TrainTask(task_id=f"gpu-check-{i}", prompt_ids=np.array(prompt, np.int64), response_ids=np.array(ids, np.int64),
                     logprobs=np.array(lps, np.float32), topk_ids=np.array([[j for j, _ in r] for r in top], np.int64),
                     topk_logprobs=np.array([[v for _, v in r] for r in top], np.float32),
                     reward=1.0 if i % 2 == 0 else -1.0, teacher_prompt_ids=[np.array(teacher, np.int64)],
                     temperature=T, top_p=TOP_P, weight_version="v0")


def hf_engine_tasks(model: Path) -> list[Any]:
    """Sampled by Reef's hf engine (fp32, on the CPU, where it runs), with its recorded logprobs."""
    from reef_shim.engines.hf_engine import HFEngine
    from reef_shim.engines.request import parse_generate

    engine = HFEngine(str(model), weight_version="v0", seed=3)
    tasks = []
    for i, (q, hint) in enumerate(QUESTIONS):
        prompt = engine.encode(chat(q))
        req = parse_generate({"input_ids": prompt, "return_logprob": True, "top_logprobs_num": K,
                              "sampling_params": {"max_new_tokens": NEW, "temperature": T, "top_p": TOP_P,
                                                  "ignore_eos": True, "sampling_seed": 11 + i}})
        with engine.lock:
            *_, s = engine.generate(req, lambda: None)
        tasks.append(train_task(i, prompt, engine.encode(chat(f"{q}\n\n[hint]\n{hint}")), s.output_ids,
                                [e[0] for e in s.token_logprobs], [[(e[1], e[0]) for e in r] for r in s.top_logprobs]))
    return tasks


def bf16_decode_tasks(model: Path, like: list[Any], device: str) -> list[Any]:
    """The same prompts decoded as SGLang decodes them: bf16 weights, a KV cache, one token a step,
    logits cast to fp32, reported logprob `log_softmax(logits / T)` (the engine's `tempered_logprobs`),
    drawn from the top-p distribution (its `sampling_logprobs`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from reef_shim.engines.kv_batch import cache_argument
    from reef_shim.engines.sampling import sampling_logprobs, tempered_logprobs

    net = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.bfloat16).to(device).eval()
    cache = cache_argument(net)  # the GPU machine's transformers may predate the `cache` name
    g = torch.Generator(device=device).manual_seed(5)
    out = []
    with torch.no_grad():
        for i, task in enumerate(like):
            o = net(input_ids=torch.tensor([task.prompt_ids.tolist()], device=device), use_cache=True)
            ids, lps, top = [], [], []
            for _ in range(NEW):
                logits = o.logits[0, -1]
                lp = tempered_logprobs(logits, T)
                tok = int(torch.multinomial(sampling_logprobs(logits, T, -1, TOP_P).exp(), 1, generator=g))
                best = torch.topk(lp, K)
                ids.append(tok)
                lps.append(float(lp[tok]))
                top.append(list(zip(best.indices.tolist(), best.values.tolist())))
                o = net(input_ids=torch.tensor([[tok]], device=device), use_cache=True, **{cache: getattr(o, cache)})
            out.append(train_task(i, task.prompt_ids.tolist(), task.teacher_prompt_ids[0].tolist(), ids, lps, top))
    del net
    return out


def step_trainer(rec: Any, opts: dict[str, Any]) -> tuple[bool, str]:
    device = opts["device"]
    os.environ["REEF_TRAINER_DEVICE"] = device
    import torch

    from reef_shim import tiny_model
    from reef_shim.engine_process import pick_free_port
    from reef_shim.trainer.loss import combine
    from reef_shim.trainer.rank import TrainerRank
    from reef_shim.trainer.scoring import policy_logprobs

    model = Path(opts["work"]) / "tiny"
    tiny_model.build(model, seed=0, quiet=True)
    torch.use_deterministic_algorithms(False)  # the build turns it on for the whole process; the trainer runs without
    tasks = hf_engine_tasks(model)
    rec.note(tasks=len(tasks), response_tokens=sum(t.T for t in tasks), temperature=T)
    rank = TrainerRank(0, 1, seed=0, threads=int(opts["threads"]), crash_hook=None)
    try:
        started = rank.setup(("127.0.0.1", pick_free_port("127.0.0.1")), str(model), TRAINER_OPTIONS)
        rec.note(rank=started)
        decoded = bf16_decode_tasks(model, tasks, device)
        with torch.no_grad():
            scored = policy_logprobs(rank.policy, decoded, rank.device, "tempered")[0].float().cpu()
        d = torch.cat([(scored[b, :t.T] - torch.from_numpy(t.logprobs)).abs() for b, t in enumerate(decoded)])
        decode_gap = {"mean": float(d.mean()), "max": float(d.max())}
        rec.note(bf16_decode_vs_trainer=decode_gap)
        t0 = time.monotonic()
        r = rank.step("gpu-check:bf16", tasks, {"tokens": float(sum(t.T for t in tasks))}, None, {})
        step_s = time.monotonic() - t0
    finally:
        rank.close()
    if r["error"] is not None:
        rec.note(step_error=r["error"])
        return False, f"the step failed: {r['error']}"
    m = combine([r["sums"]], rank.cfg)
    engine_gap = {"mean": m["train_rollout_logprob_abs_diff"], "max": m["train_rollout_logprob_abs_diff_max"]}
    rec.note(step_s=round(step_s, 2), loss=m["loss"], grad_norm=r["sums"]["grad_norm"],
             fp32_hf_engine_vs_bf16_trainer=engine_gap)
    finite = math.isfinite(m["loss"]) and math.isfinite(r["sums"]["grad_norm"])
    ok = finite and 1e-4 < engine_gap["mean"] < 5e-2 and decode_gap["mean"] < 0.02
    return ok, (f"{started['device']}: step {step_s:.1f} s, loss {m['loss']:.4f}; mean |Δ| fp32 hf engine vs bf16 "
                f"trainer {engine_gap['mean']:.2e} (max {engine_gap['max']:.2e}), bf16 decode vs trainer "
                f"{decode_gap['mean']:.2e} (max {decode_gap['max']:.2e})")


def step_bench(rec: Any, opts: dict[str, Any], left: float) -> tuple[bool, str]:
    sizes = "1.7b,4b" if left >= 180 else "0.6b,1.7b"  # the bench skips the second if it will not fit
    result = Path(opts["work"]) / "gpu_train_bf16.json"
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_train.py"), "--sizes", sizes, "--dtype", "bf16", "--tasks", "4",
           "--steps", "1", "--budget-s", f"{left - 15:.0f}", "--json", str(result)]
    rec.note(command=" ".join(cmd[1:]))
    progress: list[str] = []
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)

    def tee() -> None:
        for line in p.stdout:
            print(line, end="", flush=True)
            if line.startswith("[gpu-train]"):
                progress.append(line.strip())
                rec.note(progress=progress[-8:])

    reader = threading.Thread(target=tee, daemon=True)
    reader.start()
    try:
        rc = p.wait(max(5.0, left))
    except subprocess.TimeoutExpired:
        p.kill()
        rec.note(bench="killed: out of time")
        return False, f"the bench ran past {left:.0f} s (its progress is in observed)"
    reader.join(5)
    if not result.exists():
        return False, f"the bench exited {rc} and wrote no rows"
    bench = json.loads(result.read_text())
    rows = [{k: r[k] for k in ("size", "params", "tasks", "step_s", "tokens_per_s", "response_tokens_per_s",
                               "tflops", "of_baseline", "peak_gib")} for r in bench["rows"]]
    rec.note(rows=rows, skipped=bench["skipped"], baseline_tflops=bench["baseline_tflops"])
    if not rows:
        return False, f"nothing measured ({'; '.join(bench['skipped'])})"
    top = max(rows, key=lambda r: r["params"])
    return rc == 0, (f"Qwen3-{top['size']} shape bf16, {top['tasks']} tasks: {top['tokens_per_s']:,.0f} tokens/s, "
                     f"step {top['step_s']:.2f} s, {top['peak_gib']:.0f} GiB peak")
