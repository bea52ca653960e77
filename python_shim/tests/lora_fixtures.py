"""LoRA adapters trained by a real one-rank trainer on the tiny model, for the adapter tests."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from reef_shim.engine_process import pick_free_port
from reef_shim.engines.hf_engine import HFEngine
from reef_shim.engines.request import parse_generate
from reef_shim.trainer.rank import TrainerRank
from reef_shim.trainer.tasks import TrainTask, decode_tasks
from trainer_fixtures import options, scoped_env, three_tasks

TINY = Path(__file__).resolve().parents[2] / ".cache" / "tiny-model"
SPEC = {"type": "lora", "r": 4, "alpha": 8.0, "dropout": 0.0, "targetModules": ["q_proj", "v_proj", "down_proj"]}


@contextmanager
def adapter_rank(model: Path = TINY, lr: float = 1e-2, **spec: Any) -> Iterator[TrainerRank]:
    with scoped_env(REEF_TRAINER_DEVICE="cpu"):
        r = TrainerRank(0, 1, seed=0, threads=torch.get_num_threads(), crash_hook=None)
        r.setup(("127.0.0.1", pick_free_port("127.0.0.1")), str(model),
                {**options(lr=lr), "engineLogprobs": "tempered", "adapter": {**SPEC, **spec}})
    try:
        yield r
    finally:
        r.close()


def engine_tasks(engine: HFEngine) -> list[TrainTask]:
    return decode_tasks(three_tasks(engine), engine.vocab_size, engine.max_context_length)


def totals(tasks: list[TrainTask]) -> dict[str, float]:
    return {"tokens": float(sum(t.T for t in tasks))}


def train(r: TrainerRank, scenario: str, tasks: list[TrainTask], out: Path, version: str) -> dict[str, Any]:
    result = r.step(f"{scenario}:{version}", tasks, totals(tasks), str(out / version),
                    {"weightVersion": version, "batchId": f"{scenario}:{version}"}, scenario=scenario)
    assert result["error"] is None, result
    return result


def sample(engine: HFEngine, prompt: list[int], lora: str | None, seed: int = 5, n: int = 16) -> Any:
    """One seeded, sampled generation in the caller's thread (the engine's `generate` path)."""
    req = parse_generate({"input_ids": prompt, "return_logprob": True, "lora_path": lora,
                          "sampling_params": {"max_new_tokens": n, "temperature": 1.0, "sampling_seed": seed,
                                              "ignore_eos": True}})
    with engine.lock:
        *_, last = engine.generate(req, lambda: None)
    return last
