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

A batch may mix adapters and the base: each row's name is handed to PEFT's mixed-batch LoRA
forward (`adapter_names`), where a base row (`__base__`) gets the base layer's output and nothing
added, so a request without an adapter is served exactly as with no adapter loaded.
"""

from __future__ import annotations

import hashlib
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


def peft_name(lora_name: str) -> str:
    """PEFT's module-safe name for an adapter (a client's name may hold `.`, which a module name may not)."""
    return "l" + hashlib.sha256(lora_name.encode()).hexdigest()[:16]


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
        self.loaded: OrderedDict[str, None] = OrderedDict()  # names in memory, least recently used first
        self._lock = threading.Lock()  # `registered` as handler threads read it
        self._rows: list[str] | None = None
        self._hooked: set[int] = set()
        self.stats = {"loads": 0, "evictions": 0, "load_s": 0.0}

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
        check_adapter_dir(path)
        self._check_fits(path)
        self._make_room(busy=set())
        self._load(name, path)
        with self._lock:
            self.registered[name] = path

    def unregister(self, name: str) -> None:
        """Forget an adapter (the caller holds the model: no request is using it)."""
        with self._lock:
            if name not in self.registered:
                raise AdapterError(f"LoRA adapter {name!r} is not loaded")
            del self.registered[name]
        if name in self.loaded:
            self._evict(name)

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
            path = self.registered.get(name)
        if path is None:
            raise AdapterError(f"lora_path {name!r}: the adapter was unloaded before the request started")
        if not self._make_room(busy):
            return False
        self._load(name, path)
        return True

    @contextmanager
    def rows(self, names: list[str | None]) -> Iterator[None]:
        """The adapter of each row of the forwards inside (None: the base)."""
        if self.peft is None:
            assert all(n is None for n in names), "an adapter row with no adapter loaded"
            yield
            return
        self._rows = [BASE_ROW if n is None else peft_name(n) for n in names]
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

    def _load(self, name: str, path: str) -> None:
        started = time.monotonic()
        try:
            if self.peft is None:
                from peft import PeftModel

                self.peft = PeftModel.from_pretrained(self.model, path, adapter_name=peft_name(name),
                                                      is_trainable=False)
            else:
                self.peft.load_adapter(path, adapter_name=peft_name(name), is_trainable=False)
        except Exception as e:  # PEFT's ValueError/KeyError/RuntimeError for a directory that does not fit
            self._drop_partial(name)
            raise AdapterError(f"lora_path {path}: cannot load it on this base: {type(e).__name__}: {e}") from e
        self.model.eval()
        self._hook_new_layers()
        self.loaded[name] = None
        self.stats["loads"] += 1
        self.stats["load_s"] += time.monotonic() - started

    def _check_fits(self, path: str) -> None:
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

    def _drop_partial(self, name: str) -> None:
        if self.peft is not None and peft_name(name) in self.peft.peft_config:
            try:
                self.peft.delete_adapter(peft_name(name))
            except Exception:  # nothing of it was injected
                pass

    def _evict(self, name: str) -> None:
        import warnings

        with warnings.catch_warnings():
            # PEFT warns that another adapter became "active": rows name their adapters here, and
            # the active one is never used (`_inject`).
            warnings.filterwarnings("ignore", message=".*was active which is now deleted.*")
            self.peft.delete_adapter(peft_name(name))
        del self.loaded[name]
        self.stats["evictions"] += 1

    def _hook_new_layers(self) -> None:
        """Every LoRA layer reads its rows' adapters from `rows` (the base, outside it)."""
        from peft.tuners.lora import LoraLayer

        for module in self.model.modules():
            if isinstance(module, LoraLayer) and id(module) not in self._hooked:
                module.register_forward_pre_hook(self._inject, with_kwargs=True)
                self._hooked.add(id(module))

    def _inject(self, _module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        x = args[0] if args else kwargs["x"]
        names = self._rows if self._rows is not None else [BASE_ROW] * len(x)
        return args, {**kwargs, "adapter_names": names}

    def memory_bytes(self) -> int:
        """Bytes of the adapters' tensors in memory."""
        if self.peft is None:
            return 0
        return sum(p.numel() * p.element_size() for n, p in self.model.named_parameters() if "lora_" in n)


__all__ = ["AdapterError", "AdapterSet", "BASE_ROW", "check_adapter_dir", "peft_name"]
