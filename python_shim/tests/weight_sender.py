"""A trainer-side process for `test_weight_sync.py`: pushes a model directory's weights into an
engine over gloo with `WeightPusher`, or breaks the push in a chosen way.

    python weight_sender.py ENGINE_URL MODEL_DIR VERSION MODE TIMEOUT_S

MODE: `ok` (the whole push), `unknown-name` (one extra tensor the model lacks), `unknown-group`
(the update names a group the engine never joined, so it refuses without receiving), `die-midway`
(open the engine's update session, broadcast half the tensors, then the process dies, leaving the
session open). TIMEOUT_S is the pusher's timeout. Prints one
JSON line with the outcome.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from reef_shim.engine_process import pick_free_port
from reef_shim.trainer.weight_push import WeightPusher, WeightPushError, _Call, engine_server_info, post, push_dtype
from reef_shim.weight_group import broadcast, dtype_name


def main() -> int:
    url, model_dir, version, mode, timeout_s = sys.argv[1:6]
    state = load_file(str(Path(model_dir) / "model.safetensors"))
    # In the dtype the engine serves, as trainer rank 0 sends it (`rank.push_weights`).
    dtype = push_dtype(engine_server_info(url).get("dtype"), None)
    pusher = WeightPusher(url, "gloo", ("127.0.0.1", pick_free_port("127.0.0.1")), timeout_s=float(timeout_s),
                          dtype=dtype)
    pusher.connect()
    items = sorted(state.items())
    if mode == "unknown-name":
        items.append(("model.bogus.weight", torch.ones(3)))
    if mode == "unknown-group":
        pusher.group_name = "no-such-group"  # the engine joined the real one under another name
    if mode == "die-midway":
        body = {"names": [n for n, _ in items], "dtypes": [dtype_name(t.dtype) for _, t in items],
                "shapes": [list(t.shape) for _, t in items], "group_name": pusher.group_name, "flush_cache": True,
                "weight_version": version}
        post(f"{pusher.url}/begin_weight_update", {}, float(timeout_s))
        _Call(f"{pusher.url}/update_weights_from_distributed", body, float(timeout_s)).start()
        for _, t in items[: len(items) // 2]:
            broadcast(t.contiguous(), pusher.group).wait()
        sys.stdout.write(json.dumps({"died": True}) + "\n")
        sys.stdout.flush()
        os._exit(3)
    try:
        sent = pusher.push(items, version)
        outcome = {"ok": True, "bytes": sent}
    except WeightPushError as e:
        outcome = {"ok": False, "error": str(e)}
    pusher.close()
    print(json.dumps(outcome), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
