"""The Python mirror of the bridge schemas: what it accepts, what it rejects and how it says so."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from interop_echo import samples, validate
from reef_shim.errors import ShimError
from reef_shim.messages import REPLY_FIELDS, REQUEST_FIELDS, ok_reply, pack, unpack, validate_request


def test_every_request_and_reply_type_has_a_sample() -> None:
    found = samples()
    requests = {s["message"]["type"] for s in found if s["schema"] == "request"}
    replies = {s["schema"].split(":", 1)[1] for s in found if s["schema"].startswith("reply:")}
    assert requests == set(REQUEST_FIELDS)
    assert replies == set(REPLY_FIELDS)


@pytest.mark.parametrize("sample", samples(), ids=lambda s: f"{s['schema']}:{s['message'].get('type')}")
def test_samples_validate_and_survive_the_codec(sample: dict[str, Any]) -> None:
    again = unpack(pack(sample["message"]))
    assert again == sample["message"]
    validate(sample["schema"], again)


def ping() -> dict[str, Any]:
    return {"type": "ping", "requestId": "r1"}


def start_engine() -> dict[str, Any]:
    return next(copy.deepcopy(s["message"]) for s in samples() if s["message"].get("type") == "start-engine")


def reject(msg: Any) -> ShimError:
    with pytest.raises(ShimError) as err:
        validate_request(msg)
    return err.value


def test_unknown_type() -> None:
    err = reject({"type": "launch-missiles", "requestId": "r1"})
    assert err.code == "REEF_ERR_UNKNOWN_MESSAGE"
    assert "launch-missiles" in err.message


@pytest.mark.parametrize("msg,path", [
    ([1, 2], "message: expected a map"),
    ({"requestId": "r"}, "message.type: expected a string, got null"),
    ({"type": "ping"}, "ping.requestId: missing"),
    ({"type": "ping", "requestId": 7}, "ping.requestId: expected a string, got int"),
    ({"type": "ping", "requestId": "r", "extra": 1}, "ping: unknown key(s) extra"),
    ({"type": "stop-engine", "requestId": "r"}, "stop-engine.name: missing"),
    ({"type": "init-ray", "requestId": "r", "address": None, "numCpus": 1.5, "numGpus": None,
      "objectStoreBytes": None}, "init-ray.numCpus: expected an integer, got float"),
    ({"type": "init-ray", "requestId": "r", "address": None, "numCpus": True, "numGpus": None,
      "objectStoreBytes": None}, "init-ray.numCpus: expected an integer, got bool"),
    ({"type": "create-placement", "requestId": "r", "layout": None, "timeoutS": 1},
     "create-placement.layout: expected a map, got null"),
    ({"type": "create-placement", "requestId": "r", "timeoutS": float("nan"),
      "layout": {"trainer": {"gpus": 1}, "rollout": {"gpus": 1}, "prm": {"gpus": 1, "replicas": 0},
                 "student": None, "cpusPerBundle": 1, "colocate": False}}, "create-placement.timeoutS: expected a finite number"),
    ({"type": "remove-placement", "requestId": "r", "names": ["a", 3]},
     "remove-placement.names[1]: expected a string, got int"),
])
def test_malformed_requests_name_the_field(msg: Any, path: str) -> None:
    err = reject(msg)
    assert err.code == "REEF_ERR_BAD_MESSAGE"
    assert err.message == f"malformed message: {path}" or err.message.startswith(f"malformed message: {path}")
    assert err.retryable is False


def test_nested_engine_spec_fields() -> None:
    msg = start_engine()
    msg["spec"]["kind"] = "vllm"
    assert "start-engine.spec.kind: expected 'hf' | 'sglang', got 'vllm'" in reject(msg).message
    msg = start_engine()
    del msg["spec"]["extraArgs"]
    assert "start-engine.spec.extraArgs: missing" in reject(msg).message
    msg = start_engine()
    msg["spec"]["extraArgs"] = ["--tp", b"1"]
    assert "start-engine.spec.extraArgs[1]: expected a string, got bytes" in reject(msg).message


def test_trainer_spec_group_is_the_trainer_group_as_in_zod() -> None:
    # zod's TrainerSpec.group is the literal 'reef-trainer'; Python took any string, so a Python
    # client could place the ranks in an engine's one-bundle group.
    msg = next(copy.deepcopy(s["message"]) for s in samples() if s["message"].get("type") == "trainer-start")
    assert validate_request(copy.deepcopy(msg))["spec"]["group"] == "reef-trainer"
    msg["spec"]["group"] = "reef-rollout"
    assert "trainer-start.spec.group: expected 'reef-trainer', got 'reef-rollout'" in reject(msg).message


def test_ok_reply_refuses_a_shape_typescript_would_reject() -> None:
    assert ok_reply("ping", "r", pid=1, version="x", rayConnected=True)["type"] == "ok"
    with pytest.raises(ShimError) as err:
        ok_reply("ping", "r", pid=1, version="x")
    assert "ping reply.rayConnected: missing" in err.value.message
    assert validate_request(ping()) == ping()


def test_integral_floats_from_msgpackr_become_ints() -> None:
    # msgpackr encodes JavaScript integers beyond 32 bits as float64.
    msg = {"type": "init-ray", "requestId": "r", "address": None, "numCpus": 8.0, "numGpus": None,
           "objectStoreBytes": 8589934592.0}
    checked = validate_request(msg)
    assert checked["objectStoreBytes"] == 8589934592 and isinstance(checked["objectStoreBytes"], int)
    assert isinstance(checked["numCpus"], int)
    too_big = {**msg, "objectStoreBytes": float(2**60)}
    assert "init-ray.objectStoreBytes: expected an integer, got float" in reject(too_big).message


def test_a_lone_surrogate_is_packed_as_u_fffd_instead_of_failing_the_reply() -> None:
    name = b"ckpt-\xe9".decode("utf-8", "surrogateescape")  # as os.listdir gives a Latin-1 file name
    reply = ShimError("REEF_ERR_HANDLER", f"handler for trainer-load failed: cannot read {name}").to_reply("r-1")
    assert unpack(pack(reply))["message"] == "handler for trainer-load failed: cannot read ckpt-\ufffd"
    assert unpack(pack({"\ud83d": ["a\udce9\udce9b"]})) == {"\ufffd": ["a\ufffd\ufffdb"]}
