"""The `hf` engine's request parsing, per-request RNG and sampling distribution, without a server."""

from __future__ import annotations

import torch

from reef_shim.engines.hf_engine import request_generator
from reef_shim.engines.request import parse_generate


def draws(body: dict, server_seed: int | None) -> list[float]:
    return torch.rand(4, generator=request_generator(parse_generate(body), server_seed)).tolist()


def test_a_server_seed_alone_does_not_give_every_request_the_same_draws() -> None:
    body = {"text": "x"}
    assert draws(body, 7) != draws(body, 7)
    assert draws({**body, "rid": "r"}, 7) == draws({**body, "rid": "r"}, 7)
    assert draws({**body, "rid": "r"}, 7) != draws({**body, "rid": "s"}, 7)
    assert draws({**body, "sampling_params": {"sampling_seed": 3}}, None) == draws(
        {**body, "sampling_params": {"sampling_seed": 3}}, 7)
