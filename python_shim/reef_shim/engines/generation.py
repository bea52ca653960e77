"""One request's generation, whatever batch it runs in: its prompt, RNG, output so far and the rules
that end it (hf_server.py's docstring, "Finishing").

A `Run` is built in the request's handler thread (the prompt is encoded and checked there, so a bad
prompt is a 400 before anything queues), then fed one `Pick` per token by whoever steps the model:
`accept` appends it and decides whether the request ends.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .request import GenRequest
from .sampling import Pick, RowSampling


@dataclass
class GenState:
    """A request's output so far; `finish` is set on the last state."""

    rid: str
    prompt_tokens: int
    output_ids: list[int] = field(default_factory=list)
    token_logprobs: list[list[Any]] = field(default_factory=list)
    top_logprobs: list[list[list[Any]]] = field(default_factory=list)
    text: str = ""
    finish: dict[str, Any] | None = None
    # False while the text ends inside a multi-byte character or a possible stop string: a stream
    # skips such states so that cumulative text never shrinks.
    stable: bool = True
    # The weights every token came from (a swap waits until no request is generating).
    weight_version: str = "default"
    # The LoRA adapter (its `/load_lora_adapter` name) the tokens came from; None: the base.
    adapter: str | None = None

    def snapshot(self) -> "GenState":
        """A copy that later tokens do not change (for another thread to send)."""
        return GenState(self.rid, self.prompt_tokens, list(self.output_ids), list(self.token_logprobs),
                        list(self.top_logprobs), self.text, self.finish, self.stable, self.weight_version,
                        self.adapter)


def request_generator(req: GenRequest, server_seed: int | None) -> torch.Generator:
    """Per-request RNG: `sampling_seed` if given, else derived from (server seed, rid) when both are
    set, else random."""
    g = torch.Generator(device="cpu")
    if req.sampling_seed is not None:
        g.manual_seed(req.sampling_seed)
    elif server_seed is not None and req.rid is not None:
        # Without a rid every request would share one seed and draw the same sample.
        digest = hashlib.sha256(f"{server_seed}:{req.rid}".encode()).digest()
        g.manual_seed(int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF)
    else:
        g.seed()
    return g


class Run:
    """A request inside the batch. `decode` turns ids into text; `should_stop` is polled once per
    token and says why the request must end (client gone, server stopping), or None."""

    def __init__(self, req: GenRequest, prompt: list[int], *, vocab_size: int, context: int, eos_ids: set[int],
                 server_seed: int | None, decode: Callable[[list[int]], str],
                 should_stop: Callable[[], str | None]) -> None:
        req.check_prompt(prompt, vocab_size, context)
        sp = req.sampling
        self.req = req
        self.prompt = prompt
        self.budget = min(sp.max_new_tokens, context - len(prompt))
        # As SGLang: ignore_eos turns every stop token off, stop_token_ids included.
        self.stop_ids = set() if sp.ignore_eos else set(sp.stop_token_ids) | eos_ids
        self.sampling = RowSampling(temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p,
                                    generator=request_generator(req, server_seed), logprob=req.return_logprob,
                                    top_n=req.top_logprobs_num if req.return_logprob else 0)
        self.decode = decode
        self.should_stop = should_stop
        self.state = GenState(rid=req.rid or uuid.uuid4().hex, prompt_tokens=len(prompt))
        if self.budget <= 0:
            self.state.finish = {"type": "length", "matched": None}

    @property
    def finished(self) -> bool:
        return self.state.finish is not None

    @property
    def last_token(self) -> int:
        return self.state.output_ids[-1]

    def accept(self, pick: Pick) -> None:
        """Append one token and apply the finishing rules in SGLang 0.5.23's order
        (`srt/managers/schedule_batch.py:2007-2044` `update_finish_state`): a stop string, then a stop
        token, then the length, so a stop completed by the last token the budget allows ends with
        `stop` (a stop string cut from the text), not `length`. Releases up to 0.5.16 checked the
        length first; the gateway answers alike either way (`settleStop`)."""
        state, sp = self.state, self.req.sampling
        token = pick.token
        state.output_ids.append(token)
        if pick.logprob is not None:
            state.token_logprobs.append([pick.logprob, token, None])
            state.top_logprobs.append(pick.top)
        is_stop_token = token in self.stop_ids
        # Decoding is O(length) per token: do it only when someone looks at the text.
        if sp.stop or self.req.stream:
            self._update_text(sp.stop, is_stop_token)
            if state.finish is not None:
                return
        if is_stop_token:
            state.finish = {"type": "stop", "matched": token}
        elif len(state.output_ids) >= self.budget:
            state.finish = {"type": "length", "matched": None}
        elif (why := self.should_stop()) is not None:
            state.finish = {"type": "abort", "matched": None, "message": why}
        if state.finish is not None:
            self._update_text([], is_stop_token)  # the final text: no stop string is left to hold back

    def _update_text(self, stops: list[str], stop_token: bool) -> None:
        state = self.state
        # A matched stop token is kept in output_ids (a trainer learns to emit it) but not in text.
        ids = state.output_ids[:-1] if stop_token else state.output_ids
        text = self.decode(ids)
        for s in stops:
            at = text.find(s)
            if at >= 0:
                state.text = text[:at]
                state.finish = {"type": "stop", "matched": s}
                state.stable = True
                return
        state.text = text
        tail_is_prefix = any(text.endswith(s[:n]) for s in stops for n in range(1, len(s)))
        state.stable = not text.endswith("\ufffd") and not tail_is_prefix


__all__ = ["GenState", "Run", "request_generator"]
