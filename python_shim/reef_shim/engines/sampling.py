"""The sampling distribution of the `hf` engine, shared with the trainer.

`sampling_logprobs(logits, temperature, top_k, top_p)` returns, for every position, the log
probabilities of the distribution the engine samples the next token from:

1. temperature < `GREEDY_BELOW` (1e-6; SGLang's `_SAMPLING_EPS`) is greedy: `log_softmax(logits)`
   of the raw logits; no top-k / top-p. The engine picks the argmax (lowest id on an exact tie).
   (Dividing by such a temperature overflows fp32 to inf, and the softmax to NaN.)
2. otherwise `z = logits / temperature`;
3. top-k (when 0 < top_k < vocab): tokens whose `z` is below the k-th largest `z` are removed
   (ties with the k-th value are kept);
4. top-p (when 0 < top_p < 1): over the softmax of what is left, sorted by probability
   (descending, stable so ties keep id order), a token is removed when the probability mass of the
   tokens before it already reaches `top_p`; the first token is always kept;
5. `log_softmax` over the kept tokens (renormalised); removed tokens are `-inf`.

The engine reports `lp[token]` as a token's logprob and the K largest `lp` values (ties: lower
id first) as its top-K. A trainer that runs the same weights on (prompt + output) and applies this
function to the logits gets the engine's numbers back (fp32, up to kernel rounding). On the wire a
`-inf` is written as `LOGPROB_FLOOR`, since JSON has no infinity; it shows up only in a top-K row
when top_k < K or top_p cut the support below K tokens.
"""

from __future__ import annotations

import torch

LOGPROB_FLOOR = -1.0e4
GREEDY_BELOW = 1.0e-6


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Log-probabilities `[..., V]` of the distribution sampled from (see the module docstring)."""
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


# How an engine reports the logprob of a token it sampled (`training.engine_logprobs`), and so how the
# trainer must score ℓθ for its ratio to start at 1:
# - "sampled": of the distribution sampled from, truncated and renormalised (the hf engine);
# - "tempered": `log_softmax(logits / temperature)`, before top-k / top-p (SGLang's sampler);
# - "raw": `log_softmax(logits)` (SGLang with SGLANG_RETURN_ORIGINAL_LOGPROB set).
# Greedy requests are `log_softmax(logits)` in all three.
ENGINE_LOGPROBS = ("sampled", "tempered", "raw")


def engine_logprobs(logits: torch.Tensor, convention: str, temperature: float, top_k: int = -1,
                    top_p: float = 1.0) -> torch.Tensor:
    """Log-probabilities `[..., V]` as an engine of `convention` reports them (see ENGINE_LOGPROBS)."""
    if convention == "sampled":
        return sampling_logprobs(logits, temperature, top_k, top_p)
    if convention == "tempered":
        return sampling_logprobs(logits, temperature)
    if convention == "raw":
        return torch.log_softmax(logits.float(), dim=-1)
    raise ValueError(f"engine logprobs convention {convention!r}: expected one of {', '.join(ENGINE_LOGPROBS)}")


def pick_token(lp: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Draw one token id from a 1-D row of `sampling_logprobs`."""
    if temperature < GREEDY_BELOW:
        return int(torch.argmax(lp).item())
    return int(torch.multinomial(lp.exp(), 1, generator=generator).item())


def top_logprobs(lp: torch.Tensor, k: int) -> list[list[float | int | None]]:
    """The K largest entries of a 1-D logprob row as `[[lp, id, None], ...]`, best first."""
    if k <= 0:
        return []
    # Sort by (-lp, id) so equal values list the lower id first, as the docstring promises.
    order = torch.sort(lp, descending=True, stable=True).indices[:k]
    return [[_finite(float(lp[i])), int(i), None] for i in order.tolist()]


def _finite(x: float) -> float:
    return x if x > LOGPROB_FLOOR else LOGPROB_FLOOR
