"""What a rank computes from its tasks before the objective: ℓθ, the teacher's view, the batch.

Distribution policy (docs/training.md "Which distribution"): one distribution for ℓold, the
teacher and the policy. All three are `engine_logprobs` in the engine's convention with the task's
temperature: `tempered`, SGLang's `log_softmax(logits / T)` before top-k / top-p (greedy, T < 1e-6:
`log_softmax(logits)`), or `raw`, `log_softmax(logits)`. ℓθ (with gradient) so that before any
update it equals the engine's ℓold up to rounding; the teacher (no gradient) so that with the
teacher = the policy, d = ℓT − ℓold = 0 and OPD pushes nowhere. (Scored at T = 1 while ℓold was
taken at T = 0.7, d was the gap between the two temperatures, and OPD pulled every turn toward the
T = 1 distribution, anchor turns included.) The teacher's own top-K is taken from that distribution.
The KL to the base model (`kl_coef` > 0) is exact over the vocabulary, in the same distribution.

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


def _logprobs(logits: torch.Tensor, convention: str, task: TrainTask) -> torch.Tensor:
    """[T, V] log-probabilities of one row in the batch's one distribution (module docstring)."""
    return engine_logprobs(logits, convention, task.temperature)


def policy_logprobs(model: Any, tasks: list[TrainTask], device: torch.device, convention: str = "tempered",
                    reference: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """ℓθ of the response tokens [B,T] and of the recorded top-K ids [B,T,K], with gradient, in the
    rollout engine's logprob `convention` (`engine_logprobs`), so that before any update ℓθ = ℓold.
    With `reference` (the base model's [T_b, V] log-probs per task, `reference_logprobs`), also the
    exact per-token KL(πθ ‖ π_base) = Σ_v πθ(v)·(ℓθ(v) − ℓbase(v)) [B,T], with gradient; else None.

    Values below the engine's floor are clamped to it, as the engine does on the wire, so a -inf can
    never reach a ratio or a metric.
    """
    T, K, _ = dims(tasks)
    logits = response_logits(model, [t.prompt_ids for t in tasks], [t.response_ids for t in tasks], device)
    logp_rows, topk_rows, kl_rows = [], [], []
    for b, (task, lg) in enumerate(zip(tasks, logits)):
        lp = _logprobs(lg, convention, task)  # [T_b, V]
        resp = torch.from_numpy(task.response_ids).to(device)
        logp = lp.gather(-1, resp[:, None]).squeeze(-1).clamp(min=LOGPROB_FLOOR)
        ids = torch.from_numpy(task.topk_ids).to(device).clamp(min=0)
        topk = lp.gather(-1, ids).clamp(min=LOGPROB_FLOOR)
        logp_rows.append(F.pad(logp, (0, T - task.T)))
        topk_rows.append(F.pad(topk, (0, K - task.K, 0, T - task.T)))
        if reference is not None:
            kl_rows.append(F.pad((lp.exp() * (lp - reference[b])).sum(-1), (0, T - task.T)))
    kl = torch.stack(kl_rows) if reference is not None else None
    return torch.stack(logp_rows), torch.stack(topk_rows), kl


@torch.no_grad()
def reference_logprobs(model: Any, tasks: list[TrainTask], device: torch.device,
                       convention: str = "tempered") -> list[torch.Tensor]:
    """The base model's [T_b, V] log-probabilities on each task's own (unhinted) prompt, for the KL
    term: one more teacher forward per task, run only when kl_coef > 0."""
    out: list[torch.Tensor] = []
    for start in range(0, len(tasks), TEACHER_ROWS_PER_FORWARD):
        chunk = tasks[start:start + TEACHER_ROWS_PER_FORWARD]
        logits = response_logits(model, [t.prompt_ids for t in chunk], [t.response_ids for t in chunk], device)
        out.extend(_logprobs(lg, convention, t) for t, lg in zip(chunk, logits))
    return out


@torch.no_grad()
def teacher_scores(model: Any, tasks: list[TrainTask], device: torch.device,
                   convention: str = "tempered") -> dict[str, torch.Tensor]:
    """For every teacher candidate: its log-probs on the recorded top-K ids and its own top-K ids,
    in the same distribution as ℓθ and ℓold (the task's temperature, `convention`).

    Returns `teacher_topk_logp [B,H,T,K]`, `teacher_top_ids [B,H,T,K]` (-1 = padding), `cand_mask
    [B,H]` and `cand_len [B,H]` (each candidate's teacher-prompt tokens, for `shortest`).
    """
    T, K, H = dims(tasks)
    B = len(tasks)
    t_logp = torch.zeros(B, H, T, K, device=device)
    t_ids = torch.full((B, H, T, K), -1, dtype=torch.long, device=device)
    cand = torch.zeros(B, H, dtype=torch.bool, device=device)
    cand_len = torch.zeros(B, H, dtype=torch.long, device=device)
    pairs = [(b, h) for b, task in enumerate(tasks) for h in range(task.H)]
    for start in range(0, len(pairs), TEACHER_ROWS_PER_FORWARD):
        chunk = pairs[start:start + TEACHER_ROWS_PER_FORWARD]
        logits = response_logits(model, [tasks[b].teacher_prompt_ids[h] for b, h in chunk],
                                 [tasks[b].response_ids for b, _ in chunk], device)
        for (b, h), lg in zip(chunk, logits):
            task = tasks[b]
            lp = _logprobs(lg, convention, task)
            ids = torch.from_numpy(task.topk_ids).to(device).clamp(min=0)
            t_logp[b, h, :task.T, :task.K] = lp.gather(-1, ids)
            t_ids[b, h, :task.T, :task.K] = torch.topk(lp, task.K, dim=-1).indices
            cand[b, h] = True
            cand_len[b, h] = len(task.teacher_prompt_ids[h])
    return {"teacher_topk_logp": t_logp, "teacher_top_ids": t_ids, "cand_mask": cand, "cand_len": cand_len}


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
                    convention: str = "tempered", kl: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor `openclawrl_loss` takes; `logp_new`/`topk_logp_new` (and `kl`) carry the
    policy's graph. The teacher runs first: its forwards keep nothing for backward."""
    scores = teacher_scores(teacher, tasks, device, convention)
    reference = reference_logprobs(teacher, tasks, device, convention) if kl else None
    logp_new, topk_new, kl_tok = policy_logprobs(model, tasks, device, convention, reference)
    out = {"logp_new": logp_new, "topk_logp_new": topk_new, **recorded(tasks, device), **scores}
    if kl_tok is not None:
        out["kl"] = kl_tok
    return out


def micro_batches(tasks: list[TrainTask], budget: int) -> list[list[int]]:
    """Task indices per micro-batch: consecutive tasks by length (longest first, so rows of one
    forward are alike and pad little) while the padded policy forward (rows × the longest prompt +
    response) stays within `budget` tokens; a task above the budget alone. `budget` 0: one
    micro-batch. Deterministic, as `shard` is."""
    if not tasks:
        return []
    if budget <= 0:
        return [list(range(len(tasks)))]
    order = sorted(range(len(tasks)), key=lambda i: (-(len(tasks[i].prompt_ids) + tasks[i].T), i))
    out: list[list[int]] = [[]]
    width = 0
    for i in order:
        n = len(tasks[i].prompt_ids) + tasks[i].T
        if out[-1] and max(width, n) * (len(out[-1]) + 1) > budget:
            out.append([])
            width = 0
        out[-1].append(i)
        width = max(width, n)
    return [sorted(mb) for mb in out]

