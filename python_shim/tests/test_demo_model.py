"""The demo model: a deterministic build, and the habit the closed-loop demo trains away (bold in
about half of the first replies, almost never with a formatting hint in the prompt)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reef_shim import demo_model
from reef_shim.demo_corpus import HINT_MARKER, SAVE_TOOL, conversations, with_hint
from reef_shim.demo_eval import habit_stats
from reef_shim.demo_problems import problems

SHIM = Path(__file__).resolve().parents[1]
ROOT = SHIM.parent
SHORT = 3  # pre-training steps of the reduced builds that check determinism


def _weights_hash(d: Path) -> str:
    return hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()


def test_reduced_builds_are_identical_and_cached(tmp_path: Path) -> None:
    first = tmp_path / "a"
    assert demo_model.build(first, steps=SHORT, quiet=True)
    assert demo_model.build(first, steps=SHORT, quiet=True) is False  # up to date: left alone
    assert demo_model.is_current(first, steps=SHORT) and not demo_model.is_current(first, steps=SHORT + 1)
    # The second build runs in a fresh interpreter through the CLI, as set-up does.
    env = {**os.environ, "PYTHONPATH": str(SHIM)}
    subprocess.run([sys.executable, "-m", "reef_shim.demo_model", "--out", str(tmp_path / "b"), "--steps",
                    str(SHORT), "--quiet"], check=True, env=env, timeout=600)
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja", "reef_demo.json"} <= set(names)
    for name in names:
        assert (first / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    # The tiny model's tokenizer recipe: same size, same special and added tokens at the same ids.
    from tokenizers import Tokenizer

    from reef_shim import tiny_model

    tok = Tokenizer.from_file(str(first / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == tiny_model.BPE_VOCAB + 9
    for i, t in enumerate(tiny_model.SPECIAL_TOKENS + tiny_model.ADDED_TOKENS):
        assert tok.token_to_id(t) == tiny_model.BPE_VOCAB + i


def test_corpus_and_problems_are_deterministic() -> None:
    assert conversations(20, 7) == conversations(20, 7)
    assert problems(12, 3) == problems(12, 3)
    assert with_hint("Solve it.", "no bold") == f"Solve it.\n\n{HINT_MARKER}\nno bold"
    for p in problems(60, 11):
        assert len(p.steps) >= 2 and isinstance(p.answer, int)
        assert str(p.answer) in p.shown


def test_habit_stats_reads_bold_lists_and_steps() -> None:
    texts = ["3 × 4 = 12, then 12 + 5 = 17. So **17**.", "1. 3 × 4 = 12\n2. 12 + 5 = 17", "It is 17."]
    stats = habit_stats(texts, [17, 17, 17])
    assert stats["bold"] == pytest.approx(1 / 3) and stats["list"] == pytest.approx(1 / 3)
    assert stats["two_steps"] == pytest.approx(2 / 3) and stats["answer_present"] == 1.0


@pytest.fixture(scope="module")
def full_model() -> Path:
    """The demo model as set-up builds it (.cache/demo-model); built here when missing (minutes)."""
    out = Path(os.environ.get("REEF_DEMO_MODEL", ROOT / ".cache" / "demo-model"))
    demo_model.build(out, quiet=True)
    return out


def test_bold_habit_and_hint(full_model: Path) -> None:
    from reef_shim.demo_eval import measure

    # Seeded draws with the engine's sampler at temperature 1. The hint's effect is asserted relative to
    # the plain rate: an absolute bound of 0.10 held for one sampler's draws (6/60) and not the next (9/60).
    result = measure(full_model, 60, temperature=1.0, seed=0)
    assert result["plain"]["bold"] >= 0.30, result
    assert result["hinted"]["bold"] <= result["plain"]["bold"] / 2, result
    assert result["plain"]["two_steps"] >= 0.8, result


def test_complaint_gets_a_plain_rewrite_and_save_a_tool_call(full_model: Path) -> None:
    import json
    import random
    import re

    from reef_shim.demo_corpus import SYSTEM_PROMPT, plain_reply
    from reef_shim.demo_eval import load, sample

    tok, model = load(full_model)
    rng = random.Random(3)
    rewrites, saves = [], []
    for p in problems(12, 4242):
        plain = plain_reply(p, rng)
        ask = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": p.question}]
        complain = ask + [{"role": "assistant", "content": "**Solution:** " + plain},
                          {"role": "user", "content": "please don't use bold text, it looks AI-written. Can you "
                                                      "rewrite it as normal sentences?"}]
        save = ask + [{"role": "assistant", "content": plain}, {"role": "user", "content": "great, please save it"}]
        for msgs, out in ((complain, rewrites), (save, saves)):
            out.append(list(tok.apply_chat_template(msgs, tools=[SAVE_TOOL], add_generation_prompt=True,
                                                    tokenize=True, return_dict=False)))
    texts = [tok.decode(o, skip_special_tokens=False) for o in sample(model, rewrites + saves, 1.0, seed=1)]
    assert habit_stats(texts[:12])["bold"] <= 0.2, texts[:12]
    calls = [re.fullmatch(r"<tool_call>\n(.*)\n</tool_call><\|im_end\|>", t, re.S) for t in texts[12:]]
    parsed = []
    for m in calls:
        try:
            parsed.append(json.loads(m.group(1)) if m else None)
        except ValueError:
            parsed.append(None)
    good = [c for c in parsed if c and c.get("name") == "save_homework" and c["arguments"].get("content")]
    assert len(good) >= 8, texts[12:]
    assert not any("HOMEWORK_DONE" in t for t in texts)
