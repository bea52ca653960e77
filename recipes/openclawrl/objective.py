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
- Candidate selection ties go to the lowest index; invalid candidates are never chosen. `shortest`
  picks the valid candidate with the fewest teacher-prompt tokens (`cand_len`): every candidate of a
  task is the same prompt and marker plus its hint, so that is the one whose hint is shortest in
  tokens. Ties go to the lowest index, which is the TS side's order (hints shortest first by
  characters, recipes/openclawrl/judge/votes.ts); a candidate the trainer left out (too long for the
  context, trainer/tasks.py) is not in the batch at all, so it cannot be chosen.
- ℓold (`old_logprobs`): `engine` uses the recorded logprobs (`logp_old`, `topk_logp_old`) in ρ, w
  and d. `trainer` uses the policy's own values of this forward, detached (`logp_new`,
  `topk_logp_new`): one step per batch, so they are the proximal policy and ρ = 1 in value. The
  recorded logprobs are then the behaviour policy: a truncated importance weight per token,
  w_t = min(exp(ℓold(y_t) − ℓengine(y_t)), tis_cap), multiplies that token's RL and OPD terms
  (tis_cap 0: w_t = 1). The recorded top-K still says which entries are padding.
- KL to the base model (`kl_coef` > 0): `kl` [B,T] holds a per-token KL estimate with its graph
  (the trainer passes the exact KL over the vocabulary, trainer/scoring.py); its mean over the
  masked tokens, times kl_coef, is added to the loss. It carries no importance weight.
- `opd_clip_frac` and `mean_abs_d` are unweighted means over the valid (t, v) entries of the OPD
  tokens; `rl_clip_frac` is over masked tokens. "Clipped" means the clipped surrogate is strictly
  smaller than the unclipped one, i.e. the min picked the clipped branch and it mattered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

import torch

from reef_shim.errors import ShimError

LOGPROB_FLOOR = -10000.0
HINT_SELECTIONS = ("sequence_optimal", "token_optimal", "shortest")
OLD_LOGPROBS = ("engine", "trainer")


@dataclass(frozen=True)
class ObjectiveConfig:
    w_rl: float = 1.0
    w_opd: float = 1.0
    eps_low: float = 0.2
    eps_high: float = 0.28
    clip_c: float = 1.0
    hint_selection: str = "sequence_optimal"
    old_logprobs: str = "trainer"
    tis_cap: float = 2.0
    kl_coef: float = 0.0

    def __post_init__(self) -> None:
        checks = [
            ("w_rl", self.w_rl >= 0, "a number >= 0"),
            ("w_opd", self.w_opd >= 0, "a number >= 0"),
            ("eps_low", 0 <= self.eps_low <= 1, "a number in [0, 1]"),
            ("eps_high", self.eps_high > 0, "a positive number"),
            ("clip_c", self.clip_c > 0, "a positive number"),
            ("hint_selection", self.hint_selection in HINT_SELECTIONS, " | ".join(HINT_SELECTIONS)),
            ("old_logprobs", self.old_logprobs in OLD_LOGPROBS, " | ".join(OLD_LOGPROBS)),
            ("tis_cap", self.tis_cap == 0 or self.tis_cap >= 1, "0 (off) or a number >= 1"),
            ("kl_coef", self.kl_coef >= 0, "a number >= 0"),
        ]
        for name, ok, want in checks:
            if not ok:
                raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"objective config {name}: expected {want}, got {getattr(self, name)!r}")


_CAMEL = {"wRl": "w_rl", "wOpd": "w_opd", "epsLow": "eps_low", "epsHigh": "eps_high", "clipC": "clip_c",
          "hintSelection": "hint_selection", "oldLogprobs": "old_logprobs", "tisCap": "tis_cap", "klCoef": "kl_coef"}


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
# Needed only by some configs: `cand_len` (teacher-prompt tokens per candidate) by `shortest`,
# `kl` (per-token KL to the base model, with its graph) by kl_coef > 0.
_OPTIONAL_SHAPES = {"cand_len": "BH", "kl": "BT"}


