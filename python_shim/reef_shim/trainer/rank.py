"""One trainer rank: a Ray actor in one bundle of `reef-trainer`, one torch.distributed process.

Each rank holds the policy sharded with FSDP2 (`fully_shard` per decoder layer, then the root) and
a full, frozen copy of the base model as the teacher (inference only, so it needs no collective and
ranks may run different numbers of teacher forwards). Every rank runs exactly one policy forward
and backward per step, also with no task (a one-token dummy whose loss is multiplied by 0), so the
FSDP all-gathers and reduce-scatters of all ranks pair up.

With an adapter spec (`options["adapter"]`, adapters.py) a rank instead holds the base once, frozen
and unsharded, with one LoRA adapter per scenario in it; the teacher is that base with the adapters
off. The adapters are small, so each rank keeps them whole and their gradients are averaged with
one all-reduce per step (what FSDP's reduce-scatter does for the full weights).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

_REPO = str(Path(__file__).resolve().parents[3])
if _REPO not in sys.path:
    sys.path.append(_REPO)  # recipes/ imports as a top-level package from the repo root

from recipes.openclawrl.objective import objective_from_options, openclawrl_loss  # noqa: E402

from ..dist_net import LOOPBACK_HOST, bind_listener, confine_to_loopback, host_store  # noqa: E402
from .checkpoint import save_checkpoint  # noqa: E402
from .loss import add_sums, empty_sums, local_loss  # noqa: E402
from .scoring import micro_batches, objective_batch  # noqa: E402
from .tasks import TrainTask  # noqa: E402

PG_TIMEOUT = timedelta(minutes=10)  # a collective stuck longer than this raises instead of hanging
DEVICE_ENV = "REEF_TRAINER_DEVICE"
PEER_FAILED = "another rank could not use it"  # trainer-load's answer on a rank that could


def pick_device(want: str) -> torch.device:
    """`cpu`, `cuda`, or (empty / `auto`) CUDA when this process sees a GPU. Ray gives each rank
    the GPU of its bundle through CUDA_VISIBLE_DEVICES, so the rank's GPU is always its `cuda:0`."""
    if want in ("", "auto"):
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if want == "cpu":
        return torch.device("cpu")
    if want == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"{DEVICE_ENV}=cuda, but this rank sees no CUDA device "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        return torch.device("cuda", 0)
    raise ValueError(f"{DEVICE_ENV}: expected auto, cpu or cuda, got {want!r}")


