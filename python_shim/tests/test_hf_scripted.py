"""Scripted outputs of the `hf` engine: forced replies carry the model's own logprobs, greedy
requests and unmatched prompts are the model's own, and a bad script is refused by key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reef_shim import tiny_model
from reef_shim.engines.hf_engine import HFEngine
from reef_shim.engines.request import parse_generate
from reef_shim.engines.sampling import tempered_logprobs
from reef_shim.engines.scripted import Script, ScriptError

CALL = '<tool_call>\n{"name": "run_shell", "arguments": {"command": "ls"}}\n</tool_call>'


TINY = Path(__file__).resolve().parents[2] / ".cache" / "tiny-model"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The set-up's build when there is one (read only here); else a fresh build of the same.
    if (TINY / "model.safetensors").exists():
        return TINY
    out = tmp_path_factory.mktemp("tiny") / "model"
    tiny_model.build(out, seed=0, quiet=True)
    return out


@pytest.fixture(scope="module")
def engine(model: Path) -> HFEngine:
    script = Script.parse({"rules": [{"when": ["list", "<tool_response>"], "replies": ["Done."]},
                                     {"when": ["list"], "replies": [CALL, "I cannot."]}]})
    return HFEngine(str(model), weight_version="v0", seed=3, script=script)


def generate(engine: HFEngine, prompt: str, temperature: float, max_new_tokens: int = 64) -> dict:
    req = parse_generate({"text": prompt, "return_logprob": True, "top_logprobs_num": 3, "rid": "r",
                          "sampling_params": {"temperature": temperature, "max_new_tokens": max_new_tokens}})
    with engine.lock:
        *_, state = engine.generate(req, lambda: None)
    return {"ids": list(state.output_ids), "text": state.text, "lps": [lp[0] for lp in state.token_logprobs],
            "top": state.top_logprobs, "finish": state.finish, "prompt": engine.encode(prompt)}


def test_forced_replies_in_turn_with_the_models_own_logprobs(engine: HFEngine) -> None:
    prompt = "<|im_start|>user\nlist the files<|im_end|>\n<|im_start|>assistant\n"
    first, second, third = (generate(engine, prompt, 1.0) for _ in range(3))
    assert [first["text"], second["text"], third["text"]] == [CALL, "I cannot.", CALL]
    assert first["ids"][-1] == engine.end_of_reply and first["finish"]["type"] == "stop"
    # The reported logprobs are the model's for the forced tokens, as a trainer recomputes them.
    ids = torch.tensor([first["prompt"] + first["ids"]])
    with torch.inference_mode():
        logits = engine.model(ids).logits[0, len(first["prompt"]) - 1:-1]
    want = tempered_logprobs(logits, 1.0).gather(-1, torch.tensor(first["ids"]).unsqueeze(1)).squeeze(1)
    assert max(abs(a - b) for a, b in zip(first["lps"], want.tolist())) < 1e-4
    assert all(len(t) == 3 for t in first["top"])
    # After a tool response the first rule applies.
    follow = prompt + CALL + "<|im_end|>\n<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert generate(engine, follow, 0.7)["text"] == "Done."


def test_greedy_and_unmatched_requests_are_the_models_own(engine: HFEngine) -> None:
    matched = "<|im_start|>user\nlist the files<|im_end|>\n<|im_start|>assistant\n"
    unmatched = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    scripted = [generate(engine, matched, 0.0, 12)["ids"], generate(engine, unmatched, 1.0, 12)["ids"]]
    script, engine.script = engine.script, None
    try:
        own = [generate(engine, matched, 0.0, 12)["ids"], generate(engine, unmatched, 1.0, 12)["ids"]]
    finally:
        engine.script = script
    # Same weights, same rid and seed: the same tokens with the script as without it.
    assert scripted == own
    assert engine.decode(scripted[0]) not in (CALL, "I cannot.", "Done.")


@pytest.mark.parametrize("raw, where", [
    ([], "expected an object"),
    ({"rules": []}, "at least one rule"),
    ({"rules": [{"when": ["a"]}]}, "rules[0]: expected an object with exactly the keys"),
    ({"rules": [{"when": [], "replies": ["x"]}]}, "rules[0].when"),
    ({"rules": [{"when": ["a"], "replies": ["x"]}, {"when": ["b"], "replies": [1]}]}, "rules[1].replies"),
])
def test_bad_scripts_name_the_key(raw: object, where: str) -> None:
    with pytest.raises(ScriptError, match=where.replace("[", r"\[").replace("]", r"\]")):
        Script.parse(raw, "s.json")


def test_an_unreadable_script_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "s.json"
    bad.write_text("{not json")
    with pytest.raises(ScriptError, match="--scripted-outputs .*s.json"):
        Script.load(bad)
