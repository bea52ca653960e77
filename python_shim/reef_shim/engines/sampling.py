"""How the `hf` engine samples a token and which logprobs it reports, shared with the trainer.

Reported (SGLang's convention, "tempered"): a token's logprob and the top-K are those of
`tempered_logprobs(logits, temperature)` = `log_softmax(logits / temperature)`, **before** top-k and
top-p. A temperature below `GREEDY_BELOW` (1e-6; SGLang's `_SAMPLING_EPS`) is greedy and reports
`log_softmax(logits)` (dividing by such a temperature overflows fp32 to inf, and the softmax to
NaN). The top-K are the K largest of those values, best first, equal values listing the lower id
first; every entry is finite, with or without top-k / top-p (a `-inf` logit would be written as
`LOGPROB_FLOOR`, since JSON has no infinity).

Drawn: the token comes from the truncated distribution `sampling_logprobs(logits, temperature,
top_k, top_p)`:

1. greedy (temperature < `GREEDY_BELOW`): the argmax, the lowest id on an exact tie; no top-k /
   top-p, and no random number is drawn;
2. otherwise `z = logits / temperature`;
3. top-k (when 0 < top_k < vocab): tokens whose `z` is below the k-th largest `z` are removed
   (ties with the k-th value are kept);
4. top-p (when 0 < top_p < 1): over the softmax of what is left, sorted by probability
   (descending, ties in id order), a token is removed when the probability mass of the tokens
   before it already reaches `top_p`; the first token is always kept;
5. renormalised over the kept tokens. The draw takes one uniform number from the request's
   generator and inverts the cumulative distribution over the kept tokens in id order (float64),
   so a request's tokens depend on its own logits and generator only, not on the batch around it.

`sample_rows` does this for a batch of rows at once: the tempered log-softmax and the draws of
untruncated rows are vectorised; the top-k / top-p work runs for the rows that ask for it only, and
top-p looks at the most probable tokens first instead of sorting the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOGPROB_FLOOR = -1.0e4
GREEDY_BELOW = 1.0e-6
# Tokens top-p examines first, then sixteen times as many, before it sorts the vocabulary (a sort
# of 49k probabilities costs ~4 ms here, a top-64 0.1 ms).
NUCLEUS_PROBE = 64


def tempered_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """`log_softmax(logits / temperature)` `[..., V]` in fp32: what the engine reports."""
    logits = logits.float()
    if temperature < GREEDY_BELOW:
        return torch.log_softmax(logits, dim=-1)
    return torch.log_softmax(logits / temperature, dim=-1)


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Log-probabilities `[..., V]` of the truncated distribution a token is drawn from (steps 1-5
    above); removed tokens are `-inf`. The definition `sample_rows` follows, written plainly."""
    logits = logits.float()
    if temperature < GREEDY_BELOW:
        return torch.log_softmax(logits, dim=-1)
    z = logits / temperature
    vocab = z.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if 0 < top_p < 1:
        probs = torch.softmax(z, dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop_sorted = before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return torch.log_softmax(z, dim=-1)


# How an engine reports the logprob of a token it sampled (`training.engine_logprobs`), and so the
# one distribution the trainer scores ℓθ, ℓold and the teacher in:
# - "tempered": `log_softmax(logits / temperature)`, before top-k / top-p (SGLang's sampler, and
#   the hf engine's);
# - "raw": `log_softmax(logits)` (SGLang with SGLANG_RETURN_ORIGINAL_LOGPROB set).
# Greedy requests are `log_softmax(logits)` in both. ("sampled", the truncated distribution the hf
# engine reported before, was removed with it: the config refuses it, naming "tempered".)
ENGINE_LOGPROBS = ("tempered", "raw")


def engine_logprobs(logits: torch.Tensor, convention: str, temperature: float) -> torch.Tensor:
    """Log-probabilities `[..., V]` as an engine of `convention` reports them (see ENGINE_LOGPROBS)."""
    if convention == "tempered":
        return tempered_logprobs(logits, temperature)
    if convention == "raw":
        return torch.log_softmax(logits.float(), dim=-1)
    raise ValueError(f"engine logprobs convention {convention!r}: expected one of {', '.join(ENGINE_LOGPROBS)}")


@dataclass
class RowSampling:
    """One row's sampling parameters and what its reply reports."""

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    generator: torch.Generator | None = None
    logprob: bool = False
    top_n: int = 0  # K of the top-K (0: none)
    # Tokens to emit instead of drawing, first to last (a scripted reply, `scripted.py`); the
    # reported logprobs are still the model's own for each. Drawing resumes once it is empty.
    forced: list[int] | None = None


@dataclass
class Pick:
    token: int
    logprob: float | None  # None unless the row asked for logprobs
    top: list[list[float | int | None]]  # [[lp, id, None] x K], best first


def sample_rows(logits: torch.Tensor, rows: list[RowSampling]) -> list[Pick]:
    """Draw the next token of each row of `logits` `[B, V]` and read its reported logprobs."""
    logits = logits.float()
    n, vocab = logits.shape
    greedy = [r.temperature < GREEDY_BELOW for r in rows]
    divisors = [1.0 if g else r.temperature for g, r in zip(greedy, rows)]
    z = logits if all(d == 1.0 for d in divisors) else logits / torch.tensor(divisors).unsqueeze(1)
    lp = torch.log_softmax(z, dim=-1)
    tokens = [0] * n
    if any(greedy):
        at = [i for i in range(n) if greedy[i]]
        for i, t in zip(at, torch.argmax(lp[at], dim=-1).tolist()):
            tokens[i] = t
    plain = [i for i in range(n) if not greedy[i] and not _truncates(rows[i], vocab)]
    if plain:
        u = torch.tensor([_uniform(rows[i].generator) for i in plain], dtype=torch.float64)
        for i, t in zip(plain, _draw((lp if len(plain) == n else lp[plain]).exp(), u).tolist()):
            tokens[i] = t
    for i in range(n):
        if not greedy[i] and _truncates(rows[i], vocab):
            kept = support(z[i], rows[i].top_k, rows[i].top_p)
            u = torch.tensor([_uniform(rows[i].generator)], dtype=torch.float64)
            tokens[i] = int(kept[_draw(lp[i, kept].exp().unsqueeze(0), u)[0]])
    for i, r in enumerate(rows):
        if r.forced:
            tokens[i] = r.forced.pop(0)
    picks = [Pick(tokens[i], None, []) for i in range(n)]
    wants = [i for i in range(n) if rows[i].logprob]
    if wants:
        values = lp[wants, [tokens[i] for i in wants]].tolist()
        for i, value in zip(wants, values):
            picks[i].logprob = _finite(value)
        for k in sorted({rows[i].top_n for i in wants if rows[i].top_n > 0}):
            at = [i for i in wants if rows[i].top_n == k]
            for i, top in zip(at, top_logprobs(lp[at], k)):
                picks[i].top = top
    return picks


def _truncates(row: RowSampling, vocab: int) -> bool:
    return 0 < row.top_k < vocab or 0 < row.top_p < 1


def _uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), dtype=torch.float64, generator=generator))


