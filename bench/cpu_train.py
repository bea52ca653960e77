"""The trainer on the CPU with a real model: step time, peak memory and the ℓold choices, measured.

    PYTHONPATH=python_shim .venv/bin/python bench/cpu_train.py batch  --model DIR --out BATCH.pt
    PYTHONPATH=python_shim .venv/bin/python bench/cpu_train.py step   --model DIR --batch BATCH.pt \\
        [--ranks 1] [--threads 2] [--micro-batch-tokens 2048] [--grad-checkpointing off] [--dtype fp32] \
        [--kl-coef 0] [--steps 2]
    PYTHONPATH=python_shim .venv/bin/python bench/cpu_train.py drift  --model DIR --batch BATCH.pt
    PYTHONPATH=python_shim .venv/bin/python bench/cpu_train.py clips  --model DIR --batch BATCH.pt

`batch` generates the realistic batch once (docs/training.md, "ℓold: the engine's or the trainer's"): 16 chat
turns, each a ~300-token prompt (a section of this repository's docs and a question about it) and a
reply sampled at temperature 0.7 (no top-k / top-p) of 100-250 tokens, with one hint. It samples
twice, with the model in fp32 and cast to bf16, so each turn has the tokens and the tempered
logprobs and top-4 (`log_softmax(logits / T)`, SGLang's convention) an fp32 engine and a bf16 engine
would have recorded; both come from the incremental (KV-cache) decode, as an engine's do.

`step` runs the real trainer rank (`TrainerRank`, FSDP2 over gloo) on that batch, `--ranks`
processes of `--threads` threads each, and prints the mean step time after the first and each
rank's peak RSS (and its RSS once the models are loaded). `drift` runs the scoring and objective
functions in this process (fp32 policy, as one rank) and prints, for each engine and each ℓold
mode: the drift |ℓtrainer − ℓengine|, the clip fractions, the TIS weights and the norms of the OPD
and RL gradients. `clips` shows which side of the OPD gradient the PPO clip removes when ℓold is
the engine's. Nothing here is a test: the figures are for docs/training.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT / "python_shim")]
sys.path.append(str(_ROOT))

HINT_MARKER = "[Hint for a better reply]"  # recipes/openclawrl/record2task.ts
HINTS = ["Answer in two or three plain sentences.", "Name the one rule the section sets and why it holds.",
         "Start with what breaks without it.", "Quote no more than five words of the text."]
QUESTIONS = ["Explain in your own words what this section says.", "What problem does this section solve?",
             "Summarise the section for a new engineer.", "Which choice does this section make, and why?"]
TEMPERATURE = 0.7
K = 4


def log(msg: str) -> None:
    print(f"[cpu-train] {msg}", flush=True)


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def doc_sections(tok: Any, n: int, lo: int = 230, hi: int = 330) -> list[str]:
    """`n` runs of paragraphs from docs/*.md of lo..hi tokens each, deterministic."""
    out: list[str] = []
    for path in sorted((_ROOT / "docs").glob("*.md")):
        paras = [p.strip() for p in path.read_text().split("\n\n") if p.strip() and not p.startswith("|")]
        cur: list[str] = []
        for p in paras:
            cur.append(p)
            size = len(tok("\n\n".join(cur))["input_ids"])
            if size > hi:
                cur = [p] if len(tok(p)["input_ids"]) <= hi else []
            elif size >= lo:
                out.append("\n\n".join(cur))
                cur = []
            if len(out) == n:
                return out
    raise SystemExit(f"only {len(out)} sections of {lo}-{hi} tokens in docs/")


def make_batch(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    sections = doc_sections(tok, args.tasks)
    users = [f"{s}\n\n{QUESTIONS[i % len(QUESTIONS)]}" for i, s in enumerate(sections)]
    render = lambda u: tok.apply_chat_template([{"role": "user", "content": u}], add_generation_prompt=True,  # noqa: E731
                                               tokenize=True, return_dict=True)["input_ids"]
    prompts = [render(u) for u in users]
    teachers = [render(f"{u}\n\n{HINT_MARKER}\n{HINTS[i % len(HINTS)]}") for i, u in enumerate(users)]
    engines: dict[str, Any] = {}
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()
        rows = []
        t0 = time.monotonic()
        for start in range(0, len(prompts), args.gen_batch):
            chunk = prompts[start:start + args.gen_batch]
            width = max(map(len, chunk))
            pad = tok.pad_token_id if tok.pad_token_id is not None else 0
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
            attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            torch.manual_seed(1000 + start)
            with torch.no_grad():
                g = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=TEMPERATURE,
                                   top_k=0, top_p=1.0, min_new_tokens=args.min_new, max_new_tokens=args.max_new,
                                   output_logits=True, return_dict_in_generate=True, pad_token_id=pad)
            logits = torch.stack(g.logits, dim=1).float()  # [b, steps, V], raw
            for b in range(len(chunk)):
                out = g.sequences[b, width:].tolist()
                n = next((i + 1 for i, t in enumerate(out) if t == tok.eos_token_id), len(out))
                lp = torch.log_softmax(logits[b, :n] / TEMPERATURE, dim=-1)
                resp = torch.tensor(out[:n])
                top = torch.topk(lp, K, dim=-1)
                rows.append({"response": resp, "logprobs": lp.gather(-1, resp[:, None]).squeeze(-1),
                             "topk_ids": top.indices, "topk_logprobs": top.values})
        log(f"{dtype_name} engine: {len(rows)} replies, {sum(len(r['response']) for r in rows)} tokens "
            f"in {time.monotonic() - t0:.0f} s")
        engines[dtype_name] = rows
        del model
    torch.save({"prompts": prompts, "teachers": teachers, "engines": engines, "temperature": TEMPERATURE}, args.out)
    lens = [(len(p), len(r["response"])) for p, r in zip(prompts, engines["fp32"])]
    log(f"saved {args.out}: prompt tokens {min(a for a, _ in lens)}-{max(a for a, _ in lens)}, "
        f"response tokens {min(b for _, b in lens)}-{max(b for _, b in lens)}")


def load_tasks(path: str, engine: str = "fp32") -> list[Any]:
    import numpy as np
    import torch

    from reef_shim.trainer.tasks import TrainTask

    data = torch.load(path)
    tasks = []
    for i, (p, h, r) in enumerate(zip(data["prompts"], data["teachers"], data["engines"][engine])):
        tasks.append(TrainTask(
            task_id=f"t{i}", prompt_ids=np.asarray(p, dtype=np.int64), response_ids=r["response"].numpy().astype(np.int64),
            logprobs=r["logprobs"].numpy().astype(np.float32), topk_ids=r["topk_ids"].numpy().astype(np.int64),
            topk_logprobs=r["topk_logprobs"].numpy().astype(np.float32), reward=1.0 if i % 2 == 0 else -1.0,
            teacher_prompt_ids=[np.asarray(h, dtype=np.int64)], temperature=float(data["temperature"])))
    return tasks


def options(args: argparse.Namespace, **over: Any) -> dict[str, Any]:
    base = {"wRl": 1.0, "wOpd": 1.0, "clipC": 1.0, "hintSelection": "sequence_optimal", "oldLogprobs": "trainer",
            "tisCap": 2.0, "klCoef": args.kl_coef, "lr": 1e-5, "epsLow": 0.2, "epsHigh": 0.28, "weightDecay": 0.1,
            "betas": [0.9, 0.98], "clipGrad": 1.0, "topK": K, "dtype": args.dtype,
            "microBatchTokens": args.micro_batch_tokens, "gradCheckpointing": args.grad_checkpointing,
            "engineLogprobs": "tempered"}
    return {**base, **over}


def _rank_main(rank: int, args: argparse.Namespace, port: int, results: Any) -> None:
    import torch

    from reef_shim.trainer.rank import TrainerRank
    from reef_shim.trainer.tasks import shard

    os.environ["REEF_TRAINER_DEVICE"] = "cpu"
    r = TrainerRank(rank, args.ranks, seed=0, threads=args.threads, crash_hook=None)
    r.setup(("127.0.0.1", port), args.model, options(args))
    loaded = rss_gib()
    start = resource.getrusage(resource.RUSAGE_SELF)
    cpu_at_start = start.ru_utime + start.ru_stime
    tasks = load_tasks(args.batch, args.engine)[: args.tasks]
    mine = [tasks[i] for i in shard(tasks, args.ranks)[rank]]
    totals = {"tokens": float(sum(t.T for t in tasks))}
    times, metrics = [], {}
    for s in range(args.steps):
        t0 = time.monotonic()
        out = r.step(f"bench:{s}", mine, totals, None, {})
        times.append(time.monotonic() - t0)
        if out["error"]:
            raise RuntimeError(out["error"])
        metrics = metrics or out["sums"]  # the first step's: its ℓθ is the weights that sampled the batch
    r.close()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    results.put({"rank": rank, "times": times, "rss_loaded_gib": loaded, "rss_peak_gib": rss_gib(),
                 "cpu_s": cpu.ru_utime + cpu.ru_stime - cpu_at_start,
                 "threads": torch.get_num_threads(), "sums": metrics})


def step(args: argparse.Namespace) -> None:
    import multiprocessing as mp

    from reef_shim.engine_process import pick_free_port

    load_before = os.getloadavg()[0]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = pick_free_port("127.0.0.1")
    procs = [ctx.Process(target=_rank_main, args=(rank, args, port, results)) for rank in range(args.ranks)]
    for p in procs:
        p.start()
    got = [results.get() for _ in procs]
    for p in procs:
        p.join()
    got.sort(key=lambda g: g["rank"])
    tasks = load_tasks(args.batch)[: args.tasks]
    policy = sum(len(t.prompt_ids) + t.T for t in tasks)
    teacher = sum(len(h) + t.T for t in tasks for h in t.teacher_prompt_ids)
    steady = [max(g["times"][s] for g in got) for s in range(1, args.steps)] or [max(g["times"][0] for g in got)]
    row = {"ranks": args.ranks, "threads": args.threads, "micro_batch_tokens": args.micro_batch_tokens, "kl_coef": args.kl_coef,
           "grad_checkpointing": args.grad_checkpointing, "dtype": args.dtype, "tasks": len(tasks),
           "policy_tokens": policy, "teacher_tokens": teacher, "first_step_s": max(g["times"][0] for g in got),
           "step_s": sum(steady) / len(steady), "steady_s": steady, "rss_loaded_gib": [round(g["rss_loaded_gib"], 2) for g in got],
           "rss_peak_gib": [round(g["rss_peak_gib"], 2) for g in got],
           "micro_batches": [g["sums"].get("micro_batches") for g in got],
           "abs_diff": sum(g["sums"]["abs_diff_sum"] for g in got) / sum(g["sums"]["tokens"] for g in got),
           "cpu_s_per_step": [round(g["cpu_s"] / args.steps, 1) for g in got],
           "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    print(json.dumps(row), flush=True)


def drift(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from recipes.openclawrl.objective import ObjectiveConfig, openclawrl_loss
    from reef_shim.trainer.loss import add_sums, combine, local_loss
    from reef_shim.trainer.scoring import micro_batches, objective_batch

    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    policy = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    teacher = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval().requires_grad_(False)
    for engine in ("fp32", "bf16"):
        tasks = load_tasks(args.batch, engine)[: args.tasks]
        totals = {"tokens": float(sum(t.T for t in tasks))}
        for mode in ("engine", "trainer"):
            row: dict[str, Any] = {"engine": engine, "old_logprobs": mode}
            for term, (w_rl, w_opd) in (("opd", (0.0, 1.0)), ("rl", (1.0, 0.0))):
                cfg = ObjectiveConfig(w_rl=w_rl, w_opd=w_opd, old_logprobs=mode)
                policy.zero_grad(set_to_none=True)
                parts = []
                for mb in micro_batches(tasks, 2048):
                    loss, sums = local_loss(objective_batch(policy, teacher, [tasks[i] for i in mb], cpu, "tempered"),
                                            cfg, totals, 1, openclawrl_loss)
                    loss.backward()
                    parts.append(sums)
                norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in policy.parameters() if p.grad is not None)).item()
                m = combine([add_sums(parts)], cfg)
                row[f"{term}_grad_norm"] = norm
                for k in ("train_rollout_logprob_abs_diff", "train_rollout_logprob_abs_diff_max", "rl_clip_frac",
                          "opd_clip_frac", "mean_abs_d", "tis_weight_mean", "tis_clip_frac"):
                    row[k] = m[k]
            print(json.dumps(row), flush=True)


def clips(args: argparse.Namespace) -> None:
    """Where the clip bites with ℓold = the engine's: of the OPD entries (t, v ∈ S_t), the share whose
    ratio ρ = exp(ℓθ − ℓengine) leaves [1 − ε_low, 1 + ε_high] on the side where the min picks the
    clipped branch (ρ > 1.28 with d > 0: the hint's push up on v is lost; ρ < 0.8 with d < 0: its
    push down), and the share of the OPD signal Σ w·|d| those entries carried. Forward only."""
    import torch
    from transformers import AutoModelForCausalLM

    from reef_shim.trainer.scoring import micro_batches, objective_batch

    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    policy = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    for engine in ("fp32", "bf16"):
        tasks = load_tasks(args.batch, engine)[: args.tasks]
        acc = torch.zeros(6, dtype=torch.float64)  # entries, up-lost, down-lost, signal, up-lost signal, down-lost signal
        with torch.no_grad():
            for mb in micro_batches(tasks, 2048):
                b = objective_batch(policy, policy, [tasks[i] for i in mb], cpu, "tempered")
                valid = (b["topk_ids"] >= 0) & b["mask"].bool()[..., None]
                old = b["topk_logp_old"]
                rho = torch.exp(b["topk_logp_new"] - old)
                d = (b["teacher_topk_logp"][:, 0] - old).clamp(-1, 1)
                w = torch.softmax(torch.where(valid, old, float("-inf")), -1).nan_to_num(0.0)
                up, down = valid & (rho > 1.28) & (d > 0), valid & (rho < 0.8) & (d < 0)
                sig = (w * d.abs()).double()
                acc += torch.stack([valid.sum().double(), up.sum().double(), down.sum().double(), sig[valid].sum(),
                                    sig[up].sum(), sig[down].sum()])
        e, u, dn, sg, su, sd = acc.tolist()
        print(json.dumps({"engine": engine, "entries": int(e), "clipped_push_up_frac": u / e, "clipped_push_down_frac": dn / e,
                          "signal_lost_up_frac": su / sg, "signal_lost_down_frac": sd / sg}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["batch", "step", "drift", "clips"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default="cpu_train_batch.pt")
    ap.add_argument("--batch", default="cpu_train_batch.pt")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--gen-batch", type=int, default=8)
    ap.add_argument("--min-new", type=int, default=100)
    ap.add_argument("--max-new", type=int, default=250)
    ap.add_argument("--engine", choices=["fp32", "bf16"], default="fp32", help="whose recorded logprobs `step` uses")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    ap.add_argument("--grad-checkpointing", choices=["off", "on"], default="off")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    {"batch": make_batch, "step": step, "drift": drift, "clips": clips}[args.what](args)


if __name__ == "__main__":
    main()
