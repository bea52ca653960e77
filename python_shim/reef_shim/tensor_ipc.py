"""Named tensors handed to another process on the same machine without copying them over a socket:
the payload of SGLang's `/update_weights_from_tensor`, which a colocated trainer uses to move its
weights into an engine on its own GPU (NCCL refuses two ranks on one device).

The payload is what SGLang's `MultiprocessingSerializer` writes (0.5.23 `srt/utils/common.py:3060-3099`):
torch's `ForkingPickler` over a list of `(name, tensor)`, base64 for JSON. A CUDA tensor pickles as
a CUDA IPC handle, so the receiver maps the sender's memory; a CPU tensor is moved into shared
memory and pickles as that segment's name (torch's `file_system` strategy: the default
`file_descriptor` one passes descriptors over a socket between related processes only). The sender
must keep the tensors alive until the receiver has copied them.

Receiving is unpickling, and an unrestricted unpickler runs any code its input names: the receiver
resolves only the exact globals torch's reductions write (as SGLang's `SafeUnpickler` does, with its
own list), so a local process that can reach an engine's admin route cannot run code through it.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
from typing import Any

import torch

_TYPES = {"Tensor", "Size", "dtype", "device"} | {name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}
_REDUCTIONS = {"rebuild_tensor", "rebuild_typed_storage", "rebuild_storage_filename", "rebuild_cuda_tensor",
               "rebuild_typed_storage_child", "rebuild_nested_tensor"}
ALLOWED = ({("torch", n) for n in _TYPES} | {("torch.multiprocessing.reductions", n) for n in _REDUCTIONS}
           | {("torch.storage", "UntypedStorage"), ("torch.storage", "TypedStorage"),
              ("torch._utils", "_rebuild_tensor_v2"), ("builtins", "list"), ("builtins", "tuple"),
              ("builtins", "str"), ("builtins", "int"), ("collections", "OrderedDict")})


class PayloadError(ValueError):
    pass


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise PayloadError(f"the payload names {module}.{name}, which is not a tensor reduction")
        return super().find_class(module, name)


def serialize(named: list[tuple[str, torch.Tensor]]) -> str:
    """The base64 payload of `named`; the caller keeps the tensors alive until it is consumed."""
    import torch.multiprocessing as tmp
    from multiprocessing.reduction import ForkingPickler

    before = tmp.get_sharing_strategy()
    buf = io.BytesIO()
    try:
        # Read at pickling time, so set for this dump only: the process's other users keep theirs.
        tmp.set_sharing_strategy("file_system")
        ForkingPickler(buf).dump([(name, t) for name, t in named])
    finally:
        tmp.set_sharing_strategy(before)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def deserialize(payload: str) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of a payload; PayloadError for anything that is not one."""
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise PayloadError(f"not base64: {e}") from e
    try:
        named = _Restricted(io.BytesIO(raw)).load()
    except PayloadError:
        raise
    except Exception as e:  # a truncated pickle, a segment that is gone, an IPC handle of another GPU
        raise PayloadError(f"cannot rebuild the tensors: {type(e).__name__}: {e}") from e
    if not isinstance(named, list) or not all(
            isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], torch.Tensor)
            for item in named):
        raise PayloadError("expected a list of (name, tensor) pairs")
    return named
