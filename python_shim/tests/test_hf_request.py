"""The `hf` engine's request parsing, per-request RNG and sampling distribution, without a server."""

from __future__ import annotations

import pytest
import torch

from reef_shim.engines.hf_engine import request_generator
from reef_shim.engines.request import RequestError, parse_generate
from reef_shim.engines.sampling import pick_token, sampling_logprobs


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
        lp = sampling_logprobs(logits, t, top_k=2, top_p=0.5)
        assert torch.equal(lp, greedy)
        assert pick_token(lp, t, torch.Generator().manual_seed(0)) == 2


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
