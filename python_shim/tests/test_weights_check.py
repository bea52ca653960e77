"""engines/weights.py: the config check that guards update_weights_from_disk and trainer-load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from reef_shim.engines.weights import WeightError, check_config

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
