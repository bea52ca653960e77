"""engines/weights.py: the config check that guards update_weights_from_disk and trainer-load."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from reef_shim.engines.weights import WeightError, check_config, load_checked_state_dict

# A config.json as many hubs ship it: no head_dim, num_key_value_heads or tie_word_embeddings,
# each of which the config class fills in with a default.
SPARSE = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "intermediate_size": 128, "architectures": ["LlamaForCausalLM"]}


def _dir(tmp_path: Path, name: str, config: dict) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_a_config_file_that_leaves_defaults_out_matches_the_model_built_from_it(tmp_path: Path) -> None:
    base = _dir(tmp_path, "base", SPARSE)
    served = transformers.AutoConfig.from_pretrained(base)
    check_config(base, served)  # a checkpoint copies the base's config.json as it is
    check_config(_dir(tmp_path, "explicit", served.to_dict()), served)


@pytest.mark.parametrize("change,key", [({"num_key_value_heads": 2}, "num_key_value_heads"),
                                        ({"head_dim": 32}, "head_dim"),
                                        ({"model_type": "mistral"}, "model_type"),
                                        ({"tie_word_embeddings": True}, "tie_word_embeddings")])
def test_another_shape_is_still_refused(tmp_path: Path, change: dict, key: str) -> None:
    served = transformers.AutoConfig.from_pretrained(_dir(tmp_path, "base", SPARSE))
    with pytest.raises(WeightError, match=f"does not match the served model .*{key}"):
        check_config(_dir(tmp_path, "other", {**SPARSE, **change}), served)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    from reef_shim import tiny_model

    out = tmp_path_factory.mktemp("tiny") / "model"
    tiny_model.build(out, seed=0, quiet=True)
    return out, transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)


def _with(tmp_path: Path, base: Path, name: str, change: Callable[[torch.Tensor], torch.Tensor]) -> Path:
    out = tmp_path / "changed"
    shutil.copytree(base, out)
    state = load_file(str(out / "model.safetensors"))
    state[name] = change(state[name])
    save_file(state, str(out / "model.safetensors"))
    return out


def test_a_tensor_of_integers_is_refused_naming_its_file_and_name(tmp_path: Path, tiny: tuple[Path, torch.nn.Module]) -> None:
    # Its shape is right, and copying it into the float weights cast it unseen (a quantized export).
    base, model = tiny
    name = "model.layers.0.mlp.down_proj.weight"
    bad = _with(tmp_path, base, name, lambda t: t.round().to(torch.int8))
    with pytest.raises(WeightError, match=rf"^model\.safetensors: {re.escape(name)}: dtype int8, the model holds float32$"):
        load_checked_state_dict(bad, model.config, model)


def test_another_float_width_loads_as_the_model_s_own(tmp_path: Path, tiny: tuple[Path, torch.nn.Module]) -> None:
    base, model = tiny  # a bf16 base model, say, loaded into the fp32 trainer by a rollback to the base
    name = "model.layers.0.mlp.down_proj.weight"
    state = load_checked_state_dict(_with(tmp_path, base, name, lambda t: t.to(torch.bfloat16)), model.config, model)
    assert state[name].dtype == torch.bfloat16 and set(state) >= {name}


def test_a_misshapen_tensor_is_refused_naming_its_file(tmp_path: Path, tiny: tuple[Path, torch.nn.Module]) -> None:
    base, model = tiny
    name = "model.layers.1.self_attn.q_proj.weight"
    bad = _with(tmp_path, base, name, lambda t: t[:-1].clone())
    with pytest.raises(WeightError, match=rf"^model\.safetensors: {re.escape(name)}: shape \("):
        load_checked_state_dict(bad, model.config, model)
