"""Training tasks built from real generations of the in-process `hf` engine, as the TS side sends them."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch

from reef_shim.engines.hf_engine import HFEngine
from reef_shim.engines.request import parse_generate

QUESTION = "What is 12 + 7?"
HINTS = ["Add the ones first.", "The answer is a number below 20."]


def chat(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def with_hint(user: str, hint: str) -> str:
    # The hint goes after a blank line and a short marker line (ARCHITECTURE.md §4).
    return f"{user}\n\n[hint]\n{hint}"


def generate(engine: HFEngine, prompt_ids: list[int], temperature: float, top_p: float, top_k: int, k: int,
             seed: int, max_new: int = 24) -> Any:
    req = parse_generate({"input_ids": prompt_ids, "return_logprob": True, "top_logprobs_num": k,
                          "sampling_params": {"max_new_tokens": max_new, "temperature": temperature, "top_p": top_p,
                                              "top_k": top_k, "ignore_eos": True, "sampling_seed": seed}})
    with engine.lock:
        *_, last = engine.generate(req, lambda: None)  # None: nothing asks it to stop
    return last


def i32(values: list[int]) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def f32(values: list[float]) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def task(engine: HFEngine, task_id: str, *, temperature: float, top_p: float = 1.0, top_k: int = -1, k: int = 4,
         hints: list[str], reward: float, seed: int, user: str = QUESTION) -> dict[str, Any]:
    """A wire Task from one generation: the recorded logprobs and top-K are the engine's own."""
    prompt = engine.encode(chat(user))
    state = generate(engine, prompt, temperature, top_p, top_k, k, seed)
    top_ids = [[e[1] for e in row] for row in state.top_logprobs]
    top_lp = [[e[0] for e in row] for row in state.top_logprobs]
    return {
        "taskId": task_id,
        "promptIds": i32(prompt),
        "responseIds": i32(state.output_ids),
        "logprobs": f32([e[0] for e in state.token_logprobs]),
        "topK": k,
        "topkIds": i32([i for row in top_ids for i in row]),
        "topkLogprobs": f32([x for row in top_lp for x in row]),
        "reward": reward,
        "teacherPromptIds": [i32(engine.encode(chat(with_hint(user, h)))) for h in hints],
        "sampling": {"temperature": temperature, "topP": top_p, "topK": top_k},
        "weightVersion": engine.weight_version,
    }


def options(**over: Any) -> dict[str, Any]:
    base = {"wRl": 1.0, "wOpd": 1.0, "clipC": 1.0, "hintSelection": "sequence_optimal", "lr": 1e-5, "epsLow": 0.2,
            "epsHigh": 0.28, "weightDecay": 0.1, "betas": [0.9, 0.98], "topK": 4, "dtype": "fp32", "oldLogprobs": "trainer",
            "tisCap": 2.0, "klCoef": 0.0, "clipGrad": 1.0, "microBatchTokens": 2048, "gradCheckpointing": "off"}
    return {**base, **over}


def spec(model: str, checkpoint_dir: str, ranks: int = 2, **opts: Any) -> dict[str, Any]:
    return {"modelPath": model, "ranks": ranks, "backend": "fsdp2", "options": options(**opts),
            "engineLogprobs": "tempered", "checkpointDir": checkpoint_dir, "seed": 0, "group": "reef-trainer"}


def three_tasks(engine: HFEngine) -> list[dict[str, Any]]:
    """The trainer tests' batch: sampled at T = 0.8 / top_p 0.9 with two hints, greedy with one,
    top_k 2 < K with none (72 response tokens, 48 of them with a teacher). The engine reports
    SGLang's tempered logprobs, before top-k / top-p, the convention the trainer scores in: with
    the truncation the two differ only if the trainer got it wrong."""
    return [
        task(engine, "sampled", temperature=0.8, top_p=0.9, hints=HINTS, reward=1.0, seed=11),
        task(engine, "greedy", temperature=0.0, hints=HINTS[:1], reward=-1.0, seed=12),
        task(engine, "top-k-2", temperature=0.8, top_p=0.9, top_k=2, hints=[], reward=1.0, seed=13,
             user="Name a colour."),
    ]


