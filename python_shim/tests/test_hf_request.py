"""The `hf` engine's request parsing, per-request RNG and sampling distribution, without a server."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from reef_shim.engines.hf_engine import request_generator
from reef_shim.engines.request import RequestError, parse_generate
from reef_shim.engines.sampling import (LOGPROB_FLOOR, RowSampling, sample_rows, sampling_logprobs, support,
                                        tempered_logprobs, top_logprobs)


def draws(body: dict, server_seed: int | None) -> list[float]:
    return torch.rand(4, generator=request_generator(parse_generate(body), server_seed)).tolist()


def test_a_server_seed_alone_does_not_give_every_request_the_same_draws() -> None:
    body = {"text": "x"}
    assert draws(body, 7) != draws(body, 7)
    assert draws({**body, "rid": "r"}, 7) == draws({**body, "rid": "r"}, 7)
    assert draws({**body, "rid": "r"}, 7) != draws({**body, "rid": "s"}, 7)
    assert draws({**body, "sampling_params": {"sampling_seed": 3}}, None) == draws(
        {**body, "sampling_params": {"sampling_seed": 3}}, 7)


@pytest.mark.parametrize("sampling", [{"temperature": float("nan")}, {"temperature": float("inf")},
                                      {"sampling_seed": 1 << 64}, {"sampling_seed": -(1 << 63) - 1}])
def test_values_that_cannot_be_sampled_with_are_refused(sampling: dict) -> None:
    with pytest.raises(RequestError):
        parse_generate({"text": "x", "sampling_params": sampling})


def test_a_temperature_below_sglangs_epsilon_is_greedy() -> None:
    logits = torch.tensor([3.0, -2.0, 7.5, 7.0, -40.0])
    greedy = sampling_logprobs(logits, 0.0)
    for t in (1e-40, 1e-7):
        assert torch.equal(sampling_logprobs(logits, t, top_k=2, top_p=0.5), greedy)
        assert torch.equal(tempered_logprobs(logits, t), greedy)
        [pick] = sample_rows(logits.unsqueeze(0), [RowSampling(t, 2, 0.5, torch.Generator().manual_seed(0), True, 2)])
        assert pick.token == 2 and pick.logprob == float(greedy[2])
    # An exact tie: the lower id.
    [pick] = sample_rows(torch.tensor([[1.0, 5.0, 5.0]]), [RowSampling(0.0)])
    assert pick.token == 1


def brute_top(row: list[float], k: int) -> list[list[float | int | None]]:
    """The K best by (value descending, id ascending), by sorting everything."""
    return [[max(v, LOGPROB_FLOOR), i, None] for i, v in sorted(enumerate(row), key=lambda e: (-e[1], e[0]))[:k]]


def test_the_top_k_lists_equal_values_lower_id_first_also_across_the_kth_place() -> None:
    # Ties inside the K, across the K-th place, and values repeated many times.
    rows = torch.tensor([[-1.0, -2.0, -1.0, -3.0, -2.0, -2.0, -0.5, -2.0],
                         [-2.0, -2.0, -2.0, -2.0, -2.0, -2.0, -2.0, -2.0],
                         [-0.1, -5.0, -4.0, -3.0, -2.0, -1.0, -6.0, -7.0]])
    for k in (1, 2, 3, 4, 8, 20):
        got = top_logprobs(rows, k)
        assert got == [brute_top(r, k) for r in rows.tolist()], k
        assert top_logprobs(rows[0], k) == got[0]
    gen = torch.Generator().manual_seed(0)
    # Few distinct values over a vocabulary-sized row: ties everywhere.
    wide = torch.randint(0, 6, (4, 5000), generator=gen).float().neg()
    assert top_logprobs(wide, 7) == [brute_top(r, 7) for r in wide.tolist()]
    assert top_logprobs(torch.tensor([[0.0, float("-inf"), float("-inf")]]), 2) == [[[0.0, 0, None],
                                                                                      [LOGPROB_FLOOR, 1, None]]]


@pytest.mark.parametrize(("top_k", "top_p"), [(-1, 0.3), (-1, 0.9), (-1, 0.999), (5, 1.0), (50, 0.7), (3, 0.2),
                                              (2000, 0.95)])
def test_the_kept_tokens_are_those_the_reference_distribution_keeps(top_k: int, top_p: float) -> None:
    gen = torch.Generator().manual_seed(1)
    rows = [torch.randn(3000, generator=gen) * 3,
            torch.randn(3000, generator=gen) * 0.1,  # flat: top-p keeps a large share
            torch.randint(0, 4, (3000,), generator=gen).float(),  # ties at every cut
            torch.cat([torch.tensor([30.0]), torch.zeros(2999)])]  # one token holds all the mass
    for z in rows:
        reference = torch.isfinite(sampling_logprobs(z, 1.0, top_k, top_p)).nonzero().squeeze(1)
        assert support(z, top_k, top_p).tolist() == reference.tolist()


def test_draws_follow_the_truncated_distribution_and_the_report_is_tempered() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    row = RowSampling(temperature=0.7, top_k=3, top_p=0.95, generator=torch.Generator().manual_seed(2),
                      logprob=True, top_n=5)
    picks = [sample_rows(logits, [row])[0] for _ in range(20000)]
    want = sampling_logprobs(logits[0], 0.7, 3, 0.95).exp()
    seen = Counter(p.token for p in picks)
    assert set(seen) <= {i for i in range(6) if want[i] > 0}
    for i in range(6):
        assert abs(seen[i] / len(picks) - float(want[i])) < 0.015, (i, seen)
    tempered = tempered_logprobs(logits[0], 0.7)
    pick = picks[0]
    assert abs(pick.logprob - float(tempered[pick.token])) < 1e-6
    # Five entries though top_k is 3: all finite, the tempered values.
    assert [e[1] for e in pick.top] == [0, 1, 2, 3, 4]
    assert all(abs(e[0] - float(tempered[e[1]])) < 1e-6 for e in pick.top)


def test_a_rows_draws_depend_on_its_own_logits_and_generator_only() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 500, generator=gen) * 2
    params = [(1.0, -1, 1.0), (0.8, 20, 1.0), (1.2, -1, 0.7), (0.0, -1, 1.0), (0.5, 10, 0.9)]

    def rows() -> list[RowSampling]:
        return [RowSampling(t, k, p, torch.Generator().manual_seed(40 + i), True, 3) for i, (t, k, p) in enumerate(params)]

    batch_rows = rows()
    batched = [sample_rows(logits, batch_rows) for _ in range(30)]
    for i in range(5):
        alone_row = rows()[i]
        alone = [sample_rows(logits[i:i + 1], [alone_row])[0] for _ in range(30)]
        assert [(p.token, p.logprob, p.top) for p in alone] == [(b[i].token, b[i].logprob, b[i].top) for b in batched]


@pytest.mark.parametrize("sampling", [{"min_p": 0.05}, {"repetition_penalty": 1.1}, {"frequency_penalty": 0.5},
                                      {"n": 2}, {"regex": "[0-9]+"}, {"skip_special_tokens": False}])
def test_sglang_sampling_params_the_engine_does_not_implement_are_refused_not_ignored(sampling: dict) -> None:
    with pytest.raises(RequestError, match=next(iter(sampling))):
        parse_generate({"text": "x", "sampling_params": sampling})


def test_their_neutral_values_are_accepted() -> None:
    parse_generate({"text": "x", "sampling_params": {
        "min_p": 0.0, "repetition_penalty": 1, "frequency_penalty": 0, "presence_penalty": 0.0, "n": 1,
        "min_new_tokens": 0, "logit_bias": {}, "regex": None, "skip_special_tokens": True, "no_stop_trim": False,
        "stream_interval": 4}})


@pytest.mark.parametrize(("body", "message"), [
    ({"sampling_params": {"max_new_tokens": 1.5}}, "sampling_params.max_new_tokens: expected an integer"),
    ({"sampling_params": {"temperature": True}}, "sampling_params.temperature: expected"),
    ({"sampling_params": {"stop_token_ids": 7}}, "sampling_params.stop_token_ids: expected a list"),
    ({"sampling_params": []}, "sampling_params: expected an object"),
    ({"sampling_params": 0}, "sampling_params: expected an object"),
    ({"sampling_params": False}, "sampling_params: expected an object"),
])
def test_a_bad_sampling_parameter_is_named_with_its_path(body: dict, message: str) -> None:
    with pytest.raises(RequestError) as e:
        parse_generate({"text": "x", **body})
    assert e.value.message.startswith(message), e.value.message
