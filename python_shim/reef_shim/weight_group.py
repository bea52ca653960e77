"""The private process group that moves weights from trainer rank 0 into an engine.

Both ends of SGLang's `/init_weights_update_group` must build the group the same way, or the two
sides look for different keys in the rendezvous store and wait on each other until the timeout.
SGLang's engine joins with `rendezvous("tcp://master")` (rank 0 hosts the store), prefixes the
store with the group name and builds the group as a standalone world (no parent group) through
torch's group helper. Reef's sender (`trainer/weight_push.py`) and Reef's hf engine both use
`join_group` below, so the sender speaks to either engine, and the hf engine to either sender.

The helper is private torch API (`_new_process_group_helper`); it is what SGLang calls, and the
only way to make a group in a process whose default group is someone else's (the trainer's FSDP
group) or absent (the engine).
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import torch

from .dist_net import bind_listener, host_store

BACKENDS = ("gloo", "nccl")

# Dtype names as they travel in `/update_weights_from_distributed` (`str(torch.float32)` less
# the `torch.` prefix, which is what SGLang's senders write and its engine reads back).
_DTYPES = {name: getattr(torch, name) for name in ("float32", "float16", "bfloat16", "float64", "int64", "int32",
                                                   "int8", "uint8", "bool")}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype of a wire name; ValueError for anything else."""
    dtype = _DTYPES.get(name.removeprefix("torch."))
    if dtype is None:
        raise ValueError(f"unknown dtype {name!r} (expected one of {', '.join(_DTYPES)})")
    return dtype


def backend_options(backend: str, timeout: timedelta) -> Any:
    """NCCL options for the weight group: nonblocking communicator set-up; None for gloo.

    Both ends build the communicator at the group's first collective (no `device_id`, so no eager
    init). In NCCL's default blocking mode that call sits inside `ncclCommInitRank` until every
    rank has joined, before torch has registered the communicator, so a pusher that gives up on an
    engine that never joins cannot abort it: its broadcasting thread stays blocked until the
    process exits. Nonblocking (`config.blocking = 0`, which torch prefers to the
    TORCH_NCCL_USE_COMM_NONBLOCKING variable) registers the communicator at once and waits for it
    to be ready afterwards, where `_abort_process_group` reaches it. Only this group is nonblocking;
    the trainer's own groups are left as torch makes them."""
    if backend != "nccl":
        return None
    from torch.distributed import ProcessGroupNCCL

    opts = ProcessGroupNCCL.Options()
    opts.config.blocking = 0
    opts._timeout = timeout  # torch overrides it with the timeout argument, and warns when they differ
    return opts


def join_group(master_address: str, master_port: int, rank: int, world_size: int, group_name: str, backend: str,
               timeout_s: float, listener: socket.socket | None = None) -> Any:
    """Join (rank 0: host) the weight group; blocks until all `world_size` ranks have joined.

    Rank 0 hosts the store on `listener` (`dist_net.bind_listener`, bound to `master_address`:
    `master_port`), or binds one itself: torch's own `tcp://` rendezvous would listen on every
    interface. The other ranks connect as SGLang's engine does, with `rendezvous("tcp://...")`."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        store = host_store(listener or bind_listener(master_address, master_port), world_size, timeout)
    else:
        store, rank, world_size = next(rendezvous(f"tcp://{master_address}:{master_port}", rank, world_size,
                                                  timeout=timeout))
    store.set_timeout(timeout)
    group, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), PrefixStore(group_name, store),
                                         group_name=group_name, timeout=timeout,
                                         backend_options=backend_options(backend, timeout))
    # Collectives translate ranks through this table; a standalone world maps each rank to itself.
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def leave_group(group: Any) -> None:
    import torch.distributed as dist

    dist.destroy_process_group(group)


def broadcast(tensor: torch.Tensor, group: Any) -> Any:
    """Broadcast from rank 0 of `group` (send on rank 0, receive elsewhere); returns the work."""
    import torch.distributed as dist

    return dist.broadcast(tensor, group=group, group_src=0, async_op=True)