def _check_shapes(batch: Mapping[str, torch.Tensor], cfg: ObjectiveConfig) -> dict[str, int]:
    dims: dict[str, int] = {}
    needed = {**_SHAPES}
    if cfg.hint_selection == "shortest" or "cand_len" in batch:
        needed["cand_len"] = _OPTIONAL_SHAPES["cand_len"]
    if cfg.kl_coef > 0 or "kl" in batch:
        needed["kl"] = _OPTIONAL_SHAPES["kl"]
    for key, letters in needed.items():
        if key not in batch:
            why = {"cand_len": " (hint_selection shortest needs it)", "kl": " (kl_coef > 0 needs it)"}.get(key, "")
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"objective batch: missing {key}{why}")
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
    """Return (scalar loss, metrics as python floats). Gradients flow into `logp_new`,
    `topk_logp_new` and `kl` only; every other tensor is treated as a constant."""
    cfg = _as_config(cfg)
    dims = _check_shapes(batch, cfg)
    B, T = dims["B"], dims["T"]
    logp_new = batch["logp_new"]
    # Ratios in half precision lose the 1e-3 differences the clip works on.
    dtype = torch.promote_types(logp_new.dtype, torch.float32)
    logp_new = logp_new.to(dtype)
    topk_logp_new = batch["topk_logp_new"].to(dtype)
    logp_engine = batch["logp_old"].detach().to(dtype)
    mask = batch["mask"].detach().to(torch.bool)
    reward = batch["reward"].detach().to(dtype)
    topk_ids = batch["topk_ids"].detach().long()
    topk_logp_engine = batch["topk_logp_old"].detach().to(dtype)
    teacher_logp = batch["teacher_topk_logp"].detach().to(dtype)
    teacher_ids = batch["teacher_top_ids"].detach().long()
    cand_mask = batch["cand_mask"].detach().to(torch.bool)
    zero = logp_new.new_zeros(())
    maskf = mask.to(dtype)
    tokens = maskf.sum()

    # Padding is what the engine recorded as such, whichever ℓold the terms use.
    valid = (topk_ids >= 0) & torch.isfinite(topk_logp_engine) & (topk_logp_engine > LOGPROB_FLOOR)
    if cfg.old_logprobs == "trainer":
        logp_old, topk_logp_old = logp_new.detach(), topk_logp_new.detach()
        valid = valid & torch.isfinite(topk_logp_old) & (topk_logp_old > LOGPROB_FLOOR)
        # Truncated importance weight of the behaviour policy (the engine) per token, detached.
        log_is = torch.where(mask, logp_old - logp_engine, zero)
        capped = mask & (log_is > math.log(cfg.tis_cap)) if cfg.tis_cap > 0 else torch.zeros_like(mask)
        tis = torch.exp(log_is.clamp(max=math.log(cfg.tis_cap))) if cfg.tis_cap > 0 else torch.ones_like(log_is)
    else:
        logp_old, topk_logp_old = logp_engine, topk_logp_engine
        capped, tis = torch.zeros_like(mask), torch.ones_like(logp_engine)

    # RL. `where` before `exp`, so garbage (±inf) at unmasked positions cannot reach the loss or its gradient.
    rl_ratio = torch.exp(torch.where(mask, logp_new - logp_old, zero))
    rl_tok, rl_clipped = _clipped_surrogate(rl_ratio, reward[:, None].expand(B, T), cfg)
    rl_loss = -(tis * rl_tok * maskf).sum() / tokens.clamp(min=1)

    # OPD: choose a teacher candidate per sample (or per token) by top-K overlap, or the shortest hint.
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
        elif cfg.hint_selection == "shortest":
            length = batch["cand_len"].detach().long()
            score = torch.where(cand_mask, -length, torch.iinfo(torch.long).min)  # [B,H]
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
    opd_loss = -(tis * opd_tok * opd_tok_mask).sum() / tokens.clamp(min=1)

    loss = cfg.w_rl * rl_loss + cfg.w_opd * opd_loss
    kl_loss = zero
    if "kl" in batch:
        kl_loss = (torch.where(mask, batch["kl"].to(dtype), zero)).sum() / tokens.clamp(min=1)
        if cfg.kl_coef > 0:
            loss = loss + cfg.kl_coef * kl_loss

    with torch.no_grad():
        entries = entry.to(dtype).sum().clamp(min=1)
        metrics = {
            "loss": loss.item(),
            "rl_loss": rl_loss.item(),
            "opd_loss": opd_loss.item(),
            "kl": kl_loss.item(),
            "rl_clip_frac": ((rl_clipped & mask).to(dtype).sum() / tokens.clamp(min=1)).item(),
            "opd_clip_frac": ((opd_clipped & entry).to(dtype).sum() / entries).item(),
            "mean_abs_d": (d.abs().sum() / entries).item(),
            "chosen_overlap": ((chosen_overlap * opd_tok_mask).to(dtype).sum() / opd_tokens.clamp(min=1)).item(),
            "tis_weight_mean": ((tis * maskf).sum() / tokens.clamp(min=1)).item(),
            "tis_clip_frac": ((capped & mask).to(dtype).sum() / tokens.clamp(min=1)).item(),
            "tokens": tokens.item(),
            "opd_tokens": opd_tokens.item(),
            "entries": entry.to(dtype).sum().item(),
            "samples_with_teacher": float(has_teacher.sum().item()),
        }
    return loss, metrics
