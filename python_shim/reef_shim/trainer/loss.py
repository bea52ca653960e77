"""The objective over a batch split across ranks and micro-batches, and the step's metrics put back together.

`openclawrl_loss` means over the tokens it is given; the objective's means run over every masked
token of the whole batch (ARCHITECTURE.md §4), the OPD mean too. Each rank therefore weights the
loss of each of its micro-batches by that micro-batch's share of the batch's tokens and multiplies
by the world size, because FSDP2 averages gradients across ranks: the gradients the micro-batches'
backward passes accumulate, averaged over the ranks, are then exactly the gradient of the global
means. `test_trainer.py` checks this against one process on the whole batch (same gradient norm),
`test_trainer_units.py` the sums over ranks and micro-batches against one call on the batch.
"""

from __future__ import annotations

from typing import Any

import torch

# Per-rank (and per-micro-batch) sums the driver adds up; each metric of the objective is weighted
# by its own denominator.
SUM_KEYS = ("tokens", "opd_tokens", "entries", "rl_loss", "opd_loss", "kl", "rl_clip_frac", "opd_clip_frac",
            "mean_abs_d", "chosen_overlap", "tis_weight_mean", "tis_clip_frac", "samples_with_teacher", "samples",
            "abs_diff_sum")
_WEIGHT = {"rl_loss": "tokens", "rl_clip_frac": "tokens", "opd_loss": "tokens", "kl": "tokens",
           "tis_weight_mean": "tokens", "tis_clip_frac": "tokens", "chosen_overlap": "opd_tokens",
           "opd_clip_frac": "entries", "mean_abs_d": "entries"}


def local_loss(batch: dict[str, torch.Tensor], cfg: Any, totals: dict[str, float], world: int,
               loss_fn: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one micro-batch of this rank for backward, and its metric sums. `totals`: the
    whole batch's tokens (over every rank and micro-batch)."""
    loss, m = loss_fn(batch, cfg)
    tok, otok, entries = m["tokens"], m["opd_tokens"], m["entries"]
    loss = world * loss * (tok / max(totals["tokens"], 1.0))
    mask = batch["mask"].bool()
    # The drift between the trainer's ℓθ before the update and the engine's recorded logprobs.
    diff = (batch["logp_new"].detach() - batch["logp_old"]).abs()[mask]
    sums = {"tokens": tok, "opd_tokens": otok, "entries": entries,
            "samples_with_teacher": m["samples_with_teacher"], "samples": float(mask.shape[0]),
            "abs_diff_sum": float(diff.sum()), "abs_diff_max": float(diff.max()) if diff.numel() else 0.0}
    for key, weight in _WEIGHT.items():
        sums[key] = m[key] * {"tokens": tok, "opd_tokens": otok, "entries": entries}[weight]
    return loss, sums


def empty_sums() -> dict[str, float]:
    """A rank (or micro-batch) with no task."""
    return {**{k: 0.0 for k in SUM_KEYS}, "abs_diff_max": 0.0}


def add_sums(parts: list[dict[str, float]]) -> dict[str, float]:
    """One rank's sums from its micro-batches' (the max for `abs_diff_max`)."""
    out = empty_sums()
    for p in parts:
        for k in SUM_KEYS:
            out[k] += p[k]
        out["abs_diff_max"] = max(out["abs_diff_max"], p["abs_diff_max"])
    return out


def combine(per_rank: list[dict[str, float]], cfg: Any) -> dict[str, float]:
    """Step metrics from the ranks' sums: the objective's metrics over the whole batch, plus
    `train_rollout_logprob_abs_diff` (mean |ℓθ before the update − recorded logprob|) and its max."""
    total = {k: sum(r[k] for r in per_rank) for k in SUM_KEYS}
    out = {k: total[k] for k in ("tokens", "opd_tokens", "samples_with_teacher", "samples")}
    for key, weight in _WEIGHT.items():
        out[key] = total[key] / total[weight] if total[weight] > 0 else 0.0
    out["loss"] = cfg.w_rl * out["rl_loss"] + cfg.w_opd * out["opd_loss"] + cfg.kl_coef * out["kl"]
    out["train_rollout_logprob_abs_diff"] = total["abs_diff_sum"] / total["tokens"] if total["tokens"] else 0.0
    out["train_rollout_logprob_abs_diff_max"] = max(r["abs_diff_max"] for r in per_rank)
    return out
