"""What a rank computes from its tasks before the objective: ℓθ, the teacher's view, the batch.

Distribution policy (docs/training.md "Which distribution"):
- ℓθ (policy, with gradient) uses the engine's own transform, `engine_logprobs` with the task's
  temperature / top_k / top_p in the engine's convention (the hf engine: the distribution sampled
  from; SGLang: logits / temperature before truncation), because the RL ratio and the OPD ratio
  divide by ℓold, which the engine recorded so. Before any update ℓθ == ℓold up to rounding.
- The teacher is a target, not a sampler: its log-probs are the plain `log_softmax` of its logits
  (temperature 1, no truncation), and its own top-K is taken from that distribution.

Sequences are right-padded and run without an attention mask: with a causal model no real token
attends to a later (padding) position, and position ids stay 0..n-1, so padding changes nothing.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from ..engines.sampling import LOGPROB_FLOOR, engine_logprobs
from .tasks import TrainTask

PAD_ID = 0
TEACHER_ROWS_PER_FORWARD = 4  # bounds the [rows, length, vocab] logits of one teacher forward


def _right_pad(seqs: list[np.ndarray], device: torch.device) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.from_numpy(s)
    return out.to(device)


@contextmanager
def _head_on_rows(model: Any, starts: torch.Tensor, width: int) -> Iterator[None]:
    """While open, the model's output head sees only `width` positions of each row, from that row's
    start: [B, L, H] hidden states become [B, width, H] before the vocabulary projection.

    The logits of the context positions are never used, and over a large vocabulary they are most of
    a step's activation memory (a [B, L, V] tensor, kept again for the backward pass) and, for the
    Qwen3 shapes of bench/gpu_train.py (512-token contexts, 256-token responses), 6–17% of its
    FLOPs. transformers' `logits_to_keep` keeps the same positions in every row; responses start at
    a different column in each right-padded row. The selection is made in a pre-hook of
    the head inside the model's own forward, so a sharded (FSDP2) root still gathers its parameters
    as usual."""
    index = (starts[:, None] + torch.arange(width, device=starts.device)[None, :])

    def select(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0]
        rows = index.clamp(max=hidden.shape[1] - 1)  # a shorter response's tail: cut off below
        picked = hidden.gather(1, rows[:, :, None].expand(-1, -1, hidden.shape[-1]))
        return (picked, *args[1:])

    handle = model.get_output_embeddings().register_forward_pre_hook(select)
    try:
        yield
    finally:
        handle.remove()


def response_logits(model: Any, contexts: list[np.ndarray], responses: list[np.ndarray],
                    device: torch.device) -> list[torch.Tensor]:
    """Logits predicting each response token given context + the response before it: [T_i, V] each."""
    ids = _right_pad([np.concatenate([c, r]) for c, r in zip(contexts, responses)], device)
    starts = torch.tensor([len(c) - 1 for c in contexts], dtype=torch.long, device=device)
    width = max(len(r) for r in responses)
    with _head_on_rows(model, starts, width):
        logits = model(input_ids=ids, use_cache=False).logits  # [B, width, V]
    return [logits[i, :len(r)] for i, r in enumerate(responses)]


def dims(tasks: list[TrainTask]) -> tuple[int, int, int]:
    """Padded (T, K, H) of a batch."""
    return max(t.T for t in tasks), max(t.K for t in tasks), max(t.H for t in tasks)


def policy_logprobs(model: Any, tasks: list[TrainTask], device: torch.device,
                    convention: str = "sampled") -> tuple[torch.Tensor, torch.Tensor]:
    """ℓθ of the response tokens [B,T] and of the recorded top-K ids [B,T,K], with gradient, in the
    rollout engine's logprob `convention` (`engine_logprobs`), so that before any update ℓθ = ℓold.

    Values below the engine's floor (tokens outside the sampled support) are clamped to it, as the
    engine does on the wire, so a -inf can never reach a ratio or a metric.
    """
    T, K, _ = dims(tasks)
    logits = response_logits(model, [t.prompt_ids for t in tasks], [t.response_ids for t in tasks], device)
    logp_rows, topk_rows = [], []
    for task, lg in zip(tasks, logits):
        lp = engine_logprobs(lg, convention, task.temperature, task.top_k, task.top_p)  # [T_b, V]
        resp = torch.from_numpy(task.response_ids).to(device)
        logp = lp.gather(-1, resp[:, None]).squeeze(-1).clamp(min=LOGPROB_FLOOR)
        ids = torch.from_numpy(task.topk_ids).to(device).clamp(min=0)
        topk = lp.gather(-1, ids).clamp(min=LOGPROB_FLOOR)
        logp_rows.append(F.pad(logp, (0, T - task.T)))
        topk_rows.append(F.pad(topk, (0, K - task.K, 0, T - task.T)))
    return torch.stack(logp_rows), torch.stack(topk_rows)


@torch.no_grad()
def teacher_scores(model: Any, tasks: list[TrainTask], device: torch.device) -> dict[str, torch.Tensor]:
    """For every teacher candidate: its log-probs on the recorded top-K ids and its own top-K ids.

    Returns `teacher_topk_logp [B,H,T,K]`, `teacher_top_ids [B,H,T,K]` (-1 = padding) and
    `cand_mask [B,H]`.
    """
    T, K, H = dims(tasks)
    B = len(tasks)
    t_logp = torch.zeros(B, H, T, K, device=device)
    t_ids = torch.full((B, H, T, K), -1, dtype=torch.long, device=device)
    cand = torch.zeros(B, H, dtype=torch.bool, device=device)
    pairs = [(b, h) for b, task in enumerate(tasks) for h in range(task.H)]
    for start in range(0, len(pairs), TEACHER_ROWS_PER_FORWARD):
        chunk = pairs[start:start + TEACHER_ROWS_PER_FORWARD]
        logits = response_logits(model, [tasks[b].teacher_prompt_ids[h] for b, h in chunk],
                                 [tasks[b].response_ids for b, _ in chunk], device)
        for (b, h), lg in zip(chunk, logits):
            task = tasks[b]
            lp = torch.log_softmax(lg.float(), dim=-1)
            ids = torch.from_numpy(task.topk_ids).to(device).clamp(min=0)
            t_logp[b, h, :task.T, :task.K] = lp.gather(-1, ids)
            t_ids[b, h, :task.T, :task.K] = torch.topk(lp, task.K, dim=-1).indices
            cand[b, h] = True
    return {"teacher_topk_logp": t_logp, "teacher_top_ids": t_ids, "cand_mask": cand}


def recorded(tasks: list[TrainTask], device: torch.device) -> dict[str, torch.Tensor]:
    """The engine's side of the batch, padded: `logp_old`, `mask`, `reward`, `topk_ids`, `topk_logp_old`."""
    T, K, _ = dims(tasks)
    B = len(tasks)
    logp_old = torch.zeros(B, T)
    mask = torch.zeros(B, T)
    topk_ids = torch.full((B, T, K), -1, dtype=torch.long)
    topk_old = torch.full((B, T, K), LOGPROB_FLOOR)
    for b, task in enumerate(tasks):
        logp_old[b, :task.T] = torch.from_numpy(task.logprobs)
        mask[b, :task.T] = 1.0  # every response token is in the loss (the TS side sends only the turn's)
        topk_ids[b, :task.T, :task.K] = torch.from_numpy(task.topk_ids)
        topk_old[b, :task.T, :task.K] = torch.from_numpy(task.topk_logprobs)
    reward = torch.tensor([t.reward for t in tasks], dtype=torch.float32)
    out = {"logp_old": logp_old, "mask": mask, "reward": reward, "topk_ids": topk_ids, "topk_logp_old": topk_old}
    return {k: v.to(device) for k, v in out.items()}


def objective_batch(model: Any, teacher: Any, tasks: list[TrainTask], device: torch.device,
                    convention: str = "sampled") -> dict[str, torch.Tensor]:
    """Every tensor `openclawrl_loss` takes; `logp_new`/`topk_logp_new` carry the policy's graph."""
    logp_new, topk_new = policy_logprobs(model, tasks, device, convention)
    return {"logp_new": logp_new, "topk_logp_new": topk_new, **recorded(tasks, device),
            **teacher_scores(teacher, tasks, device)}


def opd_entries(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Valid (t, v) entries of OPD tokens: the denominator of `opd_clip_frac` and `mean_abs_d`."""
    valid = (batch["topk_ids"] >= 0) & torch.isfinite(batch["topk_logp_old"]) & (batch["topk_logp_old"] > LOGPROB_FLOOR)
    opd_tok = batch["mask"].bool() & batch["cand_mask"].any(-1)[:, None]
    return (valid & opd_tok[..., None]).sum()
