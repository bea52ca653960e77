"""The experiment's KL-to-base figure: 0 for the base itself, and the exact KL for a changed model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from reef_shim.eval_kl import main, reference_kl

TINY = Path(__file__).resolve().parents[2] / ".cache" / "tiny-model"
LINES = [
    {"messages": [{"role": "user", "content": "What is 3 + 4?"}], "response": "It is 7."},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 12 and 5."}],
     "response": "12 + 5 = 17, so the answer is 17."},
]


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("perturbed")
    for f in TINY.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(out)
    return out


def test_the_base_is_at_zero_kl_from_itself() -> None:
    r = reference_kl(str(TINY), str(TINY), LINES)
    assert r["mean_kl"] == 0.0 and r["sequences"] == 2 and r["tokens"] > 4


def test_a_changed_model_gives_the_exact_kl_over_the_vocabulary(perturbed: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    r = reference_kl(str(TINY), str(perturbed), LINES)
    assert r["mean_kl"] > 1e-4
    # By hand, one sequence at a time (no batching, no padding): sum_v p(v) (log p(v) - log q(v)).
    tok = AutoTokenizer.from_pretrained(TINY)
    base = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    pol = AutoModelForCausalLM.from_pretrained(perturbed, dtype=torch.float32).eval()
    total, count = 0.0, 0
    for line in LINES:
        prompt = tok.apply_chat_template(line["messages"], add_generation_prompt=True, tokenize=True, return_dict=False)
        resp = tok(line["response"], add_special_tokens=False)["input_ids"]
        ids = torch.tensor([list(prompt) + resp])
        with torch.no_grad():
            lq = torch.log_softmax(base(input_ids=ids).logits[0], -1)[len(prompt) - 1:-1]
            lp = torch.log_softmax(pol(input_ids=ids).logits[0], -1)[len(prompt) - 1:-1]
        kl = (lp.exp() * (lp - lq)).sum(-1)
        total += float(kl.sum())
        count += len(resp)
    assert r["tokens"] == count
    assert r["mean_kl"] == pytest.approx(total / count, rel=1e-4)


def test_cli_writes_the_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = tmp_path / "ref.jsonl"
    ref.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    out = tmp_path / "kl.json"
    assert main(["--base", str(TINY), "--policy", str(TINY), "--reference", str(ref), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["mean_kl"] == 0.0
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["--base", str(TINY), "--policy", str(TINY), "--reference", str(empty)]) == 2
