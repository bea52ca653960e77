"""Reef's SGLang plugin (`reef_shim/engines/sglang_plugin.py`): SGLang's end of a weight-update
group waits on it at most Reef's bound, not torch's 30 minutes.

The plugin is loaded by SGLang 0.5.23's own plugin loader and hook registry: its source (the wheel
and the modules that loader imports, `python_shim/requirements-sglang-src.lock`) is installed by
`scripts/setup.sh` under `.cache/sglang-src`. Not an engine: no SGLang server runs here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from reef_shim.engine_process import (SGLANG_PLUGIN_NAME, SGLANG_PLUGIN_PATH, SGLANG_WEIGHT_GROUP_TIMEOUT_S, engine_env,
                                      pick_free_port)
from reef_shim.engines import sglang_plugin

ROOT = Path(__file__).resolve().parents[2]
SGLANG_SRC = ROOT / ".cache" / "sglang-src"
PROBE = Path(__file__).with_name("sglang_plugin_probe.py")


def test_sglang_engines_get_the_plugin_and_its_bound_and_others_do_not() -> None:
    env = engine_env("sglang", {"PATH": "/bin", "PYTHONPATH": "/opt/x"})
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert paths[0] == SGLANG_PLUGIN_PATH and paths[-1] == "/opt/x"
    assert env[sglang_plugin.ENV] == f"{SGLANG_WEIGHT_GROUP_TIMEOUT_S:g}" and "SGLANG_PLUGINS" not in env
    assert engine_env("sglang", {sglang_plugin.ENV: "90"})[sglang_plugin.ENV] == "90"
    # An operator's list of allowed plugins keeps its own and gains Reef's.
    assert engine_env("sglang", {"SGLANG_PLUGINS": "theirs"})["SGLANG_PLUGINS"] == f"theirs,{SGLANG_PLUGIN_NAME}"
    assert engine_env("hf", {"PATH": "/bin"}) == {"PATH": "/bin"}


def test_the_hook_fills_in_only_a_missing_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sglang_plugin.ENV, "360")
    bound = timedelta(seconds=360)
    assert sglang_plugin.bounded_timeout(backend="nccl", group_name="g") == ((), {"backend": "nccl", "group_name": "g",
                                                                                  "timeout": bound})
    assert sglang_plugin.bounded_timeout(backend="nccl", timeout=None)[1]["timeout"] == bound
    assert sglang_plugin.bounded_timeout("nccl", "tcp://h:1", None, 2) == (("nccl", "tcp://h:1", bound, 2), {})
    assert sglang_plugin.bounded_timeout(backend="nccl", timeout=timedelta(seconds=5)) is None
    assert sglang_plugin.bounded_timeout("nccl", "tcp://h:1", timedelta(seconds=5)) is None
    for bad in ("", "0", "-1", "nan", "inf", "5m"):
        monkeypatch.setenv(sglang_plugin.ENV, bad)
        assert sglang_plugin.bounded_timeout(backend="nccl") is None


def probe(env: dict[str, str]) -> dict[str, object]:
    if not (SGLANG_SRC / "sglang" / "srt" / "plugins" / "__init__.py").is_file():
        pytest.fail(f"SGLang's source is not at {SGLANG_SRC}: run scripts/setup.sh (it installs "
                    "python_shim/requirements-sglang-src.lock there)")
    env = {**env, "PYTHONPATH": os.pathsep.join([env.get("PYTHONPATH", ""), str(SGLANG_SRC)]).strip(os.pathsep)}
    ports = [str(pick_free_port("127.0.0.1")) for _ in range(2)]
    r = subprocess.run([sys.executable, str(PROBE), *ports], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_through_sglangs_own_loader_a_weight_group_gets_reefs_bound_instead_of_30_minutes() -> None:
    base = {k: v for k, v in os.environ.items() if k != sglang_plugin.ENV}
    base["PYTHONPATH"] = str(ROOT / "python_shim")
    # Before the plugins load, torch's default of 30 minutes; after, Reef's bound.
    assert probe(engine_env("sglang", base)) == {"before_s": 1800.0, "timeout_s": SGLANG_WEIGHT_GROUP_TIMEOUT_S,
                                                  "early_binding_patched": True, "plugins": [SGLANG_PLUGIN_NAME]}
