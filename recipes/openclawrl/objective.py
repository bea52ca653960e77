"""The OpenClaw-RL hybrid objective (ARCHITECTURE.md §4): w_rl·L_RL + w_opd·L_OPD.

A pure function over named tensors, so the trainer group, the tests and any benchmark compute the
same thing. Shapes: B samples, T response positions, K top-K subset size, H teacher candidates.

Choices the formulas leave open, fixed here:
- Both means run over every masked response token of the batch (not per sample, then averaged),
  as ARCHITECTURE.md §4 says: the paper adds the token-level OPD advantage to the evaluative one in
  one per-token update. A sample whose `cand_mask` row is all zero adds no OPD term, yet its
  tokens count in both denominators, so a batch where few turns have a hint distils that much
  less; when no sample has one, L_OPD = 0 (still attached to the graph, so backward works).
- A top-K entry is padding when its id is < 0 or its recorded logprob is non-finite or at the
  engine's floor (-10000, docs/internals.md: outside the sampled support). Padding takes no part
  in w, d, ρ or the overlap; a position whose whole subset is padding adds 0 but is still counted.
- Candidate selection ties go to the lowest index; invalid candidates are never chosen.
- `opd_clip_frac` and `mean_abs_d` are unweighted means over the valid (t, v) entries of the OPD
  tokens; `rl_clip_frac` is over masked tokens. "Clipped" means the clipped surrogate is strictly
  smaller than the unclipped one, i.e. the min picked the clipped branch and it mattered.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

import torch

from reef_shim.errors import ShimError

LOGPROB_FLOOR = -10000.0
HINT_SELECTIONS = ("sequence_optimal", "token_optimal")


@dataclass(frozen=True)
class ObjectiveConfig:
    w_rl: float = 1.0
    w_opd: float = 1.0
    eps_low: float = 0.2
    eps_high: float = 0.28
    clip_c: float = 1.0
    hint_selection: str = "sequence_optimal"

    def __post_init__(self) -> None:
        checks = [
            ("w_rl", self.w_rl >= 0, "a number >= 0"),
            ("w_opd", self.w_opd >= 0, "a number >= 0"),
            ("eps_low", 0 <= self.eps_low <= 1, "a number in [0, 1]"),
            ("eps_high", self.eps_high > 0, "a positive number"),
            ("clip_c", self.clip_c > 0, "a positive number"),
            ("hint_selection", self.hint_selection in HINT_SELECTIONS, " | ".join(HINT_SELECTIONS)),
        ]
        for name, ok, want in checks:
            if not ok:
                raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"objective config {name}: expected {want}, got {getattr(self, name)!r}")


_CAMEL = {"wRl": "w_rl", "wOpd": "w_opd", "epsLow": "eps_low", "epsHigh": "eps_high", "clipC": "clip_c", "hintSelection": "hint_selection"}


def objective_from_options(resolved: Mapping[str, Any]) -> ObjectiveConfig:
    """Build the config from the TS side's `training.resolved` (camelCase). Keys the objective does
    not use (lr, betas, topK, ...) belong to the optimiser or the engine and are ignored here."""
    return ObjectiveConfig(**{snake: resolved[camel] for camel, snake in _CAMEL.items() if camel in resolved})


def _as_config(cfg: ObjectiveConfig | Mapping[str, Any]) -> ObjectiveConfig:
    if isinstance(cfg, ObjectiveConfig):
        return cfg
    known = {f.name for f in fields(ObjectiveConfig)}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"objective config: unknown keys {unknown}")
    return ObjectiveConfig(**cfg)


_SHAPES = {
    "logp_new": "BT", "logp_old": "BT", "mask": "BT", "reward": "B",
    "topk_ids": "BTK", "topk_logp_old": "BTK", "topk_logp_new": "BTK",
    "teacher_topk_logp": "BHTK", "teacher_top_ids": "BHTK", "cand_mask": "BH",
}


def _check_shapes(batch: Mapping[str, torch.Tensor]) -> dict[str, int]:
    dims: dict[str, int] = {}
    for key, letters in _SHAPES.items():
        if key not in batch:
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"objective batch: missing {key}")
        shape = tuple(batch[key].shape)
        if len(shape) != len(letters):
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"objective batch: {key} has shape {shape}, expected [{','.join(letters)}]")
        for letter, size in zip(letters, shape):
            if dims.setdefault(letter, size) != size:
                raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"objective batch: {key} has {letter}={size}, other tensors have {dims[letter]}")
    return dims


def _clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, cfg: ObjectiveConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A) and where the clipped branch is strictly smaller."""
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high) * adv
    return torch.minimum(unclipped, clipped), (clipped < unclipped).detach()


def _first_argmax(score: torch.Tensor, dim: int) -> torch.Tensor:
    """Index of the maximum along `dim`, the lowest one on ties (not left to torch.argmax)."""
    best = score.max(dim=dim, keepdim=True).values
    size = score.shape[dim]
    shape = [1] * score.dim()
    shape[dim] = size
    idx = torch.arange(size, device=score.device).view(shape).expand_as(score)
    return torch.where(score == best, idx, size).min(dim=dim).values


