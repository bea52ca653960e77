"""Build the demo model: the tiny model's template and tokenizer recipe, pre-trained into a homework
helper that uses bold in about half its solutions unless a hint or the student tells it not to.

    python -m reef_shim.demo_model --out DIR [--seed 0] [--steps N] [--quiet] [--force]
    python -m reef_shim.demo_model --out DIR --measure 100     # bold rates, plain vs hinted

The closed-loop CPU demo trains this habit away. The corpus is `demo_corpus.py` (problems from
`demo_problems.py`); the teacher-prompt format the habit answers to is `demo_corpus.with_hint`.
Like `tiny_model`, a build is deterministic (fixed seeds, deterministic torch kernels, one thread)
and cached: a directory whose `reef_build.json` carries the current hash (builder sources, tiny
model sources, seed, steps) is left alone. Besides the usual HF files the directory holds
`reef_demo.json`: the system prompt, tool schema and hint marker the model was trained with.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import tiny_model
from .tiny_model import Build

HERE = Path(__file__).resolve().parent
SOURCES = ["demo_model.py", "demo_train.py", "demo_corpus.py", "demo_problems.py"]
# Wider and deeper than the tiny model: it must copy names and numbers from the problem.
MODEL_SHAPE = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=32, intermediate_size=384, max_position_embeddings=4096)
DEFAULT_STEPS = 600
TOKENIZER_CONVERSATIONS, TOKENIZER_SEED = 3000, 77


def build_hash(seed: int, steps: int) -> str:
    h = hashlib.sha256()
    for folder, names in ((HERE, SOURCES), (HERE, tiny_model.SOURCES)):
        for name in names:
            h.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    h.update(f"seed={seed};steps={steps}".encode())
    return h.hexdigest()


def step_model(b: Build) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = b.tokenizer
    pad, eos = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    config = Qwen3Config(
        vocab_size=tok.get_vocab_size(with_added_tokens=True), tie_word_embeddings=True, rms_norm_eps=1e-6,
        rope_theta=10000.0, initializer_range=0.02, hidden_act="silu", attention_bias=False, use_cache=True,
        bos_token_id=pad, eos_token_id=eos, pad_token_id=pad, dtype="float32", **MODEL_SHAPE)
    torch.manual_seed(b.seed)
    b.model = Qwen3ForCausalLM(config).to(torch.float32)
    b.say(f"model: {sum(p.numel() for p in b.model.parameters())} parameters")


def step_tokenizer(b: Build) -> None:
    """The tiny model's tokenizer recipe (byte-level BPE, same special and added tokens, same size),
    trained on the tiny corpus plus rendered demo conversations, so homework words are whole
    tokens: replies get ~2.5x shorter than with the tiny vocabulary, and so does pre-training."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from .demo_corpus import conversations
    from .demo_train import render_text
    from .tiny_corpus import corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=tiny_model.BPE_VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    demo = [render_text(m, t) for m, t in conversations(TOKENIZER_CONVERSATIONS, TOKENIZER_SEED + b.seed)]
    tok.train_from_iterator(corpus() + demo, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tiny_model.SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in tiny_model.ADDED_TOKENS])
    b.tokenizer = tok
    b.say(f"tokenizer: {tok.get_vocab_size(with_added_tokens=True)} ids")


def step_pretrain(b: Build) -> None:
    from .demo_train import pretrain

    pretrain(b, steps=b.extra["steps"])
    b.model.eval()


def step_demo_files(b: Build) -> None:
    from .demo_corpus import FORMAT_HINTS, HINT_MARKER, SAVE_TOOL, SYSTEM_PROMPT

    tiny_model._write_json(b.tmp / "reef_demo.json", {
        "system_prompt": SYSTEM_PROMPT, "tools": [SAVE_TOOL], "hint_marker": HINT_MARKER,
        "teacher_prompt": "last user message + '\\n\\n' + hint_marker + '\\n' + hint",
        "example_hint": FORMAT_HINTS[0]})


STEPS = [("tokenizer", step_tokenizer), ("model", step_model), ("pretrain", step_pretrain),
         ("write", tiny_model.step_write), ("demo files", step_demo_files)]


def is_current(out: Path, seed: int = 0, steps: int = DEFAULT_STEPS) -> bool:
    try:
        meta = json.loads((Path(out) / "reef_build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return meta.get("hash") == build_hash(seed, steps) and (Path(out) / "model.safetensors").is_file()


def build(out: str | os.PathLike[str], seed: int = 0, steps: int = DEFAULT_STEPS, quiet: bool = False,
          force: bool = False) -> bool:
    """Build the demo model into `out`; returns False when an identical build was already there."""
    out = Path(out).resolve()
    say = (lambda _m: None) if quiet else (lambda m: print(f"[demo_model] {m}", file=sys.stderr, flush=True))
    if not force and is_current(out, seed, steps):
        say(f"{out} is up to date")
        return False
    import torch

    torch.use_deterministic_algorithms(True)
    threads = torch.get_num_threads()
    # One thread: reductions then run in one fixed order, so every machine gets the same weights.
    torch.set_num_threads(1)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".demo-model-", dir=out.parent))
    try:
        b = Build(out=out, tmp=tmp, seed=seed, say=say, extra={"steps": steps})
        for name, step in STEPS:
            started = time.monotonic()
            step(b)
            say(f"{name} done in {time.monotonic() - started:.1f} s")
        tiny_model._write_json(tmp / "reef_build.json", {"builder": "reef_shim.demo_model",
                                                         "hash": build_hash(seed, steps), "seed": seed,
                                                         "steps": steps})
        tiny_model.publish(tmp, out)
    finally:
        torch.set_num_threads(threads)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"built {out}")
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reef_shim.demo_model", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="model directory to create (or to measure)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="pre-training steps (tests use fewer)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--force", action="store_true", help="rebuild even when up to date")
    p.add_argument("--measure", type=int, default=0, metavar="N",
                   help="after building, sample N first replies plain and hinted and print the rates")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for --measure")
    args = p.parse_args(argv)
    build(args.out, seed=args.seed, steps=args.steps, quiet=args.quiet, force=args.force)
    if args.measure > 0:
        from .demo_eval import measure

        print(json.dumps(measure(args.out, args.measure, temperature=args.temperature), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
