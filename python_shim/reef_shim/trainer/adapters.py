"""One LoRA adapter per scenario on a frozen base (docs/training.md "Adapters").

With `trainer-start.spec.adapter` set, a rank holds the base model once, frozen, with one PEFT LoRA
adapter per scenario injected into it, and one AdamW per adapter over that adapter's parameters
alone. A step trains the adapter of the batch's scenario (a batch is one scenario's:
recipes/openclawrl/task2batch.ts). The teacher of the OPD term is the same module with every
adapter switched off (`BaseView`): the base the full-weight trainer keeps a second frozen copy of.

A checkpoint of one adapter is a plain PEFT adapter directory plus its optimizer:

    <checkpointDir>/v<n>/adapter_config.json        PEFT's LoraConfig
    <checkpointDir>/v<n>/adapter_model.safetensors  PEFT's key format (no adapter name in the keys)
    <checkpointDir>/v<n>/optimizer.safetensors      AdamW's exp_avg / exp_avg_sq / step per parameter
    <checkpointDir>/v<n>/reef_checkpoint.json       {weightVersion, parent, batchId, scenario, optimizer: {...}}

so an engine loads it as is (`/load_lora_adapter`), and a restarted trainer that loads it
(`trainer-load`) resumes that adapter's optimizer exactly, not afresh as a full-weight load does.
"""

from __future__ import annotations

import hashlib
import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from .checkpoint import META, publish_dir

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
OPTIMIZER = "optimizer.safetensors"
SPEC_KEYS = ("type", "r", "alpha", "dropout", "targetModules")


class AdapterError(ValueError):
    """A bad adapter spec or checkpoint: the message names what is wrong."""


def check_spec(spec: Any, path: str = "trainer-start.spec.adapter") -> dict[str, Any]:
    """The adapter spec, checked: `{type: 'lora', r, alpha, dropout, targetModules}`."""
    if not isinstance(spec, dict):
        raise AdapterError(f"{path}: expected an object")
    extra = sorted(set(spec) - set(SPEC_KEYS))
    if extra:
        raise AdapterError(f"{path}: unknown key(s) {', '.join(extra)}")
    for key in SPEC_KEYS:
        if key not in spec:
            raise AdapterError(f"{path}.{key}: missing")
    if spec["type"] != "lora":
        raise AdapterError(f"{path}.type: expected 'lora', got {spec['type']!r}")
    r = spec["r"]
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise AdapterError(f"{path}.r: expected an integer >= 1, got {r!r}")
    alpha = spec["alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise AdapterError(f"{path}.alpha: expected a number > 0, got {alpha!r}")
    dropout = spec["dropout"]
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise AdapterError(f"{path}.dropout: expected a number in [0, 1), got {dropout!r}")
    targets = spec["targetModules"]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise AdapterError(f"{path}.targetModules: expected a non-empty list of module names, got {targets!r}")
    return {"type": "lora", "r": r, "alpha": float(alpha), "dropout": float(dropout), "targetModules": list(targets)}


def lora_config(spec: dict[str, Any], base_path: str) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=spec["r"], lora_alpha=spec["alpha"], lora_dropout=spec["dropout"],
                      target_modules=list(spec["targetModules"]), bias="none", task_type="CAUSAL_LM",
                      base_model_name_or_path=base_path)


def adapter_name(scenario: str) -> str:
    """PEFT's name for a scenario's adapter: a module-name-safe digest (a scenario may hold `.`)."""
    return "s" + hashlib.sha256(scenario.encode()).hexdigest()[:16]


def init_seed(seed: int, scenario: str) -> int:
    """Every rank initialises a scenario's adapter alike, and the same run alike each time."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{scenario}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


class BaseView:
    """The policy's module with every adapter off, no gradient: the frozen base, as the teacher."""

    def __init__(self, peft_model: Any) -> None:
        self._model = peft_model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad(), self._model.disable_adapter():
            return self._model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # config, get_output_embeddings, ...
        return getattr(self._model, name)