def _overlap(topk_ids: torch.Tensor, valid: torch.Tensor, teacher_ids: torch.Tensor) -> torch.Tensor:
    """O[b,h,t] = |S_t ∩ teacher_h's top-K at t| as sets: padding ids ignored, repeats counted once."""
    k = topk_ids.shape[-1]
    same = topk_ids.unsqueeze(-1) == topk_ids.unsqueeze(-2)  # [B,T,K,K]
    earlier = torch.ones(k, k, dtype=torch.bool, device=topk_ids.device).tril(-1)
    first = valid & ~(same & earlier & valid.unsqueeze(-2)).any(-1)  # first valid occurrence of each id
    # A padded teacher id (< 0) can only equal a padded S_t id, and those are not `first`.
    hit = topk_ids[:, None, :, :, None] == teacher_ids[:, :, :, None, :]  # [B,H,T,K,K']
    return (hit.any(-1) & first[:, None]).sum(-1)  # [B,H,T]


def openclawrl_loss(batch: Mapping[str, torch.Tensor], cfg: ObjectiveConfig | Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
    """Return (scalar loss, metrics as python floats). Gradients flow into `logp_new` and
    `topk_logp_new` only; every other tensor is treated as a constant."""
    cfg = _as_config(cfg)
    dims = _check_shapes(batch)
    B, T = dims["B"], dims["T"]
    logp_new = batch["logp_new"]
    # Ratios in half precision lose the 1e-3 differences the clip works on.
    dtype = torch.promote_types(logp_new.dtype, torch.float32)
    logp_new = logp_new.to(dtype)
    topk_logp_new = batch["topk_logp_new"].to(dtype)
    logp_old = batch["logp_old"].detach().to(dtype)
    mask = batch["mask"].detach().to(torch.bool)
    reward = batch["reward"].detach().to(dtype)
    topk_ids = batch["topk_ids"].detach().long()
    topk_logp_old = batch["topk_logp_old"].detach().to(dtype)
    teacher_logp = batch["teacher_topk_logp"].detach().to(dtype)
    teacher_ids = batch["teacher_top_ids"].detach().long()
    cand_mask = batch["cand_mask"].detach().to(torch.bool)
    zero = logp_new.new_zeros(())

    # RL. `where` before `exp`, so garbage (±inf) at unmasked positions cannot reach the loss or its gradient.
    maskf = mask.to(dtype)
    tokens = maskf.sum()
    rl_ratio = torch.exp(torch.where(mask, logp_new - logp_old, zero))
    rl_tok, rl_clipped = _clipped_surrogate(rl_ratio, reward[:, None].expand(B, T), cfg)
    rl_loss = -(rl_tok * maskf).sum() / tokens.clamp(min=1)

    # OPD: choose a teacher candidate per sample (or per token) by top-K overlap.
    valid = (topk_ids >= 0) & torch.isfinite(topk_logp_old) & (topk_logp_old > LOGPROB_FLOOR)
    has_teacher = cand_mask.any(-1)  # [B]
    overlap = _overlap(topk_ids, valid, teacher_ids)  # [B,H,T]
    if dims["H"] == 0:
        chosen = torch.zeros(B, T, dtype=torch.long, device=logp_new.device)
        chosen_overlap = torch.zeros(B, T, dtype=overlap.dtype, device=logp_new.device)
        chosen_logp = torch.zeros_like(topk_logp_old)
    else:
        if cfg.hint_selection == "sequence_optimal":
            score = (overlap * mask[:, None]).sum(-1)  # [B,H]
            score = torch.where(cand_mask, score, -1)
            chosen = _first_argmax(score, dim=1)[:, None].expand(B, T)
        else:
            score = torch.where(cand_mask[:, :, None], overlap, -1)  # [B,H,T]
            chosen = _first_argmax(score, dim=1)  # [B,T]
        chosen_overlap = overlap.gather(1, chosen[:, None]).squeeze(1)  # [B,T]
        chosen_logp = teacher_logp.gather(1, chosen[:, None, :, None].expand(B, 1, T, dims["K"])).squeeze(1)

    opd_tok_mask = mask & has_teacher[:, None]  # [B,T]
    entry = valid & opd_tok_mask[..., None]  # [B,T,K]
    d = torch.where(entry, (chosen_logp - topk_logp_old).clamp(-cfg.clip_c, cfg.clip_c), zero)
    # Softmax over the valid entries only; a row with none gets all-zero weights instead of NaN.
    w_logits = torch.where(valid, topk_logp_old, float("-inf"))
    w_logits = torch.where(valid.any(-1, keepdim=True), w_logits, zero)
    w = torch.softmax(w_logits, dim=-1) * valid
    opd_ratio = torch.exp(torch.where(entry, topk_logp_new - topk_logp_old, zero))
    opd_entry, opd_clipped = _clipped_surrogate(opd_ratio, d, cfg)
    opd_tok = (w * opd_entry * entry).sum(-1)  # [B,T]
    opd_tokens = opd_tok_mask.to(dtype).sum()
    opd_loss = -(opd_tok * opd_tok_mask).sum() / tokens.clamp(min=1)

    loss = cfg.w_rl * rl_loss + cfg.w_opd * opd_loss

    with torch.no_grad():
        entries = entry.to(dtype).sum().clamp(min=1)
        metrics = {
            "loss": loss.item(),
            "rl_loss": rl_loss.item(),
            "opd_loss": opd_loss.item(),
            "rl_clip_frac": ((rl_clipped & mask).to(dtype).sum() / tokens.clamp(min=1)).item(),
            "opd_clip_frac": ((opd_clipped & entry).to(dtype).sum() / entries).item(),
            "mean_abs_d": (d.abs().sum() / entries).item(),
            "chosen_overlap": ((chosen_overlap * opd_tok_mask).to(dtype).sum() / opd_tokens.clamp(min=1)).item(),
            "tokens": tokens.item(),
            "opd_tokens": opd_tokens.item(),
            "samples_with_teacher": float(has_teacher.sum().item()),
        }
    return loss, metrics