# `_draw` sums blocks of this many probabilities, then runs the cumulative sum inside one block:
# a float64 cumulative sum over the whole vocabulary cost more than the rest of a step's sampling.
DRAW_BLOCK = 1024


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """For each row of unnormalised fp32 `probs` `[n, m]`, the first index where the cumulative sum
    (float64, in id order) exceeds `u` (`[n]`, in [0, 1)) times the row's total: a draw from the
    renormalised row. Only indices with a non-zero probability come out."""
    n, m = probs.shape
    blocks = -(-m // DRAW_BLOCK)
    padded = probs if blocks * DRAW_BLOCK == m else torch.nn.functional.pad(probs, (0, blocks * DRAW_BLOCK - m))
    tiles = padded.view(n, blocks, DRAW_BLOCK)
    # Block sums in fp32 (pairwise, so ~1e-7 relative; a float64 sum would copy every row to
    # float64 first), accumulated across blocks and inside the chosen block in float64.
    block_cdf = torch.cumsum(tiles.sum(-1).double(), dim=-1)
    target = u * block_cdf[:, -1]
    block = torch.searchsorted(block_cdf, target.unsqueeze(1), right=True).squeeze(1).clamp(max=blocks - 1)
    rows = torch.arange(n)
    start = torch.where(block > 0, block_cdf[rows, (block - 1).clamp(min=0)], 0.0)
    inner = start.unsqueeze(1) + torch.cumsum(tiles[rows, block].double(), dim=-1)
    at = torch.searchsorted(inner, target.unsqueeze(1), right=True).squeeze(1)
    token = block * DRAW_BLOCK + at
    # The block's own sum and its cumulative sum round apart (or u * total rounded up to the total):
    # the target then lies past the block's last token. Take the last token with a non-zero probability
    # at or before the block's end instead.
    over = (at >= DRAW_BLOCK) | (token >= m)
    if bool(over.any()):
        for r in over.nonzero().squeeze(1).tolist():
            end = min(int(block[r]) * DRAW_BLOCK + DRAW_BLOCK, m)
            token[r] = int((probs[r, :end] > 0).nonzero()[-1])
    return token


def support(z: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The ids (ascending) top-k then top-p keep of one row of tempered logits `z` `[V]`."""
    vocab = z.shape[0]
    ids: torch.Tensor | None = None
    if 0 < top_k < vocab:
        kth = torch.topk(z, top_k).values[-1]
        ids = (z >= kth).nonzero().squeeze(1)
    if not 0 < top_p < 1:
        return torch.arange(vocab) if ids is None else ids
    if ids is not None:
        probs = torch.softmax(z[ids], dim=0)
        sorted_p, order = torch.sort(probs, descending=True, stable=True)
        return ids[order[:_nucleus(sorted_p, top_p)]].sort().values
    probs = torch.softmax(z, dim=0)
    m = NUCLEUS_PROBE
    while m < vocab:
        values, at = _by_value_then_id(*torch.topk(probs, m))
        keep = _nucleus(values, top_p)
        # Exact when the cut falls inside the m and its value is above the m-th: every token with
        # that probability or more is then among the m.
        if keep < m and values[keep - 1] > values[m - 1]:
            return at[:keep].sort().values
        m *= 16
    sorted_p, order = torch.sort(probs, descending=True, stable=True)
    return order[:_nucleus(sorted_p, top_p)].sort().values


def _nucleus(sorted_p: torch.Tensor, top_p: float) -> int:
    """How many of the descending probabilities top-p keeps (at least one)."""
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p
    return max(1, int((before < top_p).sum()))


def _by_value_then_id(values: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reorder (values, ids) on the last dim: value descending, equal values by ascending id."""
    ids, perm = ids.sort(dim=-1)
    values, perm2 = values.gather(-1, perm).sort(dim=-1, descending=True, stable=True)
    return values, ids.gather(-1, perm2)


def top_logprobs(lp: torch.Tensor, k: int) -> list[list[list[float | int | None]]] | list[list[float | int | None]]:
    """The K largest entries of each row of `lp` as `[[lp, id, None], ...]`, best first, equal
    values listing the lower id first. A 1-D `lp` gives one such list, a 2-D one a list per row."""
    if lp.dim() == 1:
        return top_logprobs(lp.unsqueeze(0), k)[0]  # type: ignore[return-value]
    rows, vocab = lp.shape
    k = min(k, vocab)
    if k <= 0:
        return [[] for _ in range(rows)]
    # One more than asked: a tie across the K-th place shows as the K+1-th value equal to the K-th.
    probe = min(k + 1, vocab)
    values, ids = _by_value_then_id(*torch.topk(lp, probe, dim=-1))
    out = []
    for r, (vals, tids) in enumerate(zip(values.tolist(), ids.tolist())):
        if probe > k and vals[k] == vals[k - 1]:
            # Which of the tied tokens make the cut is decided by id: find them all.
            cand = (lp[r] >= vals[k - 1]).nonzero().squeeze(1)
            v, order = torch.sort(lp[r, cand], descending=True, stable=True)
            vals, tids = v[:k].tolist(), cand[order[:k]].tolist()
        out.append([[_finite(v), int(t), None] for v, t in zip(vals[:k], tids[:k])])
    return out


def _finite(x: float) -> float:
    return x if x > LOGPROB_FLOOR else LOGPROB_FLOOR
