"""The `hf` engine's model side: load, generate, swap weights. No HTTP here (`http_handler.py`).

Served requests go through the `Scheduler` (continuous batching, `scheduler.py`): `start` it, then
`submit` each request. `generate` runs one request in the caller's thread instead (the trainer
tests build their tasks so), with the caller holding `lock`. Both weight updates
(`update_weights_from_disk`, `update_weights_from_distributed`) read and check the new weights
first, then copy them in with no request generating: `Scheduler.exclusive` when the scheduler
runs (it waits for the batch to drain and holds new requests meanwhile), else `lock`.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from .dist_weights import WeightGroups
from .generation import GenState, Run, request_generator
from .request import GenRequest
from .sampling import GREEDY_BELOW, sample_rows
from .scheduler import Scheduler, Ticket
from .scripted import Script
from .weights import WeightError, load_checked_state_dict

# `--dtype`: the weights' dtype. Logits are cast to fp32 before any softmax either way.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class HFEngine:
    def __init__(self, model_path: str, weight_version: str = "default", seed: int | None = None,
                 weight_sync_timeout_s: float = 300.0, dtype: str = "fp32", script: "Script | None" = None,
                 max_loaded_adapters: int = 8) -> None:
        from tokenizers import Tokenizer
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        # Imported here, as transformers is: the server answers /health 503 while this loads.
        from .kv_batch import check_full_attention

        hf_logging.disable_progress_bar()  # a progress bar per load is noise in an engine log
        self.model_path = str(Path(model_path).resolve())
        self.tokenizer_path = self.model_path
        self.weight_version = weight_version
        self.seed = seed
        self.lock = threading.Lock()
        self.tokenizer = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
        self.config = AutoConfig.from_pretrained(model_path)
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
        self.dtype = dtype
        check_full_attention(self.config)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype]).eval()
        self.vocab_size = int(self.config.vocab_size)
        self.max_context_length = int(getattr(self.config, "max_position_embeddings", 4096))
        self.eos_ids = self._eos_ids(Path(model_path))
        self.script = script
        # A scripted reply ends with the chat template's end-of-turn token when it is an eos id.
        im_end = self.tokenizer.token_to_id("<|im_end|>")
        self.end_of_reply = im_end if im_end in self.eos_ids else min(self.eos_ids, default=None)
        self.tied = bool(getattr(self.config, "tie_word_embeddings", False))
        self.weight_groups = WeightGroups(weight_sync_timeout_s)
        self.scheduler: Scheduler | None = None
        # Colocated with a trainer (`release_memory_occupation`): the shapes of the weights given
        # back, while they are; then the names still to be sent before it may generate again.
        self.released: dict[str, torch.Size] | None = None
        self.unset: set[str] = set()
        from .lora_serving import AdapterSet

        # LoRA adapters served beside the base (`lora_serving.py`), at most this many in memory.
        self.adapters = AdapterSet(self.model, max_loaded_adapters)

    def start(self, max_batch: int) -> None:
        """Start the model thread that serves `submit`, at most `max_batch` requests per step."""
        self.scheduler = Scheduler(self, max_batch)
        self.scheduler.start()

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

    def prepare(self, req: GenRequest, should_stop: Callable[[], str | None]) -> Run:
        """Encode and check the prompt (RequestError when it does not fit) and set up the request's
        sampling. `should_stop` is polled between tokens and says why the request must end (client
        gone, server stopping), or None: it then finishes with `abort` and that `message`, as
        SGLang's abort carries one."""
        prompt = req.input_ids if req.input_ids is not None else self.encode(req.text or "")
        if req.lora_path is not None:
            self._check_adapter(req.lora_path)
        run = Run(req, prompt, vocab_size=self.vocab_size, context=self.max_context_length, eos_ids=self.eos_ids,
                  server_seed=self.seed, decode=self.decode, should_stop=should_stop)
        if self.script is not None and req.sampling.temperature >= GREEDY_BELOW:
            reply = self.script.reply_for(self.decode(prompt))
            if reply is not None:
                run.sampling.forced = self.encode(reply) + ([self.end_of_reply] if self.end_of_reply is not None else [])
        return run

    def submit(self, req: GenRequest, should_stop: Callable[[], str | None]) -> Ticket:
        """Queue a request for the running batch (`start` first); read its states from the ticket."""
        assert self.scheduler is not None, "start() the scheduler before submitting"
        return self.scheduler.submit(self.prepare(req, should_stop))

    def generate(self, req: GenRequest, should_stop: Callable[[], str | None]) -> Iterator[GenState]:
        """Run one request alone in the caller's thread, yielding its state after every token (the
        same object, updated); the caller must hold `lock`."""
        from .kv_batch import KVBatch

        run = self.prepare(req, should_stop)
        run.state.weight_version = self.weight_version
        run.state.adapter = req.lora_path
        if run.finished:
            yield run.state
            return
        kv = KVBatch(self.model)
        self._acquire_adapter(req.lora_path, set())
        with torch.inference_mode(), self.adapters.rows([req.lora_path]):
            logits, cache = kv.prefill(run.prompt)
            while True:
                run.accept(sample_rows(logits.unsqueeze(0), [run.sampling])[0])
                yield run.state
                if run.finished:
                    return
                if kv.size == 0:
                    kv.merge([cache])
                logits = kv.step([run.last_token])[0]

    # --- LoRA adapters (lora_serving.py) ------------------------------------------------------------

    @contextmanager
    def _adapter_request(self) -> Iterator[None]:
        """A request naming an adapter the engine cannot serve is the request's fault: a 400."""
        from .lora_serving import AdapterError
        from .request import RequestError

        try:
            yield
        except AdapterError as e:
            raise RequestError(str(e), "REEF_ERR_NOT_FOUND", 400) from e

    def _check_adapter(self, name: str) -> None:
        with self._adapter_request():
            self.adapters.check_known(name)

    def _acquire_adapter(self, name: str | None, busy: set[str]) -> bool:
        with self._adapter_request():
            return self.adapters.acquire(name, busy)

    def _exclusive(self) -> Any:
        """No request generating while held: the scheduler's pause of its batches, else the engine's lock."""
        return self.scheduler.exclusive() if self.scheduler is not None else self.lock

    def load_lora_adapter(self, lora_name: str, lora_path: str) -> None:
        """SGLang's `/load_lora_adapter`: register and read an adapter, with no request generating
        (a running batch finishes first; new requests wait). Raises lora_serving.AdapterError."""
        self._require_memory()
        with self._exclusive():
            self.adapters.register(lora_name, lora_path)

    def unload_lora_adapter(self, lora_name: str) -> None:
        """SGLang's `/unload_lora_adapter`: the requests using it finish first. Raises AdapterError."""
        with self._exclusive():
            self.adapters.unregister(lora_name)

    def _refuse_with_adapters(self) -> None:
        # PEFT has wrapped the adapted layers (their weights are now `<layer>.base_layer.weight`),
        # and adapters are trained against a frozen base: a base update would silently change
        # every adapter's outputs.
        if self.adapters.peft is not None:
            raise WeightError("LoRA adapters are loaded on this engine: its base weights are frozen "
                              "(restart the engine to serve other base weights)")

    def update_weights_from_disk(self, model_path: str, weight_version: str | None) -> None:
        """Load safetensors from `model_path` into the running model; raises WeightError."""
        self._require_memory()
        self._refuse_with_adapters()
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

    def update_weights_from_tensor(self, payloads: list[str], load_format: str | None,
                                   weight_version: str | None) -> int:
        """SGLang's `/update_weights_from_tensor`: the weights of one call, handed over in shared
        memory (CUDA IPC on a GPU, `tensor_ipc`), inside an update session; raises WeightError.
        Returns how many tensors it took."""
        from ..tensor_ipc import PayloadError, deserialize
        from .dist_weights import checked

        if not self.weight_groups.in_session():
            raise WeightError("update_weights_from_tensor must run between begin_weight_update() and "
                              "end_weight_update()")
        if load_format is not None:
            raise WeightError(f"load_format {load_format!r}: the hf engine takes the default (named tensors) only")
        if len(payloads) != 1:
            raise WeightError(f"{len(payloads)} payloads: the hf engine is one rank and takes exactly one")
        self._require_memory()
        try:
            named = deserialize(payloads[0])
        except PayloadError as e:
            raise WeightError(f"serialized_named_tensors: {e}") from e
        state = checked(dict(named), self.model, self.tied)
        # Copied in (and cast) under the generation lock, so nothing here holds on to the sender's memory.
        self._swap(state, weight_version)
        return len(state)

    def _weights(self) -> dict[str, torch.nn.Parameter]:
        """Each parameter once (a tied lm_head is the embedding), by its state-dict name."""
        seen: set[int] = set()
        out = {}
        for name, p in self.model.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out[name] = p
        return out

    def release_memory_occupation(self, tags: list[str] | None) -> str:
        """Give back the weights' memory (tag `weights`) while a colocated trainer steps; `kv_cache`
        holds nothing here between requests. The HTTP handler refuses it while a request is
        admitted, as SGLang refuses it unless idle. The weights are not kept: after resume they must
        all be sent again."""
        tags = _memory_tags(tags)
        if "weights" not in tags:
            return "nothing to release (the hf engine keeps no KV cache between requests)"
        if self.released is not None:
            raise WeightError("the weights' memory is already released")
        with self._exclusive():
            weights = self._weights()
            self.released = {name: p.shape for name, p in weights.items()}
            for p in weights.values():
                p.data = torch.empty(0, dtype=p.dtype)
        return f"released {len(self.released)} weight tensors"

    def resume_memory_occupation(self, tags: list[str] | None) -> str:
        """Take the weights' memory back, uninitialised (as SGLang does without its CPU backup): the
        engine refuses to generate until every weight has been sent again."""
        tags = _memory_tags(tags)
        if "weights" not in tags:
            return "nothing to resume (the hf engine keeps no KV cache between requests)"
        if self.released is None:
            raise WeightError("the weights' memory is not released")
        with self.lock:
            weights = self._weights()
            for name, p in weights.items():
                p.data = torch.empty(self.released[name], dtype=p.dtype)
            self.unset = set(weights)
            self.released = None
        return f"resumed {len(weights)} weight tensors; send them all before generating"

    def _require_memory(self) -> None:
        if self.released is not None:
            raise WeightError("the weights' memory is released: resume_memory_occupation first")

    def serving_refusal(self) -> str | None:
        """Why the engine cannot generate now (its weights given back, or not all sent again), or None."""
        if self.released is not None:
            return "the engine's weight memory is released (a colocated trainer is stepping)"
        if self.unset:
            return f"{len(self.unset)} weight tensors were not sent again since the memory was resumed"
        return None

    def _swap(self, state: dict[str, torch.Tensor], weight_version: str | None) -> None:
        # Everything that can fail was checked before this point: the copy itself does not. The copy
        # casts into the served dtype (an fp32 trainer's weights into a bf16 engine).
        self._require_memory()
        self._refuse_with_adapters()
        with self._exclusive(), torch.inference_mode():
            params = dict(self.model.named_parameters(remove_duplicate=False))
            buffers = dict(self.model.named_buffers())
            for name, tensor in state.items():
                target = params.get(name, buffers.get(name))
                if target is None:
                    raise WeightError(f"{name} vanished from the model")
                target.copy_(tensor.to(target.dtype))
            if weight_version is not None:
                self.weight_version = weight_version
            self.unset -= set(state)


MEMORY_TAGS = ("weights", "kv_cache")


def _memory_tags(tags: list[str] | None) -> set[str]:
    """SGLang's tags (`srt/managers/io_struct.py:2177-2190`); none means all of them."""
    if tags is None:
        return set(MEMORY_TAGS)
    unknown = sorted(set(tags) - set(MEMORY_TAGS))
    if unknown:
        raise WeightError(f"unknown memory tag(s) {unknown}: expected {', '.join(MEMORY_TAGS)}")
    return set(tags)


__all__ = ["DTYPES", "GenState", "HFEngine", "WeightError", "request_generator"]
