"""GPU only: Reef's weight push (`trainer/weight_push.py`) into a running SGLang engine.

Skipped (visibly) without CUDA; also skipped when SGLang is not installed. The model is
`REEF_GPU_MODEL` (a checkpoint available on that machine), else the tiny model. Never run yet: the
same pusher is run over gloo into the hf engine by `test_weight_sync.py` and `test_trainer.py`.

NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU detected"), so the push
goes over nccl from a second GPU when there is one (SGLang serves on GPU 0), and over gloo on a
single-GPU machine, where SGLang receives into its CUDA tensors. `REEF_GPU_PUSH_BACKEND` forces one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

pytestmark = pytest.mark.gpu


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.environ.get("REEF_GPU_MODEL"):
        return Path(os.environ["REEF_GPU_MODEL"])
    from reef_shim import tiny_model

    out = tmp_path_factory.mktemp("tiny") / "model"
    tiny_model.build(out, seed=0, quiet=True)
    return out


@pytest.fixture(scope="module")
def sglang(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("sglang", reason="SGLang is not installed")
    from reef_shim.engine_process import pick_free_port

    port = pick_free_port("127.0.0.1")
    log = open(tmp_path_factory.mktemp("sglang") / "engine.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--port", str(port),
                             "--host", "127.0.0.1", "--mem-fraction-static", "0.3"], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, "sglang exited during start"
            try:
                _get(url + "/model_info")
                break
            except OSError:
                assert time.monotonic() < deadline, "sglang did not become healthy"
                time.sleep(2)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def _post(url: str, body: dict[str, Any]) -> Any:
    from reef_shim.trainer.weight_push import post

    return post(url, body, 60)


def test_a_push_into_sglang_is_served(model: Path, sglang: str) -> None:
    import torch
    from safetensors.torch import load_file

    from reef_shim.engine_process import pick_free_port
    from reef_shim.trainer.weight_push import WeightPusher, engine_workers

    backend = os.environ.get("REEF_GPU_PUSH_BACKEND") or ("nccl" if torch.cuda.device_count() >= 2 else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(1)
    print(f"pushing over {backend} ({torch.cuda.device_count()} GPU(s))")
    state = load_file(str(model / "model.safetensors"))
    bumped = {k: v + 1e-3 for k, v in state.items()}  # a visible change the engine must report back
    probe = {"text": "The sea is", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    before = _post(sglang + "/generate", probe)
    pusher = WeightPusher(sglang, backend, ("127.0.0.1", pick_free_port("127.0.0.1")), engine_workers(sglang))
    pusher.connect()
    started = time.monotonic()
    sent = pusher.push(sorted(bumped.items()), "gpu-v1")
    elapsed = time.monotonic() - started
    pusher.close()
    assert sent == sum(t.numel() * t.element_size() for t in bumped.values())
    assert _get(sglang + "/model_info").get("weight_version") == "gpu-v1"
    norm = _post(sglang + "/get_weights_by_name", {"name": "model.norm.weight", "truncate_size": 4})
    assert norm and abs(float(norm[0]) - float(bumped["model.norm.weight"][0])) < 1e-2, norm
    after = _post(sglang + "/generate", probe)
    assert after.get("meta_info", {}).get("weight_version") in (None, "gpu-v1")
    print(f"{backend} push: {sent / 1e6:.1f} MB in {elapsed:.2f} s; greedy before {before.get('text')!r}, "
          f"after {after.get('text')!r}")
