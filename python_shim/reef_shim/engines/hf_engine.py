"""The `hf` engine's model side: load, generate one request token by token, swap weights.

No HTTP here (that is `hf_server.py`). One request runs at a time: the caller holds `lock`
around `generate`, and both weight updates (`update_weights_from_disk`,
`update_weights_from_distributed`) read and check the new weights first, then take the same lock
to copy them in, so a swap waits for the request in flight and the next request sees the new
weights.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from .dist_weights import WeightGroups
from .request import GenRequest
from .sampling import RowSampling, sample_rows
from .weights import WeightError, load_checked_state_dict


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


class HFEngine:
    def __init__(self, model_path: str, weight_version: str = "default", seed: int | None = None,
                 weight_sync_timeout_s: float = 300.0) -> None:
        from tokenizers import Tokenizer
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a progress bar per load is noise in an engine log
        self.model_path = str(Path(model_path).resolve())
        self.tokenizer_path = self.model_path
        self.weight_version = weight_version
        self.seed = seed
        self.lock = threading.Lock()
        self.tokenizer = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
        self.config = AutoConfig.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.vocab_size = int(self.config.vocab_size)
        self.max_context_length = int(getattr(self.config, "max_position_embeddings", 4096))
        self.eos_ids = self._eos_ids(Path(model_path))
        self.tied = bool(getattr(self.config, "tie_word_embeddings", False))
        self.weight_groups = WeightGroups(weight_sync_timeout_s)

    def _eos_ids(self, path: Path) -> set[int]:
        ids: set[int] = set()
        sources = [self.config.eos_token_id]
        try:
            sources.append(json.loads((path / "generation_config.json").read_text()).get("eos_token_id"))
        except (OSError, ValueError):
            pass
        for value in sources:
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(int(v) for v in value)
        return ids

    def info(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "tokenizer_path": self.tokenizer_path, "is_generation": True,
                "weight_version": self.weight_version, "max_context_length": self.max_context_length,
                "vocab_size": self.vocab_size}

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def generate(self, req: GenRequest, should_stop: Callable[[], str | None]) -> Iterator[GenState]:
        """Yield the state after every new token; the caller must hold `lock`.

        `should_stop` is polled between tokens and says why the request must end (client gone,
        server stopping), or None: the last state then finishes with `abort` and that `message`,
        as SGLang's abort carries one.
        """
        prompt = req.input_ids if req.input_ids is not None else self.encode(req.text or "")
        req.check_prompt(prompt, self.vocab_size, self.max_context_length)
        sp = req.sampling
        budget = min(sp.max_new_tokens, self.max_context_length - len(prompt))
        # As SGLang: ignore_eos turns every stop token off, stop_token_ids included.
        stop_ids = set() if sp.ignore_eos else set(sp.stop_token_ids) | self.eos_ids
        row = RowSampling(temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p,
                          generator=request_generator(req, self.seed), logprob=req.return_logprob,
                          top_n=req.top_logprobs_num if req.return_logprob else 0)
        state = GenState(rid=req.rid or uuid.uuid4().hex, prompt_tokens=len(prompt))
        if budget <= 0:
            state.finish = {"type": "length", "matched": None}
            yield state
            return
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([prompt]), use_cache=True)
            while True:
                pick = sample_rows(out.logits[:, -1], [row])[0]
                token = pick.token
                state.output_ids.append(token)
                if pick.logprob is not None:
                    state.token_logprobs.append([pick.logprob, token, None])
                    state.top_logprobs.append(pick.top)
                # The length first, then stop tokens, then stop strings, as SGLang checks them: a
                # stop token or string completed by the last token the budget allows ends with
                # `length` and stays in the text.
                is_stop_token = False
                if len(state.output_ids) >= budget:
                    state.finish = {"type": "length", "matched": None}
                elif token in stop_ids:
                    is_stop_token = True
                    state.finish = {"type": "stop", "matched": token}
                elif (why := should_stop()) is not None:
                    state.finish = {"type": "abort", "matched": None, "message": why}
                # Decoding is O(length) per token: do it only when someone looks at the text.
                if sp.stop or req.stream or state.finish is not None:
                    self._update_text(state, sp.stop if state.finish is None else [], is_stop_token)
                yield state
                if state.finish is not None:
                    return
                out = self.model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values,
                                 use_cache=True)

    def _update_text(self, state: GenState, stops: list[str], stop_token: bool) -> None:
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

    def update_weights_from_disk(self, model_path: str, weight_version: str | None) -> None:
        """Load safetensors from `model_path` into the running model; raises WeightError."""
        state = load_checked_state_dict(Path(model_path), self.config, self.model)
        self._swap(state, weight_version)
        self.model_path = str(Path(model_path).resolve())

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str, backend: str) -> str:
        """Join a weight group as rank `rank_offset` (blocks until every rank joined); raises WeightError."""
        return self.weight_groups.init(master_address, master_port, rank_offset, world_size, group_name, backend)

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str, weight_version: str | None) -> None:
        """Receive tensors broadcast by rank 0 of the group and swap them in; raises WeightError."""
        state = self.weight_groups.receive(names, dtypes, shapes, group_name, self.model, self.tied)
        self._swap(state, weight_version)

    def destroy_weights_update_group(self, group_name: str) -> str:
        return self.weight_groups.destroy(group_name)

    def _swap(self, state: dict[str, torch.Tensor], weight_version: str | None) -> None:
        # Everything that can fail was checked before this point: the copy itself does not.
        with self.lock, torch.inference_mode():
            params = dict(self.model.named_parameters(remove_duplicate=False))
            buffers = dict(self.model.named_buffers())
            for name, tensor in state.items():
                target = params.get(name, buffers.get(name))
                if target is None:
                    raise WeightError(f"{name} vanished from the model")
                target.copy_(tensor.to(target.dtype))
            if weight_version is not None:
                self.weight_version = weight_version


__all__ = ["GenState", "HFEngine", "WeightError", "request_generator"]