class Adapters:
    """The scenarios' adapters on one base: created on first use, one optimizer each."""

    def __init__(self, base: Any, spec: dict[str, Any], base_path: str, seed: int, make_optimizer: Any) -> None:
        from peft import get_peft_model

        self.spec = spec
        self.base_path = base_path
        self.seed = seed
        self.make_optimizer = make_optimizer
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.config = lora_config(spec, base_path)
        base.requires_grad_(False)
        # PEFT needs one adapter to wrap the model; this one is never trained or saved.
        with _seeded(0):
            self.model = get_peft_model(base, self.config, adapter_name="reef_unused")
        self.model.eval()  # see rank.py `_shard`: ℓθ is scored as the engine samples, with no dropout
        self.active: str | None = None

    def ensure(self, scenario: str) -> str:
        """The scenario's adapter, created (B = 0: the base's outputs) on its first step or load."""
        name = adapter_name(scenario)
        if name not in self.optimizers:
            with _seeded(init_seed(self.seed, scenario)):
                self.model.add_adapter(name, self.config)
            self.optimizers[name] = self.make_optimizer(list(self.params(name).values()))
        return name

    def activate(self, scenario: str) -> tuple[str, torch.optim.Optimizer]:
        name = self.ensure(scenario)
        self.model.set_adapter(name)
        for pname, p in self.model.named_parameters():
            p.requires_grad_(_owner(pname) == name)
        # LoRA dropout is a training-time regulariser: on in this adapter's dropout modules only
        # (the rest of the model stays in eval mode). It makes ℓθ a dropped-out estimate, so the
        # step's train_rollout_logprob_abs_diff is > 0 from the first step when dropout > 0.
        for module_name, module in self.model.named_modules():
            if module_name.endswith(f"lora_dropout.{name}"):
                module.train(self.spec["dropout"] > 0)
        self.active = name
        return name, self.optimizers[name]

    def params(self, name: str) -> dict[str, torch.nn.Parameter]:
        """The adapter's parameters by PEFT's checkpoint key (the adapter name left out), in order."""
        out = {}
        for pname, p in self.model.named_parameters():
            if _owner(pname) == name:
                out[_checkpoint_key(pname, name)] = p
        return out

    # --- checkpoints --------------------------------------------------------------------------

    def save(self, scenario: str, out: Path, meta: dict[str, Any]) -> float:
        """Write the scenario's adapter and optimizer as one directory at `out`, atomically (a
        hidden temporary directory renamed into place: `checkpoint.publish_dir`)."""
        from safetensors.torch import save_file

        started = time.monotonic()
        name = adapter_name(scenario)
        params = self.params(name)
        weights = {k: p.detach().to("cpu").contiguous().clone() for k, p in params.items()}
        opt_tensors, opt_meta = _optimizer_state(self.optimizers[name], params)

        def write(tmp: Path) -> None:
            save_file(weights, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
            save_file(opt_tensors, str(tmp / OPTIMIZER), metadata={"format": "pt"})
            self.config.save_pretrained(str(tmp))  # adapter_config.json
            (tmp / META).write_text(json.dumps({**meta, "scenario": scenario, "adapter": self.spec,
                                                "optimizer": opt_meta, "createdAt": int(time.time() * 1000)},
                                               indent=1, sort_keys=True))

        publish_dir(out, write)
        return time.monotonic() - started

    def read(self, path: Path) -> tuple[str, dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
        """(scenario, weights, optimizer tensors, meta) of an adapter checkpoint, checked against this
        trainer's spec and base; raises AdapterError and changes nothing."""
        from safetensors.torch import load_file

        try:
            meta = json.loads((path / META).read_text())
            config = json.loads((path / ADAPTER_CONFIG).read_text())
            weights = load_file(str(path / ADAPTER_WEIGHTS))
            opt = load_file(str(path / OPTIMIZER))
        except (OSError, ValueError) as e:
            raise AdapterError(f"not a readable adapter checkpoint: {e}") from e
        scenario = meta.get("scenario")
        if not isinstance(scenario, str):
            raise AdapterError(f"{META} names no scenario")
        theirs = (config.get("r"), float(config.get("lora_alpha", 0)), sorted(config.get("target_modules") or []))
        ours = (self.spec["r"], self.spec["alpha"], sorted(self.spec["targetModules"]))
        if theirs != ours:
            raise AdapterError(f"its adapter (r, alpha, target modules) {theirs} is not this trainer's {ours}")
        name = adapter_name(scenario)
        # Shapes against a scratch adapter when this scenario has none yet: nothing is added on failure.
        expected = {k: tuple(p.shape) for k, p in self.params(name).items()} if name in self.optimizers \
            else {k: tuple(p.shape) for k, p in self.params("reef_unused").items()}
        got = {k: tuple(v.shape) for k, v in weights.items()}
        if got != expected:
            missing, unexpected = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
            wrong = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])
            raise AdapterError(f"its tensors do not fit this base (missing {missing[:3]}, unexpected "
                               f"{unexpected[:3]}, other shape {wrong[:3]})")
        return scenario, weights, opt, meta

    def load(self, scenario: str, weights: dict[str, torch.Tensor], opt: dict[str, torch.Tensor],
             meta: dict[str, Any]) -> None:
        name = self.ensure(scenario)
        params = self.params(name)
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(weights[k].to(p.dtype))
        _load_optimizer_state(self.optimizers[name], params, opt, meta.get("optimizer") or {})


def _owner(param_name: str) -> str | None:
    """Which adapter a parameter belongs to (`...lora_A.<name>.weight`), or None for the base."""
    parts = param_name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
            return parts[i + 1]
    return None


def _checkpoint_key(param_name: str, name: str) -> str:
    """PEFT's file key: `base_model.model.<module>.lora_A.weight`, the adapter name dropped."""
    return param_name.replace(f".{name}.", ".")


def _optimizer_state(optimizer: torch.optim.Optimizer, params: dict[str, torch.nn.Parameter]
                     ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """AdamW's per-parameter state as named tensors, and its hyperparameters (one group)."""
    tensors: dict[str, torch.Tensor] = {}
    for key, p in params.items():
        for slot, value in optimizer.state.get(p, {}).items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"{key}::{slot}"] = t.detach().to("cpu").contiguous().clone()
    group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    return tensors, {"group": json.loads(json.dumps(group, default=str)), "params": list(params)}


def _load_optimizer_state(optimizer: torch.optim.Optimizer, params: dict[str, torch.nn.Parameter],
                          tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Put saved AdamW state back. The hyperparameters stay this trainer's (the spec may have a new lr)."""
    optimizer.state.clear()
    for key, p in params.items():
        slots = {name.split("::", 1)[1]: t for name, t in tensors.items() if name.split("::", 1)[0] == key}
        if slots:
            # `step` stays where torch keeps it (a CPU scalar tensor), the moments on the parameter's device.
            optimizer.state[p] = {s: (t.clone() if s == "step" else t.to(p.device, p.dtype).clone())
                                  for s, t in slots.items()}


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "AdapterError", "Adapters", "BaseView", "OPTIMIZER", "adapter_name",
           "check_spec", "lora_config"]
