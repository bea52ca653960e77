"""The engines' admin key: what a weight update, a pause or a flush must carry.

`reef up` writes a random key to `<data_dir>/run/engine-admin.key` (0600) and names the file in
REEF_ENGINE_ADMIN_KEY_FILE, which the shim, its Ray workers (and so the engines and the trainer's
weight pusher) and the actors inherit. Anything on the machine can reach an engine's port, and its
admin routes load any checkpoint path as the served weights, stop generation, or hand the GPU
memory back: with the key set, those answer 401 to a request without `Authorization: Bearer KEY`.
Generation, health and info stay open, as in SGLang. Outside a stack (no variable) nothing is asked.
"""

from __future__ import annotations

import hmac
import json
import os
from typing import Mapping

ADMIN_KEY_ENV = "REEF_ENGINE_ADMIN_KEY_FILE"


def admin_key(env: Mapping[str, str] = os.environ) -> str | None:
    path = env.get(ADMIN_KEY_ENV, "")
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        key = f.read().strip()
    if not key:
        raise ValueError(f"{ADMIN_KEY_ENV}: {path} is empty")
    return key


def admin_headers(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    key = admin_key(env)
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def authorized(header: str | None, key: str | None) -> bool:
    if key is None:
        return True
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].encode(), key.encode())


# SGLang 0.5.23 flags that would undo its admin key: another key, a second config file (it takes
# one), or more than one tokenizer worker, where its auth middleware is not installed at all
# (srt/entrypoints/http_server.py:2880-2898). Any prefix counts: its argparse takes abbreviations,
# and one that names several flags fails there anyway.
_SGLANG_KEY_FLAGS = ("--api-key", "--admin-api-key", "--config", "--tokenizer-worker-num")


def sglang_admin_args(extra_args: list[str], key: str, config_dir: str, name: str, port: int, role: str) -> list[str]:
    """`--config FILE` with the admin key, the file 0600 in `config_dir`: the key stays off argv."""
    for i, arg in enumerate(extra_args):
        written = arg.split("=", 1)[0]
        if len(written) > 2 and any(flag.startswith(written) for flag in _SGLANG_KEY_FLAGS):
            raise ValueError(f"cluster.{role}.extra_args[{i}]: {arg} is not allowed: Reef gives SGLang its admin key "
                             "in a config file of its own, with one tokenizer worker (the only mode where SGLang "
                             "checks the key)")
    os.makedirs(config_dir, mode=0o700, exist_ok=True)
    path = os.path.join(config_dir, f"{name}-{port}.admin.yaml")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        # JSON is YAML: the key is quoted whatever it holds.
        f.write(json.dumps({"admin-api-key": key}) + "\n")
    return ["--config", path]
