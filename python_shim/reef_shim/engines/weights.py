"""Read and check a checkpoint directory before any byte of it reaches the running model.

Everything that can fail (missing files, another architecture, a missing or misshapen tensor) is
found here, so `update_weights_from_disk` either swaps all weights or none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

# Config fields that decide tensor shapes and semantics; any difference means another model.
SHAPE_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "intermediate_size", "tie_word_embeddings")


class WeightError(Exception):
    pass


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as e:
            raise WeightError(f"cannot read {index}: {e}") from e
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightError(f"no .safetensors files in {path}")
    return files


def check_config(path: Path, config: Any) -> None:
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise WeightError(f"cannot read {path / 'config.json'}: {e}") from e
    if not isinstance(raw, dict):
        raise WeightError(f"{path / 'config.json'}: not a JSON object")
    # Read through the served model's config class: `to_dict()` fills in what a file leaves out
    # (Llama's head_dim, num_key_value_heads...), so a file without them — the base model's own,
    # which every trainer checkpoint copies — compared as None against the served defaults.
    try:
        theirs = {**type(config).from_dict(raw).to_dict(), "model_type": raw.get("model_type")}
    except Exception as e:  # transformers raises assorted types for a config it cannot build
        raise WeightError(f"cannot read {path / 'config.json'} as a {type(config).__name__}: {e}") from e
    ours = config.to_dict()
    diffs = [f"{k}: {ours.get(k)!r} != {theirs.get(k)!r}" for k in SHAPE_KEYS if ours.get(k) != theirs.get(k)]
    if diffs:
        raise WeightError("the checkpoint's config does not match the served model (" + "; ".join(diffs) + ")")


def dtype_str(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def load_checked_state_dict(path: Path, config: Any, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_dir():
        raise WeightError(f"{path} is not a directory")
    check_config(path, config)
    state: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}  # tensor name → the file it came from, for the errors below
    for f in safetensors_files(path):
        try:
            tensors = load_file(str(f), device="cpu")
        except (OSError, SafetensorError) as e:
            raise WeightError(f"cannot read {f}: {e}") from e
        state.update(tensors)
        origin.update(dict.fromkeys(tensors, f.name))
    expected = dict(model.state_dict())
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if tied:
        # A tied head is saved once, as the embedding; it is updated through it.
        expected.pop("lm_head.weight", None)
        state.pop("lm_head.weight", None)
    unexpected = sorted(set(state) - set(expected))
    missing = sorted(set(expected) - set(state))
    if unexpected or missing:
        raise WeightError(f"tensor names differ: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, tensor in state.items():
        want = expected[name]
        if tuple(tensor.shape) != tuple(want.shape):
            raise WeightError(f"{origin[name]}: {name}: shape {tuple(tensor.shape)} != {tuple(want.shape)}")
        # Another float width is converted on load (a bf16 base model into the fp32 trainer); an
        # integer or bool tensor (quantized, or not weights at all) was cast into the weights unseen.
        if tensor.is_floating_point() != want.is_floating_point():
            raise WeightError(f"{origin[name]}: {name}: dtype {dtype_str(tensor.dtype)}, the model holds "
                              f"{dtype_str(want.dtype)}")
        if not torch.isfinite(tensor).all():
            raise WeightError(f"{origin[name]}: {name}: holds NaN or infinite values")
    return state
