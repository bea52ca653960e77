"""One LoRA adapter per scenario in a one-rank trainer (no Ray): what a step trains, what the
teacher sees, what a checkpoint keeps and what loading it brings back."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lora_fixtures import SPEC, TINY, adapter_rank, engine_tasks, sample, totals, train
from reef_shim.engines.hf_engine import HFEngine
from reef_shim.errors import ShimError
from reef_shim.messages import validate_request
from reef_shim.trainer.adapters import AdapterError, adapter_name, check_spec
from reef_shim.trainer.group import TrainerGroup
from reef_shim.trainer.tasks import TrainTask
from trainer_fixtures import load_fp32, spec as trainer_spec


@pytest.fixture(scope="module")
def tasks() -> list[TrainTask]:
    return engine_tasks(HFEngine(str(TINY), weight_version="v0", seed=3))


def _weights(r: object, scenario: str) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in r.adapters.params(adapter_name(scenario)).items()}  # type: ignore[attr-defined]


def test_a_step_trains_only_its_scenarios_adapter_and_the_teacher_stays_the_base(tasks: list[TrainTask],
                                                                                   tmp_path: Path) -> None:
    base = load_fp32(TINY)
    ids = torch.tensor([tasks[0].prompt_ids.tolist()])
    with adapter_rank() as r:
        r.adapters.ensure("B")
        b_before = _weights(r, "B")
        frozen = {n: p.detach().clone() for n, p in r.policy.named_parameters() if "lora_" not in n}
        train(r, "A", tasks, tmp_path, "v1")
        train(r, "A", tasks, tmp_path, "v2")
        a = _weights(r, "A")
        assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in a.items() if "lora_B" in k)
        for k, v in _weights(r, "B").items():
            assert torch.equal(v, b_before[k]), k  # B's adapter and optimizer are another's
        assert not r.adapters.optimizers[adapter_name("B")].state
        for n, p in r.policy.named_parameters():
            if "lora_" not in n:
                assert torch.equal(p, frozen[n]), n  # the base is frozen
        # The teacher is the base with the adapters off: the same logits as the base checkpoint.
        with torch.no_grad():
            assert torch.equal(r.teacher(input_ids=ids, use_cache=False).logits, base(input_ids=ids, use_cache=False).logits)
            adapted = r.policy(input_ids=ids, use_cache=False).logits
        assert not torch.equal(adapted, base(input_ids=ids, use_cache=False).logits)
        assert sum(p.numel() for p in r.policy.parameters()) < 1.2 * sum(p.numel() for p in base.parameters())
    files = sorted(p.name for p in (tmp_path / "v2").iterdir())
    assert files == ["adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "reef_checkpoint.json"]
    meta = json.loads((tmp_path / "v2" / "reef_checkpoint.json").read_text())
    assert meta["scenario"] == "A" and meta["weightVersion"] == "v2"
    config = json.loads((tmp_path / "v2" / "adapter_config.json").read_text())
    assert config["r"] == SPEC["r"] and sorted(config["target_modules"]) == sorted(SPEC["targetModules"])


def test_a_restarted_trainer_resumes_each_adapters_optimizer_exactly(tasks: list[TrainTask], tmp_path: Path) -> None:
    with adapter_rank() as r:
        train(r, "A", tasks, tmp_path, "v1")
        train(r, "B", tasks[:2], tmp_path, "v2")
        saved_opt = {k: v.clone() for k, v in load_file(str(tmp_path / "v1" / "optimizer.safetensors")).items()}
        train(r, "A", tasks, tmp_path, "v3")  # the uninterrupted run's next step
        a_v3 = _weights(r, "A")
    assert any(k.endswith("::exp_avg_sq") for k in saved_opt) and any(k.endswith("::step") for k in saved_opt)
    with adapter_rank() as again:  # a fresh trainer: nothing held
        assert again.load(str(tmp_path / "v1")) is None
        assert again.load(str(tmp_path / "v2")) is None
        name = adapter_name("A")
        params = again.adapters.params(name)
        state = again.adapters.optimizers[name].state
        for key, p in params.items():
            for slot in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(state[p][slot], saved_opt[f"{key}::{slot}"]), (key, slot)
        train(again, "A", tasks, tmp_path / "again", "v3")
        for k, v in _weights(again, "A").items():
            assert torch.equal(v, a_v3[k]), k  # the same step as without the restart, bit for bit


def test_the_trainers_logprobs_under_an_adapter_match_the_engines_under_it(tasks: list[TrainTask], tmp_path: Path) -> None:
    """ℓold parity per adapter, to test_trainer_rank.py's tolerance: the engine samples under A's
    checkpoint, and the trainer holding A scores those replies as the engine recorded them."""
    with adapter_rank() as r:
        train(r, "A", tasks, tmp_path, "v1")
        train(r, "A", tasks, tmp_path, "v2")
    engine = HFEngine(str(TINY), weight_version="v0", seed=3)
    engine.adapters.register("A", str(tmp_path / "v2"))
    prompt = tasks[0].prompt_ids.tolist()
    assert sample(engine, prompt, "A").output_ids != sample(engine, prompt, None).output_ids
    from trainer_fixtures import three_tasks
    from reef_shim.trainer.tasks import decode_tasks

    real_generate = engine.generate
    engine.generate = lambda req, stop: real_generate(_with_lora(req, "A"), stop)  # type: ignore[method-assign]
    under_a = decode_tasks(three_tasks(engine), engine.vocab_size, engine.max_context_length)
    with adapter_rank() as trainer:
        assert trainer.load(str(tmp_path / "v2")) is None
        out = trainer.step("parity", under_a, totals(under_a), None, {}, scenario="A")
    s = out["sums"]
    assert out["error"] is None
    assert s["abs_diff_sum"] / s["tokens"] < 1e-3 and s["abs_diff_max"] < 1e-2, s


def _with_lora(req: object, name: str) -> object:
    req.lora_path = name  # type: ignore[attr-defined]
    return req


def test_a_checkpoint_of_another_adapter_shape_is_refused_and_changes_nothing(tasks: list[TrainTask],
                                                                             tmp_path: Path) -> None:
    with adapter_rank(r=8) as other:
        train(other, "A", tasks[:1], tmp_path, "v1")
    with adapter_rank() as r:
        train(r, "A", tasks[:1], tmp_path / "ours", "v1")
        before = _weights(r, "A")
        why = r.load(str(tmp_path / "v1"))
        assert why is not None and "is not this trainer's" in why
        assert all(torch.equal(v, before[k]) for k, v in _weights(r, "A").items())
        why = r.load(str(TINY))  # a full-weight directory
        assert why is not None and "not a readable adapter checkpoint" in why


@pytest.mark.parametrize("bad, where", [
    ({**SPEC, "type": "ia3"}, "adapter.type"), ({**SPEC, "r": 0}, "adapter.r"), ({**SPEC, "alpha": -1}, "adapter.alpha"),
    ({**SPEC, "dropout": 1.0}, "adapter.dropout"), ({**SPEC, "targetModules": []}, "adapter.targetModules"),
    ({**SPEC, "rank": 4}, "adapter: unknown key(s) rank"),
])
def test_a_bad_adapter_spec_names_its_key(bad: dict[str, object], where: str) -> None:
    with pytest.raises(AdapterError, match=re.escape(f"trainer-start.spec.{where}")):
        check_spec(bad)


def test_the_bridge_messages_take_the_adapter_and_scenario_and_still_take_old_callers(tmp_path: Path) -> None:
    old = {"type": "trainer-start", "requestId": "1", "spec": trainer_spec(str(TINY), str(tmp_path))}
    checked = validate_request(json.loads(json.dumps(old)))
    assert checked == old and "adapter" not in checked["spec"]  # echoed unchanged (test/interop.int.test.ts)
    new = json.loads(json.dumps(old))
    new["spec"]["adapter"] = dict(SPEC)
    assert validate_request(new)["spec"]["adapter"]["r"] == SPEC["r"]
    new["spec"]["adapter"]["r"] = "4"
    with pytest.raises(ShimError, match=r"spec\.adapter\.r"):
        validate_request(new)
    step = {"type": "trainer-step", "requestId": "2", "batchId": "b", "tasks": []}
    assert "scenario" not in validate_request(dict(step))
    assert validate_request({**step, "scenario": "s"})["scenario"] == "s"
    group = TrainerGroup(driver=None)
    group._spec, group._ledger, group._adapter = {"options": {}}, object(), dict(SPEC)  # type: ignore[assignment]
    with pytest.raises(ShimError, match="trainer-step.scenario: required"):
        group.step("b", [], None)
