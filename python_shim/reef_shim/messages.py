"""Python mirror of `bridge/messages.ts`: the bridge's requests and replies, and the codec.

Every message is a map with a kebab-case `type`; no key is optional (absent is None) and no
unknown key is accepted, so a schema drift between the two languages fails loudly on the first
message instead of silently dropping a field. `test/interop.int.test.ts` keeps both sides in step.
"""

from __future__ import annotations

import codecs
import math
from typing import Any, Mapping

import msgpack

from .errors import ShimError

# --- codec (docs/internals.md "Wire rules") ------------------------------------------------------

# A str holding a lone surrogate (a file name os.listdir decoded with surrogateescape, named in an
# exception's message) has no UTF-8 form: packb raised, and on the shim's worker thread that ended
# the thread, so every later slow request went unanswered while pings still were. Such a
# character goes out as U+FFFD, as TypeScript's codec writes one. (Bytes: the UTF-8 encoder takes
# only ASCII text from an error handler.)
codecs.register_error("reef_fffd", lambda e: ("\ufffd".encode() * (e.end - e.start), e.end))


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, unicode_errors="reef_fffd")


def unpack(data: bytes) -> Any:
    # strict_map_key=False: resource maps may carry any string; ints as keys never occur but must
    # not crash the decoder before validation can name the problem.
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


# --- a tiny schema language ------------------------------------------------------------------------


