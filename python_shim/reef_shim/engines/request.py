"""Parse and check a `/generate` body (docs/internals.md, "Engine HTTP API").

Every field may be omitted or null; defaults follow SGLang: max_new_tokens 128, temperature 1.0,
top_p 1.0, top_k -1 (off). Extra keys are ignored, as SGLang ignores what it does not use, except
SGLang sampling parameters this engine does not implement (`UNIMPLEMENTED`): any value but the one
that changes nothing is refused, since ignoring it would sample from another distribution than the
client asked for while reporting logprobs as if it had not.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any


class RequestError(Exception):
    """A client mistake: HTTP 400 with `{error: {message, code}}`."""

    def __init__(self, message: str, code: str = "REEF_ERR_INVALID_ARGUMENT", status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status


@dataclass
class Sampling:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    sampling_seed: int | None = None


@dataclass
class GenRequest:
    input_ids: list[int] | None
    text: str | None
    sampling: Sampling
    return_logprob: bool
    top_logprobs_num: int
    stream: bool
    rid: str | None
    # The LoRA adapter's name (SGLang's `lora_path`, srt/managers/io_struct.py:276-277); None: the base.
    lora_path: str | None = None

    @property
    def sampling_seed(self) -> int | None:
        return self.sampling.sampling_seed

    def check_prompt(self, prompt: list[int], vocab_size: int, context: int) -> None:
        if not prompt:
            raise RequestError("the prompt is empty")
        bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise RequestError(f"input id {bad} is outside the vocabulary (0..{vocab_size - 1})")
        if len(prompt) >= context:
            raise RequestError(f"the input ({len(prompt)} tokens) is longer than the model's context length "
                               f"({context} tokens)")


# SGLang sampling parameters the hf engine does not implement -> the values that change nothing.
UNIMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "min_p": (0,), "frequency_penalty": (0,), "presence_penalty": (0,), "repetition_penalty": (1,),
    "min_new_tokens": (0,), "n": (1,), "logit_bias": ({},), "regex": (), "json_schema": (), "ebnf": (),
    "structural_tag": (), "no_stop_trim": (False,), "skip_special_tokens": (True,),
}


def _get(body: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any, where: str = "") -> Any:
    value = body.get(key)
    if value is None:
        return default
    # bool is an int in Python; a JSON true is not a token count.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise RequestError(f"{where}{key}: expected {_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise RequestError(f"{where}{key}: expected {_name(kind)}, got {type(value).__name__}")
    return value


def _name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({int: "an integer", float: "a number", str: "a string", bool: "a boolean",
                        list: "a list"}.get(k, k.__name__) for k in kinds)


def _int_list(value: list[Any], key: str) -> list[int]:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise RequestError(f"{key}: expected a list of integers (one prompt per request)")
    return list(value)


def parse_sampling(sp: Any) -> Sampling:
    if sp is None:
        sp = {}
    # Checked before any default applies: `[]`, `0` or `false` is a client mistake, not "defaults".
    if not isinstance(sp, dict):
        raise RequestError("sampling_params: expected an object")
    at = "sampling_params."
    for key, neutral in UNIMPLEMENTED.items():
        value = sp.get(key)
        # A JSON true equals 1 in Python: `n: true` is not `n: 1`.
        if value is not None and not any(value == n and isinstance(value, bool) == isinstance(n, bool)
                                         for n in neutral):
            raise RequestError(f"sampling_params.{key}: the hf engine does not implement it "
                               f"(accepted: {', '.join(json.dumps(n) for n in neutral) or 'null'})")
    stop = _get(sp, "stop", (str, list), [], at)
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) and s for s in stop):
        raise RequestError("sampling_params.stop: expected non-empty strings")
    out = Sampling(
        max_new_tokens=_get(sp, "max_new_tokens", int, 128, at),
        temperature=float(_get(sp, "temperature", (int, float), 1.0, at)),
        top_p=float(_get(sp, "top_p", (int, float), 1.0, at)),
        top_k=_get(sp, "top_k", int, -1, at),
        stop=stop,
        stop_token_ids=_int_list(_get(sp, "stop_token_ids", list, [], at), "sampling_params.stop_token_ids"),
        ignore_eos=_get(sp, "ignore_eos", bool, False, at),
        sampling_seed=_get(sp, "sampling_seed", int, None, at),
    )
    if out.max_new_tokens < 0:
        raise RequestError("sampling_params.max_new_tokens: must be >= 0")
    # A JSON NaN, Infinity or 1e999 parses to a non-finite float; it would sample from NaNs.
    if not math.isfinite(out.temperature) or out.temperature < 0:
        raise RequestError("sampling_params.temperature: must be a finite number >= 0")
    if not 0 < out.top_p <= 1:
        raise RequestError("sampling_params.top_p: must be in (0, 1]")
    if out.top_k == 0 or out.top_k < -1:
        raise RequestError("sampling_params.top_k: must be -1 (off) or a positive integer")
    if out.sampling_seed is not None and not -(1 << 63) <= out.sampling_seed < (1 << 64):
        raise RequestError("sampling_params.sampling_seed: must fit in 64 bits")
    return out


def parse_generate(body: Any) -> GenRequest:
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    input_ids = _get(body, "input_ids", list, None)
    text = _get(body, "text", str, None)
    if (input_ids is None) == (text is None):
        raise RequestError("give exactly one of input_ids and text")
    top_k = _get(body, "top_logprobs_num", int, 0)
    if top_k < 0:
        raise RequestError("top_logprobs_num: must be >= 0")
    rid = _get(body, "rid", str, None)
    return GenRequest(
        input_ids=None if input_ids is None else _int_list(input_ids, "input_ids"), text=text,
        sampling=parse_sampling(body.get("sampling_params")),
        return_logprob=_get(body, "return_logprob", bool, False), top_logprobs_num=top_k,
        stream=_get(body, "stream", bool, False), rid=rid, lora_path=_lora_path(body.get("lora_path")),
    )


def _lora_path(value: Any) -> str | None:
    """SGLang takes a name or one per input (io_struct.py:635-643); this engine takes one input, so a
    one-item list is that item."""
    if isinstance(value, list):
        if len(value) != 1:
            raise RequestError(f"lora_path: one input takes one adapter name, got a list of {len(value)}")
        value = value[0]
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise RequestError("lora_path: expected an adapter name (a non-empty string) or null")
    return value
