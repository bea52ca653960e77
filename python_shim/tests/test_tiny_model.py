"""The tiny model builds reproducibly and loads as an ordinary Hugging Face model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reef_shim import tiny_model

SHIM = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    assert tiny_model.build(out, quiet=True)
    return out


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_two_builds_are_byte_identical(model_dir: Path, tmp_path: Path) -> None:
    # The second build runs in a fresh interpreter through the CLI, as scripts/setup.sh does.
    other = tmp_path / "again"
    env = {**os.environ, "PYTHONPATH": str(SHIM)}
    subprocess.run([sys.executable, "-m", "reef_shim.tiny_model", "--out", str(other), "--quiet"],
                   check=True, env=env, timeout=300)
    mine, theirs = _files(model_dir), _files(other)
    assert sorted(mine) == sorted(theirs)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "generation_config.json", "reef_build.json"} <= set(mine)
    for name in mine:
        assert mine[name] == theirs[name], f"{name} differs between builds"


def test_up_to_date_build_is_skipped_and_seed_changes_weights(model_dir: Path, tmp_path: Path) -> None:
    assert tiny_model.build(model_dir, quiet=True) is False
    assert tiny_model.is_current(model_dir, seed=0)
    assert not tiny_model.is_current(model_dir, seed=1)
    other = tmp_path / "seed1"
    tiny_model.build(other, seed=1, quiet=True)
    assert (other / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (model_dir / "model.safetensors").read_bytes()
    assert json.loads((other / "reef_build.json").read_text())["seed"] == 1


def test_loads_with_auto_classes(model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.vocab_size == len(tok) == 2048
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert tok.convert_tokens_to_ids("<|im_end|>") in gen["eos_token_id"]
    ids = tok("Hello, world!", add_special_tokens=False, return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 2048) and logits.dtype == torch.float32


@pytest.mark.parametrize("text", [
    "<|im_start|>user\nhi<|im_end|>", "<think>\nhmm\n</think>", "<tool_call>\n{}\n</tool_call>",
    "<tool_response>ok</tool_response><|endoftext|>", "Ünïcödé 日本語 🌊 \t\r\n  x", "12 * 7 = 84",
])
def test_text_round_trips(model_dir: Path, text: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
                    "</tool_call>", "<tool_response>", "</tool_response>"):
        assert len(tok.encode(special, add_special_tokens=False)) == 1, special


def test_chat_template_renders_tools_calls_results_and_thinking(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}]},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Use the tool.", "tool_calls": [
            {"type": "function", "id": "a", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"type": "function", "id": "b", "function": {"name": "get_weather", "arguments": {"city": "Lyon"}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "rain"}]},
        {"role": "assistant", "content": "Sunny in Paris."},
        {"role": "user", "content": "Thanks"},
    ]
    out = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\nBe brief.\n\n# Available tools")
    assert json.dumps(tools[0]) + "\n</tools>" in out
    assert "<|im_start|>user\nWeather in Paris?<|im_end|>\n" in out
    assert ("<|im_start|>assistant\n<think>\nUse the tool.\n</think>\n\nChecking.\n"
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call><|im_end|>\n') in out
    assert ("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\nSunny in Paris.<|im_end|>\n") in out
    assert out.endswith("<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n")
    # The rendering of a shorter conversation is a prefix of the longer one (needed by the trainer).
    shorter = tok.apply_chat_template(messages[:3], tools=tools, tokenize=False)
    assert out.startswith(shorter)
    plain = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n"
    ids = tok.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.decode(ids) == out