def probe(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """A seeded, sampled /generate body on the first task's prompt: what an engine serves after a sync."""
    return {"input_ids": list(torch.frombuffer(bytearray(tasks[0]["promptIds"]), dtype=torch.int32).tolist()),
            "return_logprob": True, "top_logprobs_num": 4,
            "sampling_params": {"max_new_tokens": 12, "temperature": 0.8, "sampling_seed": 5, "ignore_eos": True}}


def load_fp32(model: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)


def reference_step(model: Path, tasks: list[dict[str, Any]], lr: float) -> tuple[float, float]:
    """(loss, gradient norm) of one CPU process on the whole batch: what a group of any size must give."""
    from recipes.openclawrl.objective import objective_from_options, openclawrl_loss
    from reef_shim.trainer.loss import local_loss
    from reef_shim.trainer.scoring import objective_batch
    from reef_shim.trainer.tasks import decode_tasks

    ref = load_fp32(model)
    batch = objective_batch(ref, load_fp32(model).requires_grad_(False), decode_tasks(tasks, 2048, 4096),
                            torch.device("cpu"))
    loss, _ = local_loss(batch, objective_from_options(options(lr=lr)), {"tokens": 72.0}, 1,
                         openclawrl_loss)
    loss.backward()
    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in ref.parameters() if p.grad is not None))
    return loss.item(), norm.item()


def assert_same_outputs(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two /generate answers with the same tokens, logprobs and top-K."""
    for key in ("output_token_logprobs", "output_top_logprobs"):
        assert a["meta_info"][key] == b["meta_info"][key]
    assert a["output_ids"] == b["output_ids"]


@contextmanager
def scoped_env(**values: str) -> Iterator[None]:
    """Set environment variables for a block (a Ray head started inside passes them to its workers)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def placed_driver(layout: dict[str, Any], num_cpus: int, num_gpus: int, **env: str) -> Iterator[Any]:
    """A RayDriver with a local head (`num_cpus`, logical `num_gpus`) and `layout` placed, started
    inside `env` (which the head hands to its actors); closed after the block."""
    from reef_shim.ray_driver import RayDriver  # needs ray: imported by the tests that have it

    with scoped_env(**env):
        d = RayDriver()
        try:
            d.init_ray(None, num_cpus, num_gpus, None)
            d.create_placement(layout, 120)
            yield d
        finally:
            d.close()


def check_push_serves_its_checkpoint(eng: Any, body: dict[str, Any], pushed: dict[str, Any], served: dict[str, Any],
                                     checkpoint_path: str) -> None:
    """After `pushed` (a trainer-push-weights reply) the running engine `eng` answered `body` with
    `served`: the push carried the checkpoint's tensors (a tied lm_head once, as the embedding), the
    engine serves its version, and loading the checkpoint from disk serves exactly the same."""
    from safetensors.torch import load_file

    assert pushed["bytes"] == sum(t.numel() * t.element_size()
                                  for t in load_file(str(Path(checkpoint_path) / "model.safetensors")).values())
    assert served["meta_info"]["weight_version"] == pushed["weightVersion"]
    status, r = eng.call("/update_weights_from_disk", {"model_path": checkpoint_path, "weight_version": "disk"})
    assert status == 200 and r["success"], r
    assert_same_outputs(eng.generate(**body), served)


def params_differ(a: Path, b: Path) -> list[str]:
    """The tensors two checkpoint directories hold differently (they must hold the same names)."""
    from safetensors.torch import load_file

    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert set(x) == set(y)
    return [k for k in x if not torch.equal(x[k], y[k])]


def check_bf16_step(step: dict[str, Any], model: Path, tasks: list[dict[str, Any]], lr: float) -> None:
    """A `--dtype bf16` step on `three_tasks`: bf16 rounding against the fp32 engine, not another
    distribution; loss and gradient near fp32's; AdamW moved the fp32 master weights."""
    from safetensors.torch import load_file

    m = step["metrics"]
    print(f"\nbf16 step metrics: {m}")
    assert step["trained"] is True and all(torch.isfinite(torch.tensor(v)) for v in m.values())
    # Far above fp32's ~1e-7, far below what a wrong transform or a wrong position gives (~1).
    assert 1e-4 < m["train_rollout_logprob_abs_diff"] < 5e-2, m
    loss, norm = reference_step(model, tasks, lr)
    assert m["loss"] == pytest.approx(loss, abs=0.01) and m["grad_norm"] == pytest.approx(norm, rel=0.02)
    saved = load_file(str(Path(step["checkpointPath"]) / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}
    assert len(params_differ(model, Path(step["checkpointPath"]))) > 10
