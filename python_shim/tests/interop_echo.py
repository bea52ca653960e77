"""Cross-language check of the bridge messages, driven by `test/interop.int.test.ts`.

    python interop_echo.py echo     < msgpack [{schema, message}...]  > msgpack [{schema, message, error}...]
    python interop_echo.py samples  > msgpack [{schema, message}...]   (built here, checked by zod)

`schema` is `request` (validated by its `type`), `reply:<request type>` for an ok reply,
`error` for an error reply, or `codec` (no schema: raw values such as bytes, checked by equality).
Echo decodes, validates with `reef_shim.messages`, and re-encodes, so TypeScript can deep-equal
what comes back with what it sent.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

from reef_shim.errors import ShimError
from reef_shim.messages import ERROR_REPLY, pack, unpack, validate_reply, validate_request
from reef_shim.placement import plan_placement

NODE_A = "8f1c0e5d2b7a4c9e8d1f0a3b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f"
NODE_B = "0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d"


def validate(schema: str, message: Any) -> None:
    if schema == "request":
        validate_request(message)
    elif schema == "error":
        ERROR_REPLY.check(message, "error")
    elif schema.startswith("reply:"):
        validate_reply(schema[len("reply:"):], message)
    elif schema != "codec":
        raise ShimError("REEF_ERR_UNKNOWN_MESSAGE", f"no handler for message type {schema}")


def echo(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        try:
            validate(item["schema"], item["message"])
            error = None
        except ShimError as e:
            error = f"{e.code}: {e.message}"
        out.append({"schema": item["schema"], "message": item["message"], "error": error})
    return out


def _layout() -> dict[str, Any]:
    return {"trainer": {"gpus": 4}, "rollout": {"gpus": 1}, "prm": {"gpus": 1, "replicas": 1},
            "student": {"gpus": 1}, "cpusPerBundle": 1, "colocate": False}


def _group(name: str, role: str, strategy: str, n: int, state: str, node: str | None) -> dict[str, Any]:
    return {"name": name, "role": role, "strategy": strategy, "state": state,
            "bundles": [{"index": i, "resources": {"GPU": 1.0, "CPU": 0.5}, "nodeId": node} for i in range(n)]}


def _engine(name: str, pid: int | None, version: str | None) -> dict[str, Any]:
    return {"name": name, "role": "rollout", "kind": "hf", "url": "http://127.0.0.1:30001", "pid": pid,
            "healthy": pid is not None, "weightVersion": version, "modelPath": "/models/tiny-模型 ü",
            "group": "reef-rollout", "bundleIndex": 0}


def _trainer_spec() -> dict[str, Any]:
    options = {"wRl": 1.0, "wOpd": 1.0, "clipC": 1.0, "hintSelection": "sequence_optimal", "lr": 1e-5, "epsLow": 0.2,
               "epsHigh": 0.28, "weightDecay": 0.1, "betas": [0.9, 0.98], "topK": 4, "dtype": "fp32",
               "oldLogprobs": "trainer", "tisCap": 2.0, "klCoef": 0.0, "clipGrad": 1.0, "microBatchTokens": 2048,
               "gradCheckpointing": "off"}
    return {"modelPath": "/m/tiny", "ranks": 4, "backend": "fsdp2", "options": options, "engineLogprobs": "tempered",
            "checkpointDir": "/data/ckpt",
            "seed": 7, "group": "reef-trainer"}


def _task() -> dict[str, Any]:
    i32 = lambda v: struct.pack(f"<{len(v)}i", *v)  # noqa: E731
    f32 = lambda v: struct.pack(f"<{len(v)}f", *v)  # noqa: E731
    return {"taskId": "rec-1", "promptIds": i32([2039, 84]), "responseIds": i32([12]), "logprobs": f32([-0.5]),
            "topK": 2, "topkIds": i32([12, 7]), "topkLogprobs": f32([-0.5, -1.5]), "reward": 1,
            "teacherPromptIds": [i32([2039, 84, 5])], "sampling": {"temperature": 1, "topP": 1.0, "topK": -1},
            "weightVersion": "v0"}


def samples() -> list[dict[str, Any]]:
    """Realistic messages as the shim builds them: Python floats, None, unicode, big numbers."""
    resources = {"CPU": 8.0, "GPU": 7.0, "memory": 17179869184.0, "object_store_memory": 134217728.0,
                 "node:127.0.0.1": 1.0, "node:__internal_head__": 1.0}
    groups = [_group("reef-trainer", "trainer", "STRICT_PACK", 4, "CREATED", NODE_A),
              _group("reef-prm-0", "prm", "PACK", 1, "PENDING", None),
              _group("reef-student", "student", "PACK", 1, "REMOVED", None)]
    groups[1]["bundles"][0]["resources"] = {"GPU": 2.0, "CPU": 1.0}

    def ok(t: str, **f: Any) -> dict[str, Any]:
        return {"schema": f"reply:{t}", "message": {"type": "ok", "requestId": f"py-{t}-☃", **f}}

    def req(t: str, **f: Any) -> dict[str, Any]:
        return {"schema": "request", "message": {"type": t, "requestId": f"py-{t}", **f}}

    return [
        req("ping"),
        req("init-ray", address=None, numCpus=8, numGpus=7, objectStoreBytes=2**40),
        req("init-ray", address="10.0.0.5:6379", numCpus=None, numGpus=None, objectStoreBytes=None),
        req("plan-placement", layout={**_layout(), "student": None, "cpusPerBundle": 0.25, "colocate": False}),
        req("create-placement", layout=_layout(), timeoutS=60.5),
        req("remove-placement", names=None),
        req("remove-placement", names=["reef-prm-0", "reef-prm-1"]),
        req("start-engine", spec={"name": "rollout-0", "role": "rollout", "kind": "sglang", "modelPath": "/m/α",
                                  "group": "reef-rollout", "bundleIndex": 0, "host": "0.0.0.0", "port": 0,
                                  "extraArgs": ["--tp", "1", "", "--chat-template=✓"]}),
        req("stop-engine", name="rollout-0"),
        req("status"),
        req("shutdown"),
        req("trainer-start", spec=_trainer_spec()),
        req("trainer-step", batchId="support:openclawrl:1", tasks=[_task(), {**_task(), "teacherPromptIds": []}]),
        req("trainer-load", checkpointPath="/data/ckpt/v1"),
        req("trainer-push-weights", engineUrl="http://127.0.0.1:30001", weightVersion="v1"),
        req("trainer-stop"),
        ok("ping", pid=4194304, version="0.1.0", rayConnected=False),
        ok("init-ray", address="127.0.0.1:61234", startedHead=True, resources=resources),
        ok("plan-placement", plan=plan_placement(_layout(), 7, 7)),
        ok("create-placement", groups=groups),
        ok("remove-placement", removed=[]),
        ok("start-engine", engine=_engine("rollout-0", 2**31 - 1, "step-17")),
        ok("stop-engine", stopped=False),
        ok("status", ray={"address": "127.0.0.1:61234", "resources": resources,
                          "available": {**resources, "GPU": 0.0, "CPU": 4.5}},
           groups=groups, engines=[_engine("rollout-0", 77, None), _engine("rollout-1", None, None)]),
        ok("status", ray=None, groups=[], engines=[]),
        ok("shutdown"),
        ok("trainer-start", worldSize=2, device="cpu", pids=[4242, 4243], weightVersion="v0"),
        ok("trainer-step", batchId="support:openclawrl:1", weightVersion="v1", checkpointPath="/data/ckpt/v1",
           metrics={"loss": -0.125, "tokens": 72.0, "train_rollout_logprob_abs_diff": 2.5e-7, "grad_norm": 3}, stepMs=640.25,
           trained=False),
        ok("trainer-load", weightVersion="v1"),
        ok("trainer-push-weights", weightVersion="v1", backend="nccl", bytes=16_384_000_000, seconds=3.5),
        ok("trainer-stop"),
        {"schema": "error", "message": {"type": "error", "requestId": None, "code": "REEF_ERR_BAD_MESSAGE",
                                        "message": "malformed message: not msgpack", "retryable": False}},
        {"schema": "error", "message": ShimError("REEF_ERR_PLACEMENT", "cannot place reef-student bundle 0 "
                                                 "{GPU:1}: 6 of 6 logical GPUs already planned").to_reply("r-1")},
        {"schema": "codec", "message": {"bytes": bytes(range(256)), "i64": -(2**53) + 1, "u64": 2**53 - 1,
                                        "f": 0.1, "nested": [[1, [2, [None, "ü"]]], {}]}},
    ]


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "echo":
        sys.stdout.buffer.write(pack(echo(unpack(sys.stdin.buffer.read()))))
    elif mode == "samples":
        sys.stdout.buffer.write(pack(samples()))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
