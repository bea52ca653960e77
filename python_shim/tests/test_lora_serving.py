"""Many LoRA adapters on one hf engine: isolation from the base, rollback by loading an earlier
checkpoint, the LRU of adapters in memory, mixed batches, and SGLang's routes over real HTTP."""

from __future__ import annotations

import http.client
import json
import shutil
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from safetensors.torch import load_file, save_file

from lora_fixtures import TINY, adapter_rank, engine_tasks, sample, train
from reef_shim.engines.hf_engine import HFEngine
from reef_shim.engines.http_handler import EngineHandler, ServerState
from reef_shim.engines.lora_serving import AdapterError
from reef_shim.engines.request import parse_generate
from reef_shim.engines.weights import WeightError

PROMPT_TEXT = "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A trained for three batches (v1..v3), B and C never trained, all by the real trainer."""
    out = tmp_path_factory.mktemp("adapters")
    tasks = engine_tasks(HFEngine(str(TINY), weight_version="v0", seed=3))
    with adapter_rank() as r:
        for v in ("v1", "v2", "v3"):
            train(r, "A", tasks, out, v)
        for name in ("B", "C"):
            r.adapters.ensure(name)
            r.adapters.save(name, out / name, {"weightVersion": "v0", "parent": None, "batchId": None})
    with adapter_rank(r=2) as narrow:  # another shape: it cannot take a rank-4 adapter's slot
        narrow.adapters.ensure("D")
        narrow.adapters.save("D", out / "D", {"weightVersion": "v0", "parent": None, "batchId": None})
    return {"A1": out / "v1", "A3": out / "v3", "B": out / "B", "C": out / "C", "D": out / "D"}


def _engine(max_loaded: int = 8) -> HFEngine:
    return HFEngine(str(TINY), weight_version="v0", seed=3, max_loaded_adapters=max_loaded)


def _same(a: Any, b: Any) -> bool:
    return a.output_ids == b.output_ids and a.token_logprobs == b.token_logprobs


def test_an_untrained_adapter_is_the_base_a_trained_one_is_not_and_an_earlier_checkpoint_restores_its_tokens(
        checkpoints: dict[str, Path]) -> None:
    plain = _engine()  # no adapter ever loaded: the engine as it was before adapters
    prompt = plain.encode(PROMPT_TEXT)
    base = [sample(plain, prompt, None, seed=s) for s in (1, 2)]
    eng = _engine()
    eng.load_lora_adapter("A", str(checkpoints["A1"]))
    a1 = [sample(eng, prompt, "A", seed=s) for s in (1, 2)]
    eng.unload_lora_adapter("A")
    eng.load_lora_adapter("A", str(checkpoints["A3"]))  # A's newest release
    eng.load_lora_adapter("B", str(checkpoints["B"]))
    for i, s in enumerate((1, 2)):
        b = sample(eng, prompt, "B", seed=s)
        assert _same(b, base[i]) and b.adapter == "B"  # bit-identical to the base, logprobs too
        assert _same(sample(eng, prompt, None, seed=s), base[i])  # the base, with adapters loaded
        a3 = sample(eng, prompt, "A", seed=s)
        assert a3.output_ids != base[i].output_ids and a3.output_ids != a1[i].output_ids
    eng.unload_lora_adapter("A")
    eng.load_lora_adapter("A", str(checkpoints["A1"]))  # rolled back
    for i, s in enumerate((1, 2)):
        assert _same(sample(eng, prompt, "A", seed=s), a1[i])


def test_the_lru_evicts_the_least_recently_used_and_reads_it_back_with_the_same_outputs(
        checkpoints: dict[str, Path]) -> None:
    eng = _engine(max_loaded=2)
    prompt = eng.encode(PROMPT_TEXT)
    eng.load_lora_adapter("A", str(checkpoints["A3"]))
    first = sample(eng, prompt, "A")
    eng.load_lora_adapter("B", str(checkpoints["B"]))
    sample(eng, prompt, "A")  # A is now the more recently used
    eng.load_lora_adapter("C", str(checkpoints["C"]))
    assert list(eng.adapters.loaded) == ["A", "C"]  # B, the least recently used, was evicted
    assert set(eng.adapters.listing()) == {"A", "B", "C"}  # still registered
    sample(eng, prompt, "B")  # read back on demand: evicts A now
    assert list(eng.adapters.loaded) == ["C", "B"] and eng.adapters.stats["evictions"] == 2
    again = sample(eng, prompt, "A")  # read back again
    assert _same(again, first) and again.adapter == "A"
    assert eng.adapters.stats["loads"] == 5 and eng.adapters.stats["reused"] == 3  # copied into a freed slot
    per_slot = eng.adapters.memory_bytes() // 2
    base = sample(_engine(), prompt, None)
    eng.load_lora_adapter("D", str(checkpoints["D"]))  # another shape: a new slot, the spare one deleted
    assert list(eng.adapters.loaded) == ["A", "D"] and eng.adapters.memory_bytes() < 2 * per_slot
    assert _same(sample(eng, prompt, "D"), base)
    assert _same(sample(eng, prompt, "B"), base)  # B into A's freed slot
    assert _same(sample(eng, prompt, "A"), first)  # D evicted, its slot of another shape: a new one for A
    assert eng.adapters.memory_bytes() <= 2 * per_slot  # never more than max_loaded_adapters slots