class TrainerRank:
    def __init__(self, rank: int, world: int, seed: int, threads: int, crash_hook: str | None,
                 loopback: bool = False) -> None:
        """`loopback`: every rank, and every engine this group pushes into, runs on this node
        (`RayDriver.single_node`), so the groups listen on 127.0.0.1 alone (`dist_net`)."""
        self.rank, self.world = rank, world
        self.crash_hook = crash_hook
        self.loopback = loopback
        if loopback:
            confine_to_loopback()  # here, before any NCCL call: NCCL reads its interface only once
        self._listener: socket.socket | None = None  # rank 0: the store's socket, from rendezvous to setup
        torch.manual_seed(seed)
        torch.set_num_threads(max(1, threads))
        self.device = pick_device(os.environ.get(DEVICE_ENV, ""))
        self.policy: Any = None
        self.teacher: Any = None
        self.optimizer: Any = None
        self.cfg: Any = None
        self.options: dict[str, Any] = {}
        self.bf16 = False
        self.tied = False  # lm_head shares the embedding's storage: gathered, saved and pushed once
        self._host: dict[str, torch.Tensor] = {}  # rank 0 on a GPU: pinned copies of the full weights
        self.seed = seed
        self.adapters: Any = None  # adapters.Adapters when the spec has an adapter

    def device_name(self) -> str:
        return str(self.device)

    def group_host(self) -> str:
        """The address this rank's groups are reached at: loopback, or the node's address."""
        if self.loopback:
            return LOOPBACK_HOST
        import ray

        return ray.util.get_node_ip_address()

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's address and a port on it for the group's rendezvous store, bound here and held
        until `setup` hosts the store on it."""
        if self._listener is not None:
            self._listener.close()
        self._listener = bind_listener(self.group_host())
        return self._listener.getsockname()[0], int(self._listener.getsockname()[1])

    def setup(self, master: tuple[str, int], model_path: str, options: dict[str, Any]) -> dict[str, Any]:
        import torch.distributed as dist

        backend = "nccl" if self.device.type == "cuda" else "gloo"
        # Not init_method="tcp://…": torch's own store would listen on every interface (`dist_net`).
        if self.rank == 0:
            listener, self._listener = self._listener, None
            if listener is None or tuple(listener.getsockname()[:2]) != tuple(master):
                if listener is not None:
                    listener.close()
                listener = bind_listener(*master)
            store = host_store(listener, self.world, PG_TIMEOUT)
        else:
            store = dist.TCPStore(master[0], master[1], self.world, False, timeout=PG_TIMEOUT)
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world, timeout=PG_TIMEOUT)
        self.model_path = Path(model_path)
        self.options = options
        # fp32: ℓθ matches an fp32 engine's recorded logprobs to 1e-3 (docs/training.md). bf16: the
        # teacher is held in bf16 and the policy computes in bf16 over fp32 master weights, which
        # the optimizer updates and checkpoints keep; gradients are reduced in fp32.
        self.bf16 = options.get("dtype") == "bf16"
        if options.get("adapter") is not None:
            self._setup_adapters(model_path, options)
        else:
            self.teacher = self._load(model_path, torch.bfloat16 if self.bf16 else torch.float32).eval().requires_grad_(False)
            self.policy = self._shard(self._load(model_path, torch.float32))
            if options.get("gradCheckpointing") == "on":
                checkpoint_layers(self.policy)
            self._new_optimizer()
        self.tied = bool(getattr(self.teacher.config, "tie_word_embeddings", False))
        self.cfg = objective_from_options(options)
        return {"pid": os.getpid(), "device": str(self.device), "backend": backend,
                "vocab": int(self.teacher.config.vocab_size),
                "maxLen": int(getattr(self.teacher.config, "max_position_embeddings", 1 << 30)),
                "tied": self.tied}

    def _setup_adapters(self, model_path: str, options: dict[str, Any]) -> None:
        """One frozen base (bf16 with `dtype: bf16`, as the full-weight teacher; the adapters are
        fp32 either way) shared by the policy (with the active adapter) and the teacher (without)."""
        from .adapters import Adapters, BaseView, check_spec

        spec = check_spec(options["adapter"])
        o = options

        def make_optimizer(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
            return torch.optim.AdamW(params, lr=o["lr"], weight_decay=o["weightDecay"], betas=(o["betas"][0], o["betas"][1]))

        base = self._load(model_path, torch.bfloat16 if self.bf16 else torch.float32)
        self.adapters = Adapters(base, spec, model_path, self.seed, make_optimizer)
        self.policy = self.adapters.model
        if options.get("gradCheckpointing") == "on":
            checkpoint_layers(self.policy)
        self.teacher = BaseView(self.policy)
        self.optimizer = None  # set per step: the scenario's adapter's own

    def _load(self, path: str, dtype: torch.dtype) -> Any:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device)

    def _shard(self, model: Any) -> Any:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(self.device.type, (self.world,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.bf16 \
            else MixedPrecisionPolicy()
        layer_types = set(getattr(model, "_no_split_modules", None) or [])
        for module in model.modules():
            if type(module).__name__ in layer_types:
                fully_shard(module, mesh=mesh, mp_policy=mp)
        # The rest: embeddings, norm, lm_head (tied weights stay one parameter).
        fully_shard(model, mesh=mesh, mp_policy=mp)
        # Eval mode, though it trains: ℓθ must be the distribution the engine sampled from (an eval
        # forward), and a model with dropout in its config would otherwise score ℓθ ≠ ℓold before
        # any update. Autograd does not depend on the mode.
        return model.eval()

    def _new_optimizer(self) -> None:
        o = self.options
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=o["lr"], weight_decay=o["weightDecay"],
                                           betas=(o["betas"][0], o["betas"][1]))

    def _maybe_crash(self, batch_id: str) -> None:
        # Test hook, REEF_TRAINER_TEST_CRASH='{"rank": 1, "batchId": "...", "marker": "/tmp/x"}':
        # that rank dies once, mid-step (the marker file makes the retry survive); with
        # `"hangS": n` it hangs that long instead, its peers waiting in the next collective; with
        # `"raise": true` it raises, as a rank out of memory on the batch does.
        if not self.crash_hook:
            return
        hook = json.loads(self.crash_hook)
        rank, batch, marker = hook["rank"], hook["batchId"], hook["marker"]
        if int(rank) == self.rank and batch == batch_id and not os.path.exists(marker):
            Path(marker).write_text(str(os.getpid()))
            if hook.get("hangS"):
                time.sleep(float(hook["hangS"]))
                return
            if hook.get("raise"):
                raise RuntimeError(f"out of memory (test hook) on rank {self.rank}")
            os._exit(17)

    def step(self, batch_id: str, tasks: list[TrainTask], totals: dict[str, float], out_dir: str | None,
             meta: dict[str, Any], scenario: str | None = None) -> dict[str, Any]:
        """Forward, loss and backward per micro-batch (the gradients accumulate), the global norm
        clipped, AdamW; then every rank helps gather the full weights and rank 0 saves them to
        `out_dir`. Returns this rank's metric sums (and, on rank 0, save timing). With adapters,
        `scenario` names the adapter the step trains (its own optimizer) and rank 0 saves that
        adapter alone."""
        started = time.monotonic()
        if self.adapters is not None:
            if scenario is None:
                raise ValueError("a step with adapters needs the batch's scenario")
            _, self.optimizer = self.adapters.activate(scenario)
        self.optimizer.zero_grad(set_to_none=True)
        plan = micro_batches(tasks, int(self.options.get("microBatchTokens", 0)))
        # Every rank runs as many forward/backward passes as the rank with the most micro-batches,
        # so FSDP's collectives pair up; the extra ones are a one-token dummy whose loss is × 0.
        rounds = max(1, self._max_over_ranks(len(plan)))
        convention, kl = self.options["engineLogprobs"], self.cfg.kl_coef > 0
        parts: list[dict[str, float]] = []
        for i in range(rounds):
            if i < len(plan):
                batch = objective_batch(self.policy, self.teacher, [tasks[j] for j in plan[i]], self.device,
                                        convention, kl)
                loss, sums = local_loss(batch, self.cfg, totals, self.world, openclawrl_loss)
                del batch
            else:
                dummy = torch.zeros(1, 1, dtype=torch.long, device=self.device)
                loss, sums = self.policy(input_ids=dummy, use_cache=False).logits.sum() * 0.0, empty_sums()
            parts.append(sums)
            if i == 0:
                self._maybe_crash(batch_id)
            # All ranks agree on finiteness before anyone steps, so a NaN batch fails cleanly everywhere.
            if self._any_rank(not bool(torch.isfinite(loss))):
                self.optimizer.zero_grad(set_to_none=True)
                return {"error": "non-finite loss: the batch was not applied", "sums": add_sums(parts)}
            loss.backward()
            del loss
        if self.adapters is not None:
            self._average_adapter_grads()
        sums = add_sums(parts)
        sums["micro_batches"] = float(len(plan))
        # A finite loss can still give a non-finite gradient (an overflow in backward); AdamW would
        # write it into every weight it touches. All ranks agree before anyone steps, as above.
        grad_norm, grads_finite = self._grad_norm()
        if not grads_finite:
            self.optimizer.zero_grad(set_to_none=True)
            return {"error": "non-finite gradient: the batch was not applied", "sums": sums}
        sums["grad_norm"] = grad_norm
        sums["grad_clipped"] = float(self._clip_grads(grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        forward_backward_s = time.monotonic() - started
        if self.adapters is not None:
            # Every rank holds the adapter whole: rank 0 writes it (and its optimizer) alone.
            def save(out: Path) -> float:
                return self.adapters.save(scenario or "", out, meta)
        else:
            state = self._full_state()

            def save(out: Path) -> float:
                return save_checkpoint(state, self.model_path, out, meta)
        save_s = 0.0
        if self.rank == 0 and out_dir is not None:
            from safetensors import SafetensorError  # what save_file raises for an I/O error

            try:
                save_s = save(Path(out_dir))
            except (OSError, SafetensorError) as e:
                # Raised, it read as the batch's fault (REEF_ERR_TRAINER), and a full disk had every
                # batch dead-lettered in turn. The weights have taken the step: the group must not
                # train on (`applied`), and the retry starts a fresh one from the last release.
                return {"error": f"the checkpoint {out_dir} could not be saved: {type(e).__name__}: {e}",
                        "applied": True, "sums": sums}
        return {"error": None, "sums": sums, "train_s": forward_backward_s, "save_s": save_s}

    def _trainable(self) -> list[torch.nn.Parameter]:
        """The parameters a step updates: the active adapter's, or the sharded policy's."""
        if self.adapters is not None:
            return [p for group in self.optimizer.param_groups for p in group["params"]]
        return list(self.policy.parameters())

    def _average_adapter_grads(self) -> None:
        """Each rank's gradient of the whole adapter averaged over the ranks, in one all-reduce (a
        parameter no task reached has a zero gradient, not none, so every rank sends as many)."""
        import torch.distributed as dist

        params = self._trainable()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.world == 1:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= self.world
        at = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[at:at + n].view_as(p.grad))
            at += n

    def _max_over_ranks(self, n: int) -> int:
        """The largest `n` of any rank (one all-reduce)."""
        import torch.distributed as dist

        t = torch.tensor([float(n)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _clip_grads(self, norm: float) -> bool:
        """Scale every rank's shard of the gradient by min(1, clipGrad / ‖g‖), ‖g‖ the global norm
        (`_grad_norm`), as torch's clip_grad_norm_ does (its 1e-6 too); clipGrad 0 is off. Every
        rank has the same norm, so the shards are scaled alike. Returns whether it clipped."""
        limit = float(self.options.get("clipGrad", 0.0))
        if limit <= 0 or norm <= limit:
            return False
        scale = limit / (norm + 1e-6)
        for p in self._trainable():
            if p.grad is not None:
                p.grad.mul_(scale)
        return True

    def _any_rank(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank (one all-reduce, so every rank takes the same branch)."""
        import torch.distributed as dist

        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t)
        return t.item() > 0

    def _grad_norm(self) -> tuple[float, bool]:
        """The gradient's global norm, and whether every rank's shard of it is finite (one all-reduce)."""
        import torch.distributed as dist

        # FSDP2 grads are DTensors sharded on dim 0: the squares of the local shards add up to the
        # total, and a non-finite value may sit in any one rank's shard.
        acc = torch.zeros(2, device=self.device)  # [sum of squares, non-finite entries]
        for p in self._trainable():
            if p.grad is not None:
                g = (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).float()
                acc[0] += g.pow(2).sum()
                acc[1] += (~torch.isfinite(g)).sum()
        if self.adapters is not None:
            return float(acc[0].sqrt()), bool(acc[1].item() == 0)  # averaged already: every rank holds it whole
        dist.all_reduce(acc)
        return float(acc[0].sqrt()), bool(acc[1].item() == 0)

    def _full_state(self) -> dict[str, torch.Tensor]:
        """The policy's full weights as CPU tensors on rank 0 (empty elsewhere), a tied lm_head left
        out: checkpoints store it once, as the embedding, and engines update it through that. A
        collective: every rank takes part, gathering one parameter at a time in the same order, so
        one full tensor at most is on a rank's device at once.

        On a GPU, rank 0 copies each one asynchronously into a pinned buffer it keeps across steps
        and overwrites at the next gather, once the step's checkpoint write or push has used it.
        torch's `get_model_state_dict(cpu_offload=True)`, used before, copied into fresh pageable
        memory one blocking copy at a time: ~1.2 GB/s on an H200, 14 s of every step for a 4B model
        against 0.3 s this way (docs/benchmarks.md). On the CPU rank 0 keeps plain copies, which
        runs the same loop on the gloo ranks of the CI tests."""
        from torch.distributed.tensor import DTensor

        pinned = self.device.type == "cuda"
        out: dict[str, torch.Tensor] = {}
        for name, t in self.policy.state_dict().items():
            if self.tied and name == "lm_head.weight":
                continue
            full = (t.full_tensor() if isinstance(t, DTensor) else t).detach()
            if self.rank != 0:
                continue
            if not pinned:
                out[name] = full.clone()  # a one-rank gather may hand back the parameter's own storage
                continue
            host = self._host.get(name)
            if host is None or host.shape != full.shape or host.dtype != full.dtype:
                host = self._host[name] = torch.empty(full.shape, dtype=full.dtype, pin_memory=True)
            host.copy_(full, non_blocking=True)
            out[name] = host
        if pinned:
            torch.cuda.synchronize(self.device)
        return out

    def push_weights(self, engine_url: str, weight_version: str, timeout_s: float,
                     colocated: bool = False, engine_versions: dict[str, Any] | None = None) -> dict[str, Any]:
        """Every rank helps gather the full weights; rank 0 pushes them into the engine
        (`weight_push.py`): over a weight group, or, colocated on one device (where NCCL refuses a
        group), in shared memory by `update_weights_from_tensor`. A failed push is reported, not
        raised: it breaks no rank."""
        started = time.monotonic()
        if self.adapters is not None:
            return {"error": "the trainer trains LoRA adapters: an engine loads a step's checkpointPath with "
                    "/load_lora_adapter, and the base weights never change"}
        state = self._full_state()
        if self.rank != 0:
            return {"error": None}
        from .weight_push import TensorPusher, WeightPusher, engine_server_info, push_backend, push_dtype

        from ..stack_versions import mismatch, stack_versions

        info = engine_server_info(engine_url)
        dtype = push_dtype(info.get("dtype"), self._checkpoint_config())
        backend = "ipc" if colocated else push_backend(self.device.type, info.get("device"))
        # Before any group forms: ends that differ fail deep in a collective, or hang there.
        refused = mismatch(stack_versions(), engine_versions, "nccl" if backend in ("nccl", "ipc") else backend)
        if refused is not None:
            return {"error": f"WeightPushError: {refused}", "backend": backend}
        if colocated:
            try:
                sent = TensorPusher(engine_url, self.device, timeout_s=timeout_s, dtype=dtype).push(state.items(),
                                                                                                   weight_version)
            except Exception as e:  # WeightPushError, or what torch/HTTP raised on the way
                return {"error": f"{type(e).__name__}: {e}", "backend": backend}
            return {"error": None, "backend": backend, "bytes": sent, "seconds": time.monotonic() - started}
        # Port 0: the pusher binds one when it connects, and only then tells the engine. A loopback
        # host is right because the driver pushes that way only into engines on this node
        # (TrainerGroup.push_weights).
        pusher = WeightPusher(engine_url, backend, (self.group_host(), 0), int(info.get("tp_size") or 1),
                              timeout_s=timeout_s, dtype=dtype)
        try:
            pusher.connect()
            sent = pusher.push(state.items(), weight_version)
        except Exception as e:  # WeightPushError, or what torch/HTTP raised on the way
            return {"error": f"{type(e).__name__}: {e}", "backend": backend}
        finally:
            pusher.close()
        return {"error": None, "backend": backend, "bytes": sent, "seconds": time.monotonic() - started}

    def _checkpoint_config(self) -> Any:
        """The served checkpoint's own config: loading a model sets its config's dtype to the one it
        was loaded in, and SGLang's `--dtype auto` reads the file's."""
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(self.model_path)

    def load(self, path: str) -> str | None:
        """Policy weights from a checkpoint directory; the optimizer starts afresh (docs/training.md).
        Returns why the checkpoint cannot be used (no rank changed a weight then), or None."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        from ..engines.weights import WeightError, load_checked_state_dict

        if self.adapters is not None:
            return self._load_adapter(Path(path))
        # Checked against the unsharded teacher (same architecture) so a wrong checkpoint fails
        # before any rank has changed a weight. Reported, not raised: the driver takes a raise for
        # a broken rank and kills the group, which a bad file is not.
        why = None
        try:
            state = load_checked_state_dict(Path(path), self.teacher.config, self.teacher)
        except WeightError as e:
            why = str(e)
        # All ranks agree before any loads: set_model_state_dict scatters each tensor from rank 0,
        # so a rank that skipped it would leave the others waiting in that scatter.
        if self._any_rank(why is not None):
            return why or PEER_FAILED
        if self.tied:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        set_model_state_dict(self.policy, state, options=StateDictOptions(full_state_dict=True))
        self._new_optimizer()
        return None

    def _load_adapter(self, path: Path) -> str | None:
        """A scenario's adapter and its optimizer state from its checkpoint: every other adapter,
        and this one on a refusal, is left as it was. Returns why it cannot be used, or None."""
        from .adapters import AdapterError

        why, read = None, None
        try:
            read = self.adapters.read(path)
        except AdapterError as e:
            why = str(e)
        if self._any_rank(why is not None):
            return why or PEER_FAILED
        assert read is not None
        self.adapters.load(*read)
        return None

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def checkpoint_layers(model: Any) -> None:
    """Activation checkpointing of every decoder layer (non-reentrant): a layer keeps only its input
    for backward and runs its forward again there, which trades one more forward of each layer
    for most of the activation memory. transformers checkpoints a layer only when the layer is in
    training mode; the policy runs in eval mode (no dropout: rank.py `_shard`), so each decoder
    layer's own flag is set and its submodules (attention, MLP, their dropout) stay in eval mode.
    The layers' forwards are transformers' own, wrapped inside the module call, so FSDP2's hooks
    stay outside the recomputation."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    # transformers 5.23 renamed the switch; SGLang 0.5.23's pin (5.19, the GPU venv) has the old name.
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module.training = True


__all__ = ["TrainerRank", "checkpoint_layers"]
