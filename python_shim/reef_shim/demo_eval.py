"""Measure the demo model's habit: sample first replies to homework requests, plain and hinted.

Sampling uses the `hf` engine's sampler (`engines.sampling.sample_rows`), batched with
left padding so a hundred replies take seconds, not minutes. Problems come from a seed far from
the corpus's, so the model is measured on requests it did not see.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from .demo_corpus import FORMAT_HINTS, SAVE_TOOL, SYSTEM_PROMPT, with_hint
from .demo_problems import problems

EVAL_SEED = 990_001
BOLD = re.compile(r"\*\*[^*\n]+\*\*")
LIST = re.compile(r"^\s*(?:\d+[.)]|[-*+])\s+\S", re.M)
STEP = re.compile(r"\d+(?:\s*[×x*÷/+\-−]\s*\d+)+\s*=\s*\d+")


def first_request(question: str, hint: str | None = None) -> list[dict[str, Any]]:
    ask = question if hint is None else with_hint(question, hint)
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": ask}]


def load(model_dir: str | Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # One thread, as the hf engine runs a model this small: on a busy 2-core machine a second
    # thread made decoding ten times slower.
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return tok, model


def sample(model: Any, prompts: list[list[int]], temperature: float, seed: int, max_new_tokens: int = 200,
           eos: int | None = None, batch: int = 32) -> list[list[int]]:
    """Sample one reply per prompt (ids up to and including eos) with the engine's own sampler."""
    import torch

    from .engines.sampling import RowSampling, sample_rows

    eos = model.config.eos_token_id if eos is None else eos
    gen = torch.Generator().manual_seed(seed)
    outs: list[list[int]] = []
    for at in range(0, len(prompts), batch):
        rows = prompts[at:at + batch]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
        attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        done = [False] * len(rows)
        # One generator shared by the rows, in row order: the draws stay a function of (seed, prompts).
        sampling = [RowSampling(temperature=temperature, generator=gen) for _ in rows]
        got: list[list[int]] = [[] for _ in rows]
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
            for _ in range(max_new_tokens):
                nxt = [p.token for p in sample_rows(out.logits[:, -1], sampling)]
                for i, t in enumerate(nxt):
                    if not done[i]:
                        got[i].append(t)
                        done[i] = t == eos
                if all(done):
                    break
                attn = torch.cat([attn, torch.ones((len(rows), 1), dtype=attn.dtype)], dim=1)
                pos = pos[:, -1:] + 1
                out = model(input_ids=torch.tensor(nxt)[:, None], attention_mask=attn, position_ids=pos,
                            past_key_values=out.past_key_values, use_cache=True)
        outs += got
    return outs


def habit_stats(texts: list[str], answers: list[int] | None = None) -> dict[str, float]:
    n = max(1, len(texts))
    stats = {"n": len(texts), "bold": sum(bool(BOLD.search(t)) for t in texts) / n,
             "list": sum(bool(LIST.search(t)) for t in texts) / n,
             "two_steps": sum(len(STEP.findall(t)) >= 2 for t in texts) / n}
    if answers is not None:
        stats["answer_present"] = sum(bool(re.search(rf"(?<!\d){a}(?!\d)", t)) for t, a in zip(texts, answers)) / n
    return stats


def measure(model_dir: str | Path, n: int, temperature: float = 1.0, seed: int = 0,
            hint: str = FORMAT_HINTS[0]) -> dict[str, Any]:
    """Bold/list/step rates of `n` first replies, plain and with `hint`, plus decode speed."""
    tok, model = load(model_dir)
    probs = problems(n, EVAL_SEED + seed)
    result: dict[str, Any] = {"temperature": temperature}
    for label, h in (("plain", None), ("hinted", hint)):
        prompts = [tok.apply_chat_template(first_request(p.question, h), tools=[SAVE_TOOL], tokenize=True,
                                           add_generation_prompt=True, return_dict=False) for p in probs]
        started = time.monotonic()
        outs = sample(model, [list(p) for p in prompts], temperature, seed)
        secs = time.monotonic() - started
        texts = [tok.decode(o, skip_special_tokens=True) for o in outs]
        result[label] = habit_stats(texts, [p.answer for p in probs])
        result[label]["batched_tok_per_s"] = round(sum(len(o) for o in outs) / secs)
        result[label]["example"] = texts[0]
    return result
