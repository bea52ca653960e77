"""KL from a trained policy to its base model on a fixed reference set: the experiment's collapse check.

    python -m reef_shim.eval_kl --base DIR --policy DIR --reference FILE.jsonl [--out FILE.json]

Each reference line is `{"messages": [...], "response": "..."}`: a prompt (rendered with the base
model's chat template, generation prompt added) and a fixed reply to it. For every reply token the
script computes the exact KL(π_policy ‖ π_base) of the two next-token distributions over the whole
vocabulary, at temperature 1, and prints `{"tokens", "mean_kl", "max_kl", "sequences"}` (nats per
token; also written to `--out`). The same reference set for every arm and seed makes the figures
comparable: a policy that drifts far from the base to drop a habit shows it here even when its
replies still look fine. `--policy` equal to `--base` gives 0 (the control arm).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROWS_PER_FORWARD = 4  # bounds the [rows, length, vocab] logits held at once


def _load(path: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _encode(tokenizer: Any, line: dict[str, Any]) -> tuple[list[int], list[int]]:
    prompt = tokenizer.apply_chat_template(line["messages"], add_generation_prompt=True, tokenize=True, return_dict=False)
    if isinstance(prompt, dict):
        prompt = prompt["input_ids"]
    response = tokenizer(line["response"], add_special_tokens=False)["input_ids"]
    return list(prompt), list(response)


def reference_kl(base_dir: str, policy_dir: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    pairs = [_encode(tokenizer, line) for line in lines]
    pairs = [(p, r) for p, r in pairs if r]
    same = Path(policy_dir).resolve() == Path(base_dir).resolve()
    base = _load(base_dir)
    policy = base if same else _load(policy_dir)
    per_seq: list[float] = []
    total, count, worst = 0.0, 0, 0.0
    with torch.inference_mode():
        for start in range(0, len(pairs), ROWS_PER_FORWARD):
            chunk = pairs[start:start + ROWS_PER_FORWARD]
            width = max(len(p) + len(r) for p, r in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            for i, (p, r) in enumerate(chunk):
                ids[i, :len(p) + len(r)] = torch.tensor(p + r)
            # Right padding needs no mask: a causal model's real tokens never attend to later ones.
            lb = torch.log_softmax(base(input_ids=ids).logits.float(), dim=-1)
            lp = lb if same else torch.log_softmax(policy(input_ids=ids).logits.float(), dim=-1)
            for i, (p, r) in enumerate(chunk):
                rows = slice(len(p) - 1, len(p) + len(r) - 1)  # the positions predicting each reply token
                kl = (lp[i, rows].exp() * (lp[i, rows] - lb[i, rows])).sum(-1).clamp(min=0)
                per_seq.append(float(kl.mean()))
                total += float(kl.sum())
                count += kl.numel()
                worst = max(worst, float(kl.max()))
    return {"tokens": count, "mean_kl": total / count if count else 0.0, "max_kl": worst, "sequences": len(per_seq),
            "per_sequence": per_seq}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reef_shim.eval_kl", description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True)
    p.add_argument("--policy", required=True)
    p.add_argument("--reference", required=True, help="JSONL of {messages, response}")
    p.add_argument("--out", default=None)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    lines = [json.loads(line) for line in Path(args.reference).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        print(f"eval_kl: {args.reference} holds no reference line", file=sys.stderr)
        return 2
    result = reference_kl(args.base, args.policy, lines)
    text = json.dumps(result)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
