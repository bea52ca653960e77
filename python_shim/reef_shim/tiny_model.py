"""Build the tiny test model: a small Qwen3 decoder with its own byte-level BPE tokenizer.

    python -m reef_shim.tiny_model --out DIR [--seed 0] [--quiet] [--force]

The result is an ordinary Hugging Face model directory (`config.json`, `model.safetensors`,
`generation_config.json`, `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`,
`reef_build.json`). Every build with the same seed and builder source is byte-identical: fixed
seeds, a generated corpus (`tiny_corpus.py`), no timestamps, sorted JSON. A directory whose
`reef_build.json` already carries the current build hash is left as it is.

The build is a list of steps (`STEPS`): tokenizer → model init → weights → files. The weights
step is where a later pre-training pass plugs in; the hash covers every builder source file, so
changing a step rebuilds the model everywhere.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
SOURCES = ["tiny_model.py", "tiny_corpus.py", "tiny_chat_template.jinja"]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
BPE_VOCAB = 2039  # + 9 added tokens = 2048 ids, no unused rows in the embedding
MODEL_SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, intermediate_size=128, max_position_embeddings=4096)


@dataclass
class Build:
    """What the steps share while building into `tmp`."""

    out: Path
    tmp: Path
    seed: int
    say: Callable[[str], None]
    tokenizer: Any = None
    model: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def build_hash(seed: int) -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    h.update(f"seed={seed}".encode())
    return h.hexdigest()


def step_tokenizer(b: Build) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from .tiny_corpus import corpus

    tok = Tokenizer(models.BPE())
    # Byte-level: all 256 bytes are in the base alphabet, so any Unicode text round-trips.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    b.tokenizer = tok
    b.say(f"tokenizer: {tok.get_vocab_size(with_added_tokens=True)} ids")


def step_model(b: Build) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = b.tokenizer
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    config = Qwen3Config(
        vocab_size=tok.get_vocab_size(with_added_tokens=True), tie_word_embeddings=True,
        rms_norm_eps=1e-6, rope_theta=10000.0, initializer_range=0.02, hidden_act="silu",
        attention_bias=False, use_cache=True, bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], dtype="float32",
        **MODEL_SHAPE)
    torch.manual_seed(b.seed)
    b.model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    b.say(f"model: {sum(p.numel() for p in b.model.parameters())} parameters, seed {b.seed}")


def step_weights(b: Build) -> None:
    """Random init from the seed. A pre-training pass replaces this step (same signature)."""


def step_write(b: Build) -> None:
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    tok, model, tmp = b.tokenizer, b.model, b.tmp
    hf_logging.disable_progress_bar()
    model.save_pretrained(tmp, safe_serialization=True)
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    GenerationConfig(bos_token_id=tok.token_to_id("<|endoftext|>"), eos_token_id=eos,
                     pad_token_id=tok.token_to_id("<|endoftext|>"), do_sample=True, temperature=1.0,
                     top_k=0, top_p=1.0).save_pretrained(tmp)
    tok.save(str(tmp / "tokenizer.json"), pretty=True)
    template = (HERE / "tiny_chat_template.jinja").read_text(encoding="utf-8")
    (tmp / "chat_template.jinja").write_text(template, encoding="utf-8")
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                       "single_word": False, "special": t in SPECIAL_TOKENS}
             for t in SPECIAL_TOKENS + ADDED_TOKENS}
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "add_bos_token": False,
        "add_eos_token": False, "clean_up_tokenization_spaces": False, "errors": "replace",
        "model_max_length": MODEL_SHAPE["max_position_embeddings"], "split_special_tokens": False,
    }
    _write_json(tmp / "tokenizer_config.json", tok_config)
    _write_json(tmp / "special_tokens_map.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                                   "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    for name in ("config.json", "generation_config.json"):
        # Re-serialise sorted so the bytes do not depend on dict insertion order inside transformers.
        _write_json(tmp / name, json.loads((tmp / name).read_text(encoding="utf-8")))


STEPS: list[tuple[str, Callable[[Build], None]]] = [
    ("tokenizer", step_tokenizer), ("model", step_model), ("weights", step_weights), ("write", step_write),
]


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def is_current(out: Path, seed: int = 0) -> bool:
    try:
        meta = json.loads((out / "reef_build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return meta.get("hash") == build_hash(seed) and (out / "model.safetensors").is_file()


def build(out: str | os.PathLike[str], seed: int = 0, quiet: bool = False, force: bool = False) -> bool:
    """Build the tiny model into `out`; returns False when an identical build was already there."""
    out = Path(out).resolve()
    say = (lambda _m: None) if quiet else (lambda m: print(f"[tiny_model] {m}", file=sys.stderr, flush=True))
    if not force and is_current(out, seed):
        say(f"{out} is up to date")
        return False
    import torch

    torch.use_deterministic_algorithms(True)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target, then swap in, so a reader never sees a half-written model.
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-model-", dir=out.parent))
    try:
        b = Build(out=out, tmp=tmp, seed=seed, say=say)
        for name, step in STEPS:
            started = time.monotonic()
            step(b)
            say(f"{name} done in {time.monotonic() - started:.2f} s")
        _write_json(tmp / "reef_build.json", {"builder": "reef_shim.tiny_model", "hash": build_hash(seed),
                                              "seed": seed})
        publish(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"built {out}")
    return True


def publish(tmp: Path, out: Path) -> None:
    """Puts a model built in `tmp` (a mkdtemp beside `out`) in place of `out`, readable by all."""
    # mkdtemp makes a private directory; the model is meant to be read by every local user.
    for path in [tmp, *tmp.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reef_shim.tiny_model", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="model directory to create")
    p.add_argument("--seed", type=int, default=0, help="weight init seed (default 0)")
    p.add_argument("--quiet", action="store_true", help="print nothing")
    p.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = p.parse_args(argv)
    build(args.out, seed=args.seed, quiet=args.quiet, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