class Schema:
    def check(self, value: Any, path: str) -> Any:
        """Return the value (normalised, see Int) or raise ShimError(REEF_ERR_BAD_MESSAGE)."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


def _bad(path: str, expected: str, value: Any) -> ShimError:
    got = "null" if value is None else type(value).__name__
    return ShimError("REEF_ERR_BAD_MESSAGE", f"malformed message: {path}: expected {expected}, got {got}")


class Str(Schema):
    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, str):
            raise _bad(path, "a string", value)
        return value

    def describe(self) -> str:
        return "a string"


MAX_SAFE_INTEGER = 2**53 - 1


class Int(Schema):
    def check(self, value: Any, path: str) -> Any:
        # msgpackr writes a JS integer beyond 32 bits as a float64 (8 GiB arrives as 8589934592.0),
        # so an integral float within JavaScript's safe range is an integer; 1.5 is not.
        if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(path, "an integer", value)
        return value

    def describe(self) -> str:
        return "an integer"


class Num(Schema):
    def check(self, value: Any, path: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)
        ):
            raise _bad(path, "a finite number", value)
        return value

    def describe(self) -> str:
        return "a finite number"


class Bool(Schema):
    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, bool):
            raise _bad(path, "a boolean", value)
        return value

    def describe(self) -> str:
        return "a boolean"


class Lit(Schema):
    def __init__(self, *values: str) -> None:
        self.values = values

    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, str):
            raise _bad(path, self.describe(), value)
        if value not in self.values:
            raise ShimError("REEF_ERR_BAD_MESSAGE", f"malformed message: {path}: expected {self.describe()}, got {value!r}")
        return value

    def describe(self) -> str:
        return " | ".join(repr(v) for v in self.values)


class Nullable(Schema):
    def __init__(self, inner: Schema) -> None:
        self.inner = inner

    def check(self, value: Any, path: str) -> Any:
        return None if value is None else self.inner.check(value, path)

    def describe(self) -> str:
        return f"{self.inner.describe()} or null"


class MayBeAbsent(Nullable):
    """A key a sender may leave out (handlers read it with `.get`, None when absent): a field added
    to a message after senders that do not know it, which must keep working. Every other key must
    be present."""


class Bytes(Schema):
    """Raw bytes (msgpack bin): large numeric arrays travel this way, little-endian."""

    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, (bytes, bytearray)):
            raise _bad(path, "bytes", value)
        return bytes(value)

    def describe(self) -> str:
        return "bytes"


class ListOf(Schema):
    def __init__(self, item: Schema, length: int | None = None) -> None:
        self.item = item
        self.length = length  # a fixed-size tuple, e.g. AdamW betas

    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, list):
            raise _bad(path, "an array", value)
        if self.length is not None and len(value) != self.length:
            raise ShimError("REEF_ERR_BAD_MESSAGE",
                            f"malformed message: {path}: expected {self.length} items, got {len(value)}")
        for i, v in enumerate(value):
            value[i] = self.item.check(v, f"{path}[{i}]")
        return value

    def describe(self) -> str:
        return "an array"


class MapOf(Schema):
    """A map with string keys chosen by the sender (e.g. Ray resource names)."""

    def __init__(self, value: Schema) -> None:
        self.value = value

    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise _bad(path, "a map", value)
        for k, v in value.items():
            if not isinstance(k, str):
                raise _bad(f"{path} key", "a string", k)
            value[k] = self.value.check(v, f"{path}.{k}")
        return value

    def describe(self) -> str:
        return "a map"


class Obj(Schema):
    """A map with exactly these keys: each one present (None where absent), no others.

    Checking normalises in place (see Int), so handlers read plain Python ints.
    """

    def __init__(self, fields: Mapping[str, Schema]) -> None:
        self.fields = dict(fields)

    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise _bad(path, "a map", value)
        for key, schema in self.fields.items():
            if key not in value and isinstance(schema, MayBeAbsent):
                continue  # left absent, not added: a checked message must echo back as it came
            if key not in value:
                raise ShimError("REEF_ERR_BAD_MESSAGE", f"malformed message: {path}.{key}: missing")
            value[key] = schema.check(value[key], f"{path}.{key}")
        extra = sorted(str(k) for k in value if k not in self.fields)
        if extra:
            raise ShimError("REEF_ERR_BAD_MESSAGE", f"malformed message: {path}: unknown key(s) {', '.join(extra)}")
        return value

    def describe(self) -> str:
        return "a map"


# --- the bridge's shared shapes (docs/internals.md "Bridge protocol") ----------------------------

ROLES = ("trainer", "rollout", "prm", "student")
ENGINE_ROLES = ("rollout", "prm", "student")
ENGINE_KINDS = ("hf", "sglang")

LAYOUT = Obj({
    "trainer": Obj({"gpus": Int()}),
    "rollout": Obj({"gpus": Int()}),
    "prm": Obj({"gpus": Int(), "replicas": Int()}),
    "student": Nullable(Obj({"gpus": Int()})),
    "cpusPerBundle": Num(),
    "colocate": Bool(),
})
BUNDLE = Obj({"GPU": Num(), "CPU": Num()})
PLANNED_GROUP = Obj({
    "name": Str(),
    "role": Lit(*ROLES),
    "strategy": Lit("STRICT_PACK", "PACK"),
    "bundles": ListOf(BUNDLE),
})
PLAN = Obj({"groups": ListOf(PLANNED_GROUP), "totalGpus": Int(), "totalCpus": Num()})
GROUP_STATUS = Obj({
    "name": Str(),
    "role": Lit(*ROLES),
    "strategy": Lit("STRICT_PACK", "PACK"),
    "state": Lit("PENDING", "CREATED", "REMOVED"),
    "bundles": ListOf(Obj({"index": Int(), "resources": MapOf(Num()), "nodeId": Nullable(Str())})),
})
ENGINE_SPEC = Obj({
    "name": Str(),
    "role": Lit(*ENGINE_ROLES),
    "kind": Lit(*ENGINE_KINDS),
    "modelPath": Str(),
    "group": Str(),
    "bundleIndex": Int(),
    "host": Str(),
    "port": Int(),
    "extraArgs": ListOf(Str()),
})
ENGINE_INFO = Obj({
    "name": Str(),
    "role": Lit(*ENGINE_ROLES),
    "kind": Lit(*ENGINE_KINDS),
    "url": Str(),
    "pid": Nullable(Int()),
    "healthy": Bool(),
    "weightVersion": Nullable(Str()),
    "modelPath": Str(),
    "group": Str(),
    "bundleIndex": Int(),
})
RAY_STATUS = Obj({"address": Str(), "resources": MapOf(Num()), "available": MapOf(Num())})

# --- training (docs/training.md) -------------------------------------------------------------------

# `training.resolved` of the openclawrl recipe (recipes/openclawrl/options.ts), camelCase.
TRAINING_OPTIONS = Obj({
    "wRl": Num(), "wOpd": Num(), "clipC": Num(), "hintSelection": Lit("sequence_optimal", "token_optimal", "shortest"),
    "oldLogprobs": Lit("engine", "trainer"), "tisCap": Num(), "klCoef": Num(),
    "lr": Num(), "epsLow": Num(), "epsHigh": Num(), "weightDecay": Num(), "betas": ListOf(Num(), length=2),
    "clipGrad": Num(), "topK": Int(), "dtype": Lit("fp32", "bf16"), "microBatchTokens": Int(),
    "gradCheckpointing": Lit("off", "on"),
})
# `trainer-start.spec.adapter` (trainer/adapters.py): one LoRA adapter per scenario on a frozen base.
ADAPTER_SPEC = Obj({"type": Lit("lora"), "r": Int(), "alpha": Num(), "dropout": Num(), "targetModules": ListOf(Str())})
TRAINER_SPEC = Obj({
    "modelPath": Str(),
    "ranks": Int(),
    "backend": Lit("fsdp2", "tp"),
    "options": TRAINING_OPTIONS,
    # How the rollout engine reports logprobs (`engines.sampling.ENGINE_LOGPROBS`).
    "engineLogprobs": Lit("tempered", "raw"),
    "checkpointDir": Str(),
    "seed": Int(),
    "group": Lit("reef-trainer"),  # as bridge/messages.ts: the ranks need the STRICT_PACK trainer group
    # Absent or null: full-weight training. The TS bridge does not send it yet (issue 22).
    "adapter": MayBeAbsent(ADAPTER_SPEC),
})
TRAIN_TASK = Obj({
    "taskId": Str(),
    "promptIds": Bytes(),  # i32
    "responseIds": Bytes(),  # i32, the turn's assistant tokens: every one is in the loss
    "logprobs": Bytes(),  # f32 per response token, as the engine recorded it
    "topK": Int(),
    "topkIds": Bytes(),  # i32 [T*K]
    "topkLogprobs": Bytes(),  # f32 [T*K]
    "reward": Num(),
    "teacherPromptIds": ListOf(Bytes()),  # i32 per teacher candidate
    "sampling": Obj({"temperature": Num(), "topP": Num(), "topK": Int()}),
    "weightVersion": Nullable(Str()),
})

# request type -> fields besides `type` and `requestId`
REQUEST_FIELDS: dict[str, dict[str, Schema]] = {
    "ping": {},
    "init-ray": {
        "address": Nullable(Str()),
        "numCpus": Nullable(Int()),
        "numGpus": Nullable(Int()),
        "objectStoreBytes": Nullable(Int()),
    },
    "plan-placement": {"layout": LAYOUT},
    "create-placement": {"layout": LAYOUT, "timeoutS": Num()},
    "remove-placement": {"names": Nullable(ListOf(Str()))},
    "start-engine": {"spec": ENGINE_SPEC},
    "stop-engine": {"name": Str()},
    "status": {},
    "shutdown": {},
    "trainer-start": {"spec": TRAINER_SPEC},
    # `scenario`: whose adapter the batch trains; required with `spec.adapter`, else ignored.
    "trainer-step": {"batchId": Str(), "tasks": ListOf(TRAIN_TASK), "scenario": MayBeAbsent(Str())},
    "trainer-load": {"checkpointPath": Str()},
    "trainer-push-weights": {"engineUrl": Str(), "weightVersion": Str()},
    "trainer-stop": {},
}

# request type -> fields of its ok reply besides `type: 'ok'` and `requestId`
REPLY_FIELDS: dict[str, dict[str, Schema]] = {
    "ping": {"pid": Int(), "version": Str(), "rayConnected": Bool()},
    "init-ray": {"address": Str(), "startedHead": Bool(), "resources": MapOf(Num())},
    "plan-placement": {"plan": PLAN},
    "create-placement": {"groups": ListOf(GROUP_STATUS)},
    "remove-placement": {"removed": ListOf(Str())},
    "start-engine": {"engine": ENGINE_INFO},
    "stop-engine": {"stopped": Bool()},
    "status": {"ray": Nullable(RAY_STATUS), "groups": ListOf(GROUP_STATUS), "engines": ListOf(ENGINE_INFO)},
    "shutdown": {},
    "trainer-start": {"worldSize": Int(), "device": Str(), "pids": ListOf(Int()), "weightVersion": Str()},
    "trainer-step": {"batchId": Str(), "weightVersion": Str(), "checkpointPath": Str(), "metrics": MapOf(Num()),
                     "stepMs": Num(), "trained": Bool()},
    "trainer-load": {"weightVersion": Str()},
    "trainer-push-weights": {"weightVersion": Str(), "backend": Lit("gloo", "nccl", "ipc"), "bytes": Int(), "seconds": Num()},
    "trainer-stop": {},
}

_REQUESTS = {t: Obj({"type": Lit(t), "requestId": Str(), **f}) for t, f in REQUEST_FIELDS.items()}
_REPLIES = {t: Obj({"type": Lit("ok"), "requestId": Str(), **f}) for t, f in REPLY_FIELDS.items()}
ERROR_REPLY = Obj({
    "type": Lit("error"),
    "requestId": Nullable(Str()),
    "code": Str(),
    "message": Str(),
    "retryable": Bool(),
})


def request_id_of(msg: Any) -> str | None:
    """The request id, if one can be read, so even a malformed request gets a matched reply."""
    if isinstance(msg, dict) and isinstance(msg.get("requestId"), str):
        return msg["requestId"]
    return None


def validate_request(msg: Any) -> dict[str, Any]:
    """Check an incoming request; raise ShimError(BAD_MESSAGE | UNKNOWN_MESSAGE) naming the field."""
    if not isinstance(msg, dict):
        raise _bad("message", "a map", msg)
    kind = msg.get("type")
    if not isinstance(kind, str):
        raise _bad("message.type", "a string", kind)
    schema = _REQUESTS.get(kind)
    if schema is None:
        raise ShimError("REEF_ERR_UNKNOWN_MESSAGE", f"no handler for message type {kind}")
    schema.check(msg, kind)
    return msg


def validate_reply(request_type: str, msg: Any) -> dict[str, Any]:
    """Check an ok reply to `request_type` (or an error reply) before it leaves the shim."""
    if isinstance(msg, dict) and msg.get("type") == "error":
        ERROR_REPLY.check(msg, "error")
        return msg
    schema = _REPLIES.get(request_type)
    if schema is None:
        raise ShimError("REEF_ERR_UNKNOWN_MESSAGE", f"no handler for message type {request_type}")
    schema.check(msg, f"{request_type} reply")
    return msg


def ok_reply(request_type: str, request_id: str, **fields: Any) -> dict[str, Any]:
    """Build and check an ok reply, so the shim can never send a shape TypeScript would reject."""
    return validate_reply(request_type, {"type": "ok", "requestId": request_id, **fields})


def request(request_type: str, request_id: str, **fields: Any) -> dict[str, Any]:
    """Build and check a request (tests and tools speaking to a shim)."""
    return validate_request({"type": request_type, "requestId": request_id, **fields})
