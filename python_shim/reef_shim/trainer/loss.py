"""The objective over a batch split across ranks, and the step's metrics put back together.

`openclawrl_loss` means over the tokens it is given; the objective's means run over every masked
token of the whole batch (ARCHITECTURE.md §4), the OPD mean too. Each rank therefore weights its
loss by its share of the batch's tokens and multiplies by the world size, because FSDP2 averages
gradients across ranks: the averaged gradient is then exactly the gradient of the global means.
`test_trainer.py` checks this against one process on the whole batch (same gradient norm).
"""

from __future__ import annotations

from typing import Any

import torch

from .scoring import opd_entries

# Per-rank sums the driver adds up; each metric of the objective is weighted by its own denominator.
SUM_KEYS = ("tokens", "opd_tokens", "entries", "rl_loss", "opd_loss", "rl_clip_frac", "opd_clip_frac",
            "mean_abs_d", "chosen_overlap", "samples_with_teacher", "samples", "abs_diff_sum")
_WEIGHT = {"rl_loss": "tokens", "rl_clip_frac": "tokens", "opd_loss": "tokens", "chosen_overlap": "opd_tokens",
           "opd_clip_frac": "entries", "mean_abs_d": "entries"}


def local_loss(batch: dict[str, torch.Tensor], cfg: Any, totals: dict[str, float], world: int,
               loss_fn: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """This rank's loss for backward and its metric sums. `totals`: the batch's tokens."""
    loss, m = loss_fn(batch, cfg)
    tok, otok = m["tokens"], m["opd_tokens"]
    loss = world * loss * (tok / max(totals["tokens"], 1.0))
    entries = float(opd_entries(batch))
    mask = batch["mask"].bool()
    diff = (batch["logp_new"].detach() - batch["logp_old"]).abs()[mask]
    sums = {"tokens": tok, "opd_tokens": otok, "entries": entries,
            "samples_with_teacher": m["samples_with_teacher"], "samples": float(mask.shape[0]),
            "abs_diff_sum": float(diff.sum()), "abs_diff_max": float(diff.max()) if diff.numel() else 0.0}
    for key, weight in _WEIGHT.items():
        sums[key] = m[key] * {"tokens": tok, "opd_tokens": otok, "entries": entries}[weight]
    return loss, sums


def empty_sums() -> dict[str, float]:
    """A rank with no task this step."""
    return {**{k: 0.0 for k in SUM_KEYS}, "abs_diff_max": 0.0}


def combine(per_rank: list[dict[str, float]], cfg: Any) -> dict[str, float]:
    """Step metrics from the ranks' sums: the objective's metrics over the whole batch, plus
    `train_rollout_logprob_abs_diff` (mean |ℓθ before the update − recorded logprob|) and its max."""
    total = {k: sum(r[k] for r in per_rank) for k in SUM_KEYS}
    out = {k: total[k] for k in ("tokens", "opd_tokens", "samples_with_teacher", "samples")}
    for key, weight in _WEIGHT.items():
        out[key] = total[key] / total[weight] if total[weight] > 0 else 0.0
    out["loss"] = cfg.w_rl * out["rl_loss"] + cfg.w_opd * out["opd_loss"]
    out["train_rollout_logprob_abs_diff"] = total["abs_diff_sum"] / total["tokens"] if total["tokens"] else 0.0
    out["train_rollout_logprob_abs_diff_max"] = max(r["abs_diff_max"] for r in per_rank)
    return out