def test_a_mixed_batch_serves_each_row_by_its_own_adapter(checkpoints: dict[str, Path]) -> None:
    eng = _engine(max_loaded=2)
    prompt = eng.encode(PROMPT_TEXT)
    eng.load_lora_adapter("A", str(checkpoints["A3"]))
    eng.load_lora_adapter("B", str(checkpoints["B"]))
    eng.load_lora_adapter("C", str(checkpoints["C"]))  # three registered, two in memory
    alone = {name: sample(eng, prompt, name, seed=7) for name in ("A", None)}
    eng.start(max_batch=8)
    try:
        def body(name: str | None) -> Any:
            return parse_generate({"input_ids": prompt, "lora_path": name,
                                   "sampling_params": {"max_new_tokens": 16, "sampling_seed": 7, "ignore_eos": True}})
        tickets = [(name, eng.submit(body(name), lambda: None)) for name in ("A", None, "B", "C", "A")]
        results = [(name, list(t.states())[-1]) for name, t in tickets]
    finally:
        assert eng.scheduler is not None
        eng.scheduler.close()
    for name, state in results:
        assert state.adapter == name
        want = alone["A"] if name == "A" else alone[None]  # B and C are untrained: the base's tokens
        assert state.output_ids == want.output_ids, name


def test_bad_adapter_requests_are_refused_with_the_reason(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    eng = _engine()
    prompt = eng.encode(PROMPT_TEXT)
    before = sample(eng, prompt, None)
    from reef_shim.engines.request import RequestError

    with pytest.raises(RequestError, match="no adapter of that name is loaded"):
        sample(eng, prompt, "nobody")
    with pytest.raises(AdapterError, match="no readable adapter_config.json"):
        eng.load_lora_adapter("X", str(tmp_path))
    # An adapter for another base (a wider layer): refused before PEFT changes the model.
    other = tmp_path / "other"
    shutil.copytree(checkpoints["A3"], other)
    tensors = load_file(str(other / "adapter_model.safetensors"))
    key = next(k for k in tensors if k.endswith("lora_A.weight"))
    tensors[key] = torch.zeros(tensors[key].shape[0], tensors[key].shape[1] * 2)
    save_file(tensors, str(other / "adapter_model.safetensors"))
    with pytest.raises(AdapterError, match="does not fit"):
        eng.load_lora_adapter("X", str(other))
    assert eng.adapters.peft is None and eng.adapters.listing() == {}
    assert _same(sample(eng, prompt, None), before)
    eng.load_lora_adapter("A", str(checkpoints["A1"]))
    with pytest.raises(AdapterError, match="already loaded"):
        eng.load_lora_adapter("A", str(checkpoints["A3"]))
    with pytest.raises(AdapterError, match="is not loaded"):
        eng.unload_lora_adapter("B")
    with pytest.raises(WeightError, match="LoRA adapters are loaded"):
        eng.update_weights_from_disk(str(TINY), "v9")
    with pytest.raises(RequestError, match="lora_path"):
        parse_generate({"text": "x", "lora_path": ["a", "b"]})


@pytest.fixture()
def server() -> Iterator[tuple[tuple[str, int], HFEngine]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), EngineHandler)
    httpd.daemon_threads = True
    eng = _engine(max_loaded=1)
    eng.start(max_batch=4)
    httpd.state = ServerState(max_running=8)  # type: ignore[attr-defined]
    httpd.state.engine = eng  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[:2], eng  # type: ignore[misc]
    finally:
        httpd.shutdown()
        httpd.server_close()
        assert eng.scheduler is not None
        eng.scheduler.close()


def _post(addr: tuple[str, int], path: str, body: dict[str, Any]) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(*addr, timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def test_sglangs_routes_load_serve_and_unload_adapters_over_http(server: tuple[tuple[str, int], HFEngine],
                                                                  checkpoints: dict[str, Path]) -> None:
    addr, eng = server
    gen = {"input_ids": eng.encode(PROMPT_TEXT), "sampling_params": {"max_new_tokens": 8, "sampling_seed": 3}}
    status, base = _post(addr, "/generate", gen)
    assert status == 200 and base["meta_info"]["lora_path"] is None
    status, out = _post(addr, "/load_lora_adapter", {"lora_name": "A", "lora_path": str(checkpoints["A3"])})
    assert status == 200 and out == {"success": True, "error_message": None,
                                     "loaded_adapters": {"A": str(checkpoints["A3"])}}
    status, out = _post(addr, "/load_lora_adapter", {"lora_name": "B", "lora_path": str(checkpoints["B"])})
    assert status == 200 and set(out["loaded_adapters"]) == {"A", "B"}  # one in memory, both registered
    status, a = _post(addr, "/generate", {**gen, "lora_path": "A"})  # read back: B is evicted
    assert status == 200 and a["meta_info"]["lora_path"] == "A" and a["output_ids"] != base["output_ids"]
    status, b = _post(addr, "/generate", {**gen, "lora_path": ["B"]})
    assert status == 200 and b["output_ids"] == base["output_ids"] and b["meta_info"]["lora_path"] == "B"
    status, out = _post(addr, "/load_lora_adapter", {"lora_name": "A", "lora_path": str(checkpoints["A1"])})
    assert status == 400 and out["success"] is False and "already loaded" in out["error_message"]
    status, out = _post(addr, "/load_lora_adapter", {"lora_name": "Z"})
    assert status == 400 and "lora_path is required" in out["error"]["message"]
    status, out = _post(addr, "/unload_lora_adapter", {"lora_name": "A"})
    assert status == 200 and out["loaded_adapters"] == {"B": str(checkpoints["B"])}
    status, out = _post(addr, "/generate", {**gen, "lora_path": "A"})
    assert status == 400 and "no adapter of that name" in out["error"]["message"]
