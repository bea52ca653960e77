"""Many LoRA adapters on the `hf` engine's one base (docs/internals.md "LoRA adapters").

Routes and bodies are SGLang 0.5.23's (checked in its wheel):

- `POST /load_lora_adapter {lora_name, lora_path, pinned?}` (srt/entrypoints/http_server.py:1652-1660,
  body srt/managers/io_struct.py:2516-2524) and `POST /unload_lora_adapter {lora_name}`
  (http_server.py:1676-1684, io_struct.py:2535-2539) answer `{success, error_message,
  loaded_adapters: {name: path}}` (io_struct.py:2572-2575, srt/lora/lora_manager.py:270-276), 200 on
  success, else 400. A name already loaded is refused (lora_manager.py:354-359).
- `/generate` takes `lora_path`: the adapter's *name*, a string or one per input
  (io_struct.py:276-277, 635-643); null or absent is the base.

An adapter registered by `/load_lora_adapter` is read into memory at once (so a bad directory is a
400 there, not at a request) and stays registered until `/unload_lora_adapter`. At most
`max_loaded_adapters` are held in memory: one more evicts the least recently used one that no
running request uses, and a request for an evicted one reads it back from its path before its
prefill (the same tensors, so the same tokens). SGLang bounds the same two things with
`--max-loaded-loras` and `--max-loras-per-batch`.

Memory is a set of PEFT adapter *slots*, at most `max_loaded_adapters`: an evicted adapter leaves
its slot to the next one of the same shape (rank, alpha, target modules, tensor shapes), whose
tensors are then copied into it. Injecting a new PEFT adapter instead walks every module of the
model once per adapter already there (1-2 s per load for SmolLM2 with a few dozen adapters on
this CPU, growing with their number); a copy costs the file read.

A batch may mix adapters and the base: each row's name is handed to PEFT's mixed-batch LoRA
forward (`adapter_names`), where a base row (`__base__`) gets the base layer's output and nothing
added, so a request without an adapter is served exactly as with no adapter loaded.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

BASE_ROW = "__base__"  # PEFT's name for a row that takes no adapter (peft/tuners/lora/layer.py)


class AdapterError(Exception):
    """A refused load or unload, or a request for an adapter not registered; the message says why."""


def check_adapter_dir(path: str) -> dict[str, Any]:
    """The adapter_config.json of a PEFT LoRA directory; raises AdapterError."""
    p = Path(path)
    if not p.is_dir():
        raise AdapterError(f"lora_path {path}: not a directory")
    try:
        config = json.loads((p / "adapter_config.json").read_text())
    except (OSError, ValueError) as e:
        raise AdapterError(f"lora_path {path}: no readable adapter_config.json ({e})") from e
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise AdapterError(f"lora_path {path}: peft_type {config.get('peft_type')!r}, expected LORA")
    if config.get("use_dora"):
        raise AdapterError(f"lora_path {path}: DoRA adapters cannot be mixed in a batch")
    if not (p / "adapter_model.safetensors").is_file():
        raise AdapterError(f"lora_path {path}: no adapter_model.safetensors")
    return config


class AdapterSet:
    """The engine's registered adapters and the LRU of those in memory. Changes to the model (a load,
    an eviction) happen only with no forward running: under `Scheduler.exclusive`/the engine lock
    from a handler, or in the model thread between forwards."""

    def __init__(self, model: Any, max_loaded: int) -> None:
        if max_loaded < 1:
            raise ValueError(f"max_loaded_adapters must be at least 1, got {max_loaded}")
        self.model = model  # the engine's transformers model; PEFT injects its LoRA layers into it
        self.max_loaded = max_loaded
        self.peft: Any = None  # the PeftModel around `model`, from the first load on
        self.registered: dict[str, str] = {}  # name -> path, in load order
        self._shape: dict[str, Any] = {}  # name -> what a slot must be to take it (`_signature`)
        self.loaded: OrderedDict[str, str] = OrderedDict()  # name -> its slot, least recently used first
        self._spare: dict[str, Any] = {}  # slot -> its shape: slots no adapter holds, reused by the next load
        self._slots = 0
        self._lock = threading.Lock()  # `registered` as handler threads read it
        self._rows: list[str] | None = None
        self._hooked: set[int] = set()
        self.stats = {"loads": 0, "evictions": 0, "reused": 0, "load_s": 0.0}

    # --- registry (handler threads) ---------------------------------------------------------------

    def check_known(self, name: str) -> None:
        with self._lock:
            if name not in self.registered:
                raise AdapterError(f"lora_path {name!r}: no adapter of that name is loaded "
                                   "(POST /load_lora_adapter first)")

    def listing(self) -> dict[str, str]:
        with self._lock:
            return dict(self.registered)

    def register(self, name: str, path: str) -> None:
        """Load a new adapter (the caller holds the model: no forward running)."""
        if not isinstance(name, str) or not name:
            raise AdapterError("lora_name: expected a non-empty string")
        with self._lock:
            if name in self.registered:
                raise AdapterError(f"Failed to load LoRA adapter {name} because it is already loaded")
        config = check_adapter_dir(path)
        shapes = self._check_fits(path)
        self._make_room(busy=set())
        signature = _signature(config, shapes)
        self._load(name, path, signature)
        with self._lock:
            self.registered[name] = path
            self._shape[name] = signature

    def unregister(self, name: str) -> None:
        """Forget an adapter (the caller holds the model: no request is using it)."""
        with self._lock:
            if name not in self.registered:
                raise AdapterError(f"LoRA adapter {name!r} is not loaded")
            del self.registered[name]
            self._shape.pop(name, None)
        if name in self.loaded:
            self._delete_slot(self.loaded.pop(name))  # its memory back now, not at the next load

    # --- the model thread -------------------------------------------------------------------------

    def acquire(self, name: str | None, busy: set[str]) -> bool:
        """Make `name` loaded before a request's prefill (None: the base, always there); `busy`: the
        adapters the running rows use, never evicted. False when every loaded one is busy: the
        request waits for rows to finish. Raises AdapterError when `name` is no longer registered."""
        if name is None:
            return True
        if name in self.loaded:
            self.loaded.move_to_end(name)
            return True
        with self._lock:
            path, signature = self.registered.get(name), self._shape.get(name)
        if path is None:
            raise AdapterError(f"lora_path {name!r}: the adapter was unloaded before the request started")
        if not self._make_room(busy):
            return False
        self._load(name, path, signature)
        return True

    @contextmanager
    def rows(self, names: list[str | None]) -> Iterator[None]:
        """The adapter of each row of the forwards inside (None: the base)."""
        if self.peft is None:
            assert all(n is None for n in names), "an adapter row with no adapter loaded"
            yield
            return
        self._rows = [BASE_ROW if n is None else self.loaded[n] for n in names]
        try:
            yield
        finally:
            self._rows = None

    # --- internals ----------------------------------------------------------------------------------

    def _make_room(self, busy: set[str]) -> bool:
        while len(self.loaded) >= self.max_loaded:
            victim = next((n for n in self.loaded if n not in busy), None)
            if victim is None:
                return False
            self._evict(victim)
        return True

    def _load(self, name: str, path: str, signature: Any) -> None:
        """Into a spare slot of its shape (a copy), else into a new PEFT adapter (`_make_room` left
        room for one: a spare of another shape is deleted first)."""
        started = time.monotonic()
        slot = next((s for s, sig in self._spare.items() if sig == signature), None)
        if slot is not None:
            self._copy_into(slot, path)
            del self._spare[slot]
            self.stats["reused"] += 1
        else:
            if len(self.loaded) + len(self._spare) >= self.max_loaded:
                self._delete_slot(next(iter(self._spare)))
            slot = self._inject(path)
        self.loaded[name] = slot
        self.stats["loads"] += 1
        self.stats["load_s"] += time.monotonic() - started

    def _inject(self, path: str) -> str:
        self._slots += 1
        slot = f"slot{self._slots}"
        try:
            if self.peft is None:
                from peft import PeftModel

                self.peft = PeftModel.from_pretrained(self.model, path, adapter_name=slot, is_trainable=False)
            else:
                self.peft.load_adapter(path, adapter_name=slot, is_trainable=False)
        except Exception as e:  # PEFT's ValueError/KeyError/RuntimeError for a directory that does not fit
            self._drop_partial(slot)
            raise AdapterError(f"lora_path {path}: cannot load it on this base: {type(e).__name__}: {e}") from e
        self.model.eval()
        self._hook_new_layers()
        return slot

    def _copy_into(self, slot: str, path: str) -> None:
        """The adapter's tensors into a slot of its shape (its scaling is the slot's: same r and alpha)."""
        import torch
        from safetensors.torch import load_file

        tensors = load_file(str(Path(path) / "adapter_model.safetensors"))
        params = {n: p for n, p in self.peft.named_parameters() if f".{slot}." in n}
        with torch.no_grad():
            for key, t in tensors.items():
                target = params[_slot_key(key, slot)]
                target.copy_(t.to(target.dtype))

    def _check_fits(self, path: str) -> dict[str, tuple[int, ...]]:
        """Every tensor of the adapter on a linear layer of this base, of its shape: checked before
        PEFT touches the model (a refusal then leaves it as it was)."""
        import torch
        from safetensors import safe_open

        modules = dict(self.model.named_modules())
        try:
            with safe_open(str(Path(path) / "adapter_model.safetensors"), framework="pt") as f:
                shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        except Exception as e:  # a cut-short or foreign file
            raise AdapterError(f"lora_path {path}: adapter_model.safetensors is unreadable: {e}") from e
        for key, shape in shapes.items():
            parts = key.split(".")
            if not key.startswith("base_model.model."):
                raise AdapterError(f"lora_path {path}: tensor {key} is not in PEFT's key format (base_model.model.…)")
            if len(parts) < 3 or parts[-1] != "weight" or parts[-2] not in ("lora_A", "lora_B"):
                raise AdapterError(f"lora_path {path}: tensor {key} is not a LoRA A/B weight")
            where = ".".join(parts[:-2])
            for prefix in ("base_model.model.", ""):
                if where.startswith(prefix):
                    module = modules.get(where[len(prefix):])
                    if module is not None:
                        break
            base = getattr(module, "base_layer", module)
            if not isinstance(base, torch.nn.Linear):
                raise AdapterError(f"lora_path {path}: tensor {key}: this base has no linear layer {where}")
            want = base.in_features if parts[-2] == "lora_A" else base.out_features
            have = shape[1] if parts[-2] == "lora_A" else shape[0]
            if len(shape) != 2 or have != want:
                raise AdapterError(f"lora_path {path}: tensor {key} has shape {list(shape)}, which does not fit "
                                   f"{where} ({base.in_features} -> {base.out_features})")
        return shapes

    def _drop_partial(self, slot: str) -> None:
        if self.peft is not None and slot in self.peft.peft_config:
            try:
                self.peft.delete_adapter(slot)
            except Exception:  # nothing of it was injected
                pass

    def _evict(self, name: str) -> None:
        """Out of memory as far as requests go: its slot stays, spare, for the next adapter of its shape."""
        with self._lock:
            signature = self._shape.get(name)
        self._spare[self.loaded.pop(name)] = signature
        self.stats["evictions"] += 1

    def _delete_slot(self, slot: str) -> None:
        import warnings

        self._spare.pop(slot, None)
        with warnings.catch_warnings():
            # PEFT warns that another adapter became "active": rows name their adapters here, and
            # the active one is never used (`_inject_rows`).
            warnings.filterwarnings("ignore", message=".*was active which is now deleted.*")
            self.peft.delete_adapter(slot)

    def _hook_new_layers(self) -> None:
        """Every LoRA layer reads its rows' adapters from `rows` (the base, outside it)."""
        from peft.tuners.lora import LoraLayer

        for module in self.model.modules():
            if isinstance(module, LoraLayer) and id(module) not in self._hooked:
                module.register_forward_pre_hook(self._inject_rows, with_kwargs=True)
                self._hooked.add(id(module))

    def _inject_rows(self, _module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        x = args[0] if args else kwargs["x"]
        names = self._rows if self._rows is not None else [BASE_ROW] * len(x)
        return args, {**kwargs, "adapter_names": names}

    def memory_bytes(self) -> int:
        """Bytes of the adapters' tensors in memory."""
        if self.peft is None:
            return 0
        return sum(p.numel() * p.element_size() for n, p in self.model.named_parameters() if "lora_" in n)


# adapter_config.json keys that change what a slot computes; the rest (paths, dropout, which is off
# at inference, versions) do not.
_SHAPE_KEYS = ("r", "lora_alpha", "target_modules", "use_rslora", "use_dora", "fan_in_fan_out", "bias",
               "modules_to_save", "layers_to_transform", "layers_pattern", "rank_pattern", "alpha_pattern",
               "exclude_modules", "lora_bias")


def _signature(config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> str:
    """What two adapters must share for one to take the other's slot."""
    cfg = {k: sorted(v) if isinstance(v, list) else v for k, v in config.items() if k in _SHAPE_KEYS}
    return json.dumps([cfg, sorted((k, list(v)) for k, v in shapes.items())], sort_keys=True, default=str)


def _slot_key(key: str, slot: str) -> str:
    """`base_model.model.<module>.lora_A.weight` → the slot's parameter name in the PeftModel."""
    head, kind, tail = key.rsplit(".", 2)
    return f"{head}.{kind}.{slot}.{tail}"


__all__ = ["AdapterError", "AdapterSet", "BASE_ROW", "check_adapter_dir"]
