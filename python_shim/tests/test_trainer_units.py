"""Trainer pieces without Ray: task decoding, sharding, versions and ledger, metric combining, scoring."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from reef_shim import tiny_model
from reef_shim.errors import ShimError
from reef_shim.trainer.checkpoint import Ledger, next_version, save_checkpoint
from reef_shim.trainer.loss import combine, empty_sums
from reef_shim.trainer.scoring import policy_logprobs, response_logits, teacher_scores
from reef_shim.trainer.tasks import TrainTask, decode_tasks, shard
from reef_shim.trainer.group import TrainerGroup, check_devices
from reef_shim.trainer.rank import pick_device
from reef_shim.trainer.weight_push import push_backend
from recipes.openclawrl.objective import ObjectiveConfig
from trainer_fixtures import f32, i32


def wire(**over: object) -> dict:
    base = {"taskId": "t", "promptIds": i32([1, 2, 3]), "responseIds": i32([4, 5]), "logprobs": f32([-0.1, -0.2]),
            "topK": 2, "topkIds": i32([4, 6, 5, -1]), "topkLogprobs": f32([-0.1, -2.0, -0.2, -10000.0]), "reward": 1.0,
            "teacherPromptIds": [i32([1, 2, 9])], "sampling": {"temperature": 0.8, "topP": 0.9, "topK": -1},
            "weightVersion": None}
    return {**base, **over}


@pytest.mark.parametrize("over,message", [
    ({"logprobs": f32([-0.1])}, "tasks[0].logprobs: 1 values for 2 response tokens"),
    ({"topkIds": i32([4, 6, 5])}, "tasks[0].topkIds: 3 values, expected 2 x 2"),
    ({"promptIds": i32([1, 5000])}, "tasks[0].promptIds: token id 5000 is outside the vocabulary [0, 2048)"),
    ({"responseIds": b"\x01\x02\x03"}, "tasks[0].responseIds: 3 bytes is not a whole number"),
    ({"responseIds": b""}, "tasks[0]: prompt and response must not be empty"),
    ({"logprobs": f32([float("nan"), 0.0])}, "tasks[0].logprobs: holds NaN"),
    # -inf travels as the engine's floor: the finiteness check alone let it through, and its RL
    # ratio exp(ℓθ + 10000) failed the whole batch as a non-finite loss or gradient, unnamed.
    ({"logprobs": f32([-0.1, -10000.0])}, "tasks[0].logprobs[1]: -10000 is the engine's floor"),
    ({"teacherPromptIds": [i32([])]}, "tasks[0].teacherPromptIds[0]: empty prompt"),
])
def test_decode_names_the_broken_field(over: dict, message: str) -> None:
    with pytest.raises(ShimError) as e:
        decode_tasks([wire(**over)], 2048, 4096)
    assert e.value.code == "REEF_ERR_INVALID_ARGUMENT" and message in e.value.message


def test_a_top_k_wider_than_the_vocabulary_fails_the_call_not_a_rank() -> None:
    # The ranks take torch.topk(K) over the vocabulary; K > V raised there, mid-step, on every rank.
    k = 11
    over = {"topK": k, "topkIds": i32([4, 6] + [-1] * (k - 2) + [5] + [-1] * (k - 1)), "topkLogprobs": f32([-1.0] * 2 * k)}
    with pytest.raises(ShimError) as e:
        decode_tasks([wire(**over)], 10, 4096)
    assert e.value.code == "REEF_ERR_INVALID_ARGUMENT" and "tasks[0].topK: 11 exceeds the vocabulary size 10" in e.value.message
    assert decode_tasks([wire(**over)], 11, 4096)[0].K == k


def test_decode_reads_little_endian_arrays_and_context_limit() -> None:
    [t] = decode_tasks([wire()], 2048, 4096)
    assert t.response_ids.tolist() == [4, 5] and t.topk_ids.tolist() == [[4, 6], [5, -1]]
    assert t.topk_logprobs[1, 1] == -10000.0 and t.H == 1 and t.temperature == pytest.approx(0.8)
    with pytest.raises(ShimError, match="5 tokens exceed the model's context length 4"):
        decode_tasks([wire()], 2048, 4)
    with pytest.raises(ShimError, match="at least one task"):
        decode_tasks([], 2048, 4096)


def test_a_teacher_prompt_past_the_context_length_loses_its_candidate_not_the_batch() -> None:
    # The turn fits (3 + 2 tokens); with a long hint the teacher's prompt does not (7 + 2 > 6).
    hinted = wire(taskId="hinted", teacherPromptIds=[i32([1, 2, 9]), i32([1, 2, 3, 7, 7, 7, 7])])
    only_long = wire(taskId="only-long", teacherPromptIds=[i32([1, 2, 3, 7, 7, 7, 7])])
    a, b, c = decode_tasks([hinted, only_long, wire(taskId="plain")], 2048, 6)
    assert [p.tolist() for p in a.teacher_prompt_ids] == [[1, 2, 9]] and a.teacher_overlong == 1
    assert b.H == 0 and b.teacher_overlong == 1  # no distillation term left; its RL term stays
    assert c.H == 1 and c.teacher_overlong == 0
    with pytest.raises(ShimError, match="tasks\\[1\\]: 7 tokens exceed the model's context length 6"):
        decode_tasks([wire(), wire(promptIds=i32([1, 2, 3, 4, 5]))], 2048, 6)


def _task(p: int, t: int, h: int = 0) -> TrainTask:
    z = np.zeros
    return TrainTask("x", z(p, np.int64), z(t, np.int64), z(t, np.float32), z((t, 1), np.int64), z((t, 1), np.float32),
                     0.0, [z(p, np.int64)] * h)


def test_shard_balances_by_cost_and_is_deterministic() -> None:
    tasks = [_task(10, 10), _task(100, 50, 1), _task(10, 5), _task(20, 20), _task(5, 5)]
    a = shard(tasks, 2)
    assert a == shard(tasks, 2) and sorted(i for r in a for i in r) == [0, 1, 2, 3, 4]
    assert a[0] == [1] and a[1] == [0, 2, 3, 4]
    assert shard(tasks[:1], 3) == [[0], [], []]


def test_versions_are_monotonic_across_disk_and_ledger(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    assert next_version(tmp_path, ledger) == "v1"
    (tmp_path / "v3").mkdir()
    (tmp_path / "v10x").mkdir()
    assert next_version(tmp_path, ledger) == "v4"
    ledger.record("b:1", {"weightVersion": "v7", "metrics": {}})
    assert next_version(tmp_path, Ledger(tmp_path)) == "v8"
    assert Ledger(tmp_path).get("b:1") == {"weightVersion": "v7", "metrics": {}}
    (tmp_path / "reef_trainer_ledger.json").write_text("{not json")
    with pytest.raises(ShimError, match="cannot read the batch ledger"):
        Ledger(tmp_path)


def test_the_ledger_keeps_the_newest_batches_in_training_order(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from reef_shim.trainer import checkpoint

    monkeypatch.setattr(checkpoint, "LEDGER_KEEP", 3)
    ledger = Ledger(tmp_path)
    # Ids whose sorted order is not their training order.
    for i, batch_id in enumerate(["b:9", "b:10", "a:1", "c:0", "b:2"], start=1):
        ledger.record(batch_id, {"weightVersion": f"v{i}", "metrics": {}})
    reread = Ledger(tmp_path)
    assert list(reread.batches) == ["a:1", "c:0", "b:2"]
    assert reread.get("b:9") is None and reread.get("b:2") == {"weightVersion": "v5", "metrics": {}}
    assert next_version(tmp_path, reread) == "v6"


def test_a_ledger_entry_that_could_not_be_written_is_not_remembered(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Remembered, it would answer "already trained" to the retry and be gone after a restart.
    from reef_shim.trainer import checkpoint

    ledger = Ledger(tmp_path)

    def disk_full(path: Path, value: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_json_atomic", disk_full)
    with pytest.raises(OSError):
        ledger.record("b:1", {"weightVersion": "v1", "metrics": {}})
    assert ledger.get("b:1") is None


def test_a_ledger_write_that_runs_out_of_space_leaves_the_ledger_as_it_was_and_no_copy(tmp_path: Path) -> None:
    import resource
    import signal

    ledger = Ledger(tmp_path)
    ledger.record("b:1", {"weightVersion": "v1"})
    before = (tmp_path / "reef_trainer_ledger.json").read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 12, hard))
    try:
        with pytest.raises(OSError):
            ledger.record("b:2", {"weightVersion": "v2", "metrics": {"x" * 8192: 1.0}})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert [p.name for p in tmp_path.iterdir()] == ["reef_trainer_ledger.json"]
    assert (tmp_path / "reef_trainer_ledger.json").read_bytes() == before and ledger.get("b:2") is None


def test_a_checkpoint_and_the_ledger_are_on_disk_before_anything_points_at_them(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "tokenizer.json").write_text("{}")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    events: list[tuple[str, str]] = []
    real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: object, dst: object) -> None:
        events.append(("rename", str(Path(str(dst)).resolve())))
        real_rename(src, dst)

    def replace(src: object, dst: object) -> None:
        events.append(("replace", str(Path(str(dst)).resolve())))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "replace", replace)
    out = ckpt / "v1"
    save_checkpoint({"w": torch.ones(4)}, base, out, {"weightVersion": "v1"})
    Ledger(ckpt).record("b:1", {"weightVersion": "v1"})

    root = ckpt.resolve()
    at = events.index(("rename", str(root / "v1")))
    tmp = root / f".v1.{os.getpid()}.tmp"
    synced_before = {p for kind, p in events[:at] if kind == "fsync"}
    # Every file the checkpoint holds, and the directory with their names, before the rename.
    assert {p.name for p in out.iterdir()} == {"model.safetensors", "config.json", "tokenizer.json", "reef_checkpoint.json"}
    assert {str(tmp / p.name) for p in out.iterdir()} | {str(tmp)} <= synced_before
    ledger_at = events.index(("replace", str(root / "reef_trainer_ledger.json")))
    # The rename, before the ledger names the checkpoint; the ledger's data, then its replacement.
    assert ("fsync", str(root)) in events[at + 1:ledger_at]
    assert any(kind == "fsync" and Path(p).name.startswith(".reef_trainer_ledger.json.") for kind, p in events[at:ledger_at])
    assert events[-1] == ("fsync", str(root))


def test_a_checkpoint_no_ledger_entry_names_is_removed_once_a_later_step_is_recorded(tmp_path: Path) -> None:
    for v in ("v1", "v2", "v3", "v4", "v6"):
        (tmp_path / v).mkdir()
        (tmp_path / v / "model.safetensors").write_bytes(b"\0" * 64)
    ledger = Ledger(tmp_path)
    ledger.record("b:1", {"weightVersion": "v1"})
    ledger.record("b:2", {"weightVersion": "v2"})
    # b:3 saved v3 and v4 (a crash after each rename, before its ledger write), then v5 for good.
    ledger.record("b:3", {"weightVersion": "v5"})
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["v1", "v2", "v6"]
    assert next_version(tmp_path, Ledger(tmp_path)) == "v7"


def test_unlisted_checkpoints_are_left_alone_by_a_ledger_that_starts_empty(tmp_path: Path) -> None:
    # A ledger removed by hand: v1..v3 may be releases it no longer lists.
    for v in ("v1", "v2", "v3"):
        (tmp_path / v).mkdir()
    Ledger(tmp_path).record("b:1", {"weightVersion": next_version(tmp_path, Ledger(tmp_path))})
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["v1", "v2", "v3"]


def test_a_save_clears_what_a_save_that_died_left(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    ckpt = tmp_path / "ckpt"
    for leftover in (".v1.4242.tmp", ".v3.77.tmp"):  # other pids: ranks that died writing v1, v3
        (ckpt / leftover).mkdir(parents=True)
        (ckpt / leftover / "model.safetensors").write_bytes(b"\0" * 64)
    (ckpt / ".notes.tmp").mkdir()  # not a checkpoint's: left alone
    save_checkpoint({"w": torch.ones(4)}, base, ckpt / "v1", {"weightVersion": "v1"})
    assert sorted(p.name for p in ckpt.iterdir()) == [".notes.tmp", "v1"]
    assert next_version(ckpt, Ledger(ckpt)) == "v2"


def test_a_save_that_runs_out_of_space_leaves_nothing_behind(tmp_path: Path) -> None:
    # A real write failure: the process may not grow a file past 64 KiB (EFBIG, as ENOSPC would).
    import resource
    import signal

    from safetensors import SafetensorError

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    ckpt = tmp_path / "ckpt"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, hard))
    try:
        with pytest.raises((OSError, SafetensorError)):
            save_checkpoint({"w": torch.ones(1 << 16)}, base, ckpt / "v1", {"weightVersion": "v1"})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    # Neither `v1` nor the temporary copy, which held the disk full until the next save.
    assert list(ckpt.iterdir()) == []


@pytest.mark.parametrize("trainer,engine,backend", [
    ("cpu", "cpu", "gloo"),
    ("cuda", "cuda", "nccl"),  # SGLang on its own GPU
    ("cuda", "cpu", "gloo"),  # the hf engine: it cannot join an NCCL group
    ("cuda:0", "cuda:1", "nccl"),
    ("cpu", "cuda", "gloo"),  # CPU tensors can only go over gloo
    ("cuda", None, "nccl"),  # an engine that does not say is taken to be where the trainer is
    ("cpu", None, "gloo"),
])
def test_the_push_backend_follows_both_ends(trainer: str, engine: str | None, backend: str) -> None:
    assert push_backend(trainer, engine) == backend


@pytest.mark.parametrize(("engine", "config", "sent"), [
    ("bfloat16", {"dtype": "float32"}, torch.bfloat16),  # an explicit --dtype wins
    ("half", {}, torch.float16),
    ("float32", {"dtype": "bfloat16"}, torch.float32),
    ("auto", {"dtype": "bfloat16"}, torch.bfloat16),  # SGLang's auto: the checkpoint's dtype...
    ("auto", {"torch_dtype": "float32", "model_type": "qwen3"}, torch.float16),  # ...but fp32 as fp16
    ("auto", {"dtype": "float32", "model_type": "gemma2"}, torch.bfloat16),  # ...and Gemma's as bf16
    ("auto", {}, torch.float16),  # a config without a dtype is fp32 to SGLang
    (None, {"dtype": "bfloat16"}, None),  # an engine that does not say: sent as held
    ("fp8_e4m3", {}, None),
])
def test_the_push_sends_the_dtype_the_engine_serves(engine: str | None, config: dict[str, str],
                                                    sent: torch.dtype | None) -> None:
    from types import SimpleNamespace

    from reef_shim.trainer.weight_push import push_dtype

    assert push_dtype(engine, SimpleNamespace(**config)) == sent


def test_closing_a_push_raises_nothing_whatever_the_engine_answers() -> None:
    # close() runs in the rank's `finally`; what it raises fails the rank and the driver kills every rank.
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from reef_shim.trainer.weight_push import WeightPusher

    class NotJson(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html>ok</html>")

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), NotJson)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        pusher = WeightPusher(f"http://127.0.0.1:{server.server_port}", "gloo", ("127.0.0.1", 1))
        pusher.group, pusher._abandoned = object(), True  # a group dropped mid-push: no leave_group
        pusher.close()
        assert pusher.group is None
    finally:
        server.shutdown()


def test_ranks_must_agree_on_their_device() -> None:
    assert check_devices(["cpu", "cpu"]) is None
    assert check_devices(["cuda:0", "cuda:0", "cuda:0"]) is None
    why = check_devices(["cuda:0", "cpu"])
    assert why is not None and "rank 0 cuda:0, rank 1 cpu" in why and "REEF_TRAINER_DEVICE" in why


def test_the_trainer_device_setting() -> None:
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("").type == pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="expected auto, cpu or cuda, got 'gpu'"):
        pick_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="REEF_TRAINER_DEVICE=cuda, but this rank sees no CUDA device"):
            pick_device("cuda")


def test_combine_weights_each_metric_by_its_own_denominator() -> None:
    a = {**empty_sums(), "tokens": 3, "opd_tokens": 3, "entries": 6, "rl_loss": 3 * 0.5, "opd_loss": 3 * 2.0,
         "mean_abs_d": 6 * 0.1, "samples": 1, "abs_diff_sum": 3e-6, "abs_diff_max": 2e-6}
    b = {**empty_sums(), "tokens": 1, "rl_loss": 1 * -1.0, "samples": 1, "abs_diff_sum": 1e-6, "abs_diff_max": 1e-6}
    m = combine([a, b, empty_sums()], ObjectiveConfig(w_rl=1.0, w_opd=0.5))
    # Both losses are means over all 4 tokens (b's token has no teacher and adds 0 to the OPD sum).
    assert m["rl_loss"] == pytest.approx(0.125) and m["opd_loss"] == pytest.approx(1.5)
    assert m["loss"] == pytest.approx(0.875) and m["mean_abs_d"] == pytest.approx(0.1)
    assert m["train_rollout_logprob_abs_diff"] == pytest.approx(1e-6) and m["train_rollout_logprob_abs_diff_max"] == 2e-6
    assert m["tokens"] == 4 and m["samples"] == 2


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("tiny") / "model"
    tiny_model.build(out, seed=0, quiet=True)
    return AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()


def test_a_checkpoint_loads_with_transformers_also_for_a_model_with_a_slow_tokenizer(model, tmp_path: Path) -> None:
    # A base that ships its tokenizer as vocab.json + merges.txt (or tokenizer.model) and no
    # tokenizer.json: the checkpoint had neither, and AutoTokenizer could not load it.
    import json
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = tmp_path / "base"
    shutil.copytree(model.config.name_or_path, base)
    bpe = json.loads((base / "tokenizer.json").read_text())["model"]
    (base / "vocab.json").write_text(json.dumps(bpe["vocab"]))
    (base / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in bpe["merges"]) + "\n")
    (base / "tokenizer.json").unlink()
    config = json.loads((base / "tokenizer_config.json").read_text())
    (base / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "Qwen2Tokenizer"}))
    tied = model.config.tie_word_embeddings
    state = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_checkpoint(state, base, tmp_path / "v1", {"weightVersion": "v1"})

    text = "hello world, <|im_start|>user hi"
    ids = AutoTokenizer.from_pretrained(str(base))(text)["input_ids"]
    assert AutoTokenizer.from_pretrained(str(tmp_path / "v1"))(text)["input_ids"] == ids
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "v1"), dtype=torch.float32)
    theirs = loaded.state_dict()
    assert set(theirs) == set(model.state_dict())  # a tied head comes back from the embedding
    assert all(torch.equal(theirs[k], v) for k, v in model.state_dict().items())


def test_a_load_that_one_rank_cannot_read_says_why_and_which_rank(model, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Rank 1 cannot see the path (a disk local to rank 0's node); rank 0 read it and answers only
    # that another rank could not. The driver's check passes: it runs where rank 0 does.
    from types import SimpleNamespace

    from reef_shim.trainer.rank import PEER_FAILED

    answers = [PEER_FAILED, "/mnt/local/v3 is not a directory"]
    group = TrainerGroup(driver=None)
    group._spec, group._ledger = {"modelPath": model.config.name_or_path}, Ledger(tmp_path)
    group._ranks = [SimpleNamespace(load=SimpleNamespace(remote=lambda path, a=a: a)) for a in answers]
    monkeypatch.setattr(group, "_gather", lambda refs, what, deadline: refs)
    with pytest.raises(ShimError) as bad:
        group.load(model.config.name_or_path)
    assert bad.value.code == "REEF_ERR_INVALID_ARGUMENT"
    assert bad.value.message == f"checkpoint {model.config.name_or_path} (rank 1 of 2): /mnt/local/v3 is not a directory"


def test_right_padding_changes_no_logit(model) -> None:
    rng = np.random.default_rng(0)
    ctx = [rng.integers(0, 2048, n) for n in (5, 17)]
    resp = [rng.integers(0, 2048, n) for n in (9, 3)]
    cpu = torch.device("cpu")
    seen: list[tuple[int, ...]] = []
    spy = model.get_output_embeddings().register_forward_hook(lambda _m, _a, out: seen.append(tuple(out.shape)))
    with torch.no_grad():
        together = response_logits(model, ctx, resp, cpu)
        spy.remove()
        assert seen == [(2, 9, 2048)]  # the head ran on the longest response's 9 positions, not 22
        for i in range(2):
            # Against the plain forward of the row alone, all its positions through the head.
            full = model(input_ids=torch.from_numpy(np.concatenate([ctx[i], resp[i]]))[None]).logits[0]
            assert together[i].shape == (len(resp[i]), 2048)
            assert torch.allclose(together[i], full[len(ctx[i]) - 1:len(ctx[i]) - 1 + len(resp[i])], atol=1e-5)
        # The head is whole again afterwards.
        assert model(input_ids=torch.from_numpy(ctx[0])[None]).logits.shape == (1, 5, 2048)


def test_the_response_only_head_has_the_gradient_of_the_full_one(model) -> None:
    rng = np.random.default_rng(2)
    ctx = [rng.integers(0, 2048, n) for n in (4, 11, 7)]
    resp = [rng.integers(0, 2048, n) for n in (6, 2, 5)]
    weights = [torch.from_numpy(rng.standard_normal((len(r), 2048)).astype(np.float32)) for r in resp]

    def grads(loss: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    cut = response_logits(model, ctx, resp, torch.device("cpu"))
    got = grads(sum((lg * w).sum() for lg, w in zip(cut, weights)))
    ref_loss = torch.zeros(())
    for c, r, w in zip(ctx, resp, weights):
        full = model(input_ids=torch.from_numpy(np.concatenate([c, r]))[None]).logits[0]
        ref_loss = ref_loss + (full[len(c) - 1:len(c) - 1 + len(r)] * w).sum()
    ref = grads(ref_loss)
    model.zero_grad(set_to_none=True)
    for g, r in zip(got, ref):
        assert torch.allclose(g, r, atol=1e-4, rtol=1e-4)


def _random_task(seed: int, prompt: int, response: int, k: int) -> TrainTask:
    """A task of random ids with one hint, sampled at temperature 0.7, top_k 50, top_p 0.9."""
    rng = np.random.default_rng(seed)
    t = _task(prompt, response, h=1)
    t.prompt_ids, t.response_ids = rng.integers(0, 2048, prompt), rng.integers(0, 2048, response)
    t.teacher_prompt_ids = [rng.integers(0, 2048, prompt + 2)]
    t.topk_ids = rng.integers(0, 2048, (response, k))
    t.temperature, t.top_k, t.top_p = 0.7, 50, 0.9
    return t


def test_policy_and_teacher_score_in_one_distribution(model) -> None:
    # ℓθ and the teacher both in the engine's convention at the task's temperature (0.7): SGLang's
    # log_softmax(logits / T) before top-k / top-p, which the task's top_k 50 / top_p 0.9 leave alone.
    # The teacher was scored at T = 1 before, while ℓold was at 0.7.
    t = _random_task(1, 6, 4, 3)
    cpu = torch.device("cpu")
    with torch.no_grad():
        logp, topk, kl = policy_logprobs(model, [t], cpu)
        assert kl is None
        lg = response_logits(model, [t.prompt_ids], [t.response_ids], cpu)[0]
        ref = torch.log_softmax(lg / 0.7, -1)
        assert torch.allclose(logp[0], ref.gather(-1, torch.from_numpy(t.response_ids)[:, None]).squeeze(-1), atol=1e-6)
        assert torch.allclose(topk[0], ref.gather(-1, torch.from_numpy(t.topk_ids)), atol=1e-6)
        teach = teacher_scores(model, [t], cpu)
        tl = torch.log_softmax(response_logits(model, [t.teacher_prompt_ids[0]], [t.response_ids], cpu)[0] / 0.7, -1)
    assert torch.allclose(teach["teacher_topk_logp"][0, 0], tl.gather(-1, torch.from_numpy(t.topk_ids)), atol=1e-6)
    assert teach["teacher_top_ids"][0, 0].tolist() == torch.topk(tl, 3, -1).indices.tolist()
    assert teach["cand_mask"].tolist() == [[True]]
    assert teach["cand_len"].tolist() == [[len(t.teacher_prompt_ids[0])]]


def test_policy_scores_in_the_engine_logprob_convention(model) -> None:
    # SGLang reports log-softmax(logits / T) before top-k/top-p ("tempered"), or of the raw logits
    # ("raw", SGLANG_RETURN_ORIGINAL_LOGPROB); the teacher follows the same convention.
    t = _random_task(2, 5, 3, 2)
    cpu = torch.device("cpu")
    resp = torch.from_numpy(t.response_ids)[:, None]
    with torch.no_grad():
        lg = response_logits(model, [t.prompt_ids], [t.response_ids], cpu)[0]
        tlg = response_logits(model, [t.teacher_prompt_ids[0]], [t.response_ids], cpu)[0]
        for convention, scale in [("tempered", 1 / 0.7), ("raw", 1.0)]:
            ref = torch.log_softmax(lg * scale, -1)
            logp, topk, _ = policy_logprobs(model, [t], cpu, convention)
            assert torch.allclose(logp[0], ref.gather(-1, resp).squeeze(-1), atol=1e-6), convention
            assert torch.allclose(topk[0], ref.gather(-1, torch.from_numpy(t.topk_ids)), atol=1e-6), convention
            teach = teacher_scores(model, [t], cpu, convention)
            tref = torch.log_softmax(tlg * scale, -1)
            assert torch.allclose(teach["teacher_topk_logp"][0, 0], tref.gather(-1, torch.from_numpy(t.topk_ids)),
                                  atol=1e-6), convention
    with pytest.raises(ValueError, match="engine logprobs convention 'processed'"):
        policy_logprobs(model, [t], cpu, "processed")


def _self_scored_tasks(model: Any, temperature: float, lengths: list[tuple[int, int]], k: int = 4,
                       seed: int = 5) -> list[TrainTask]:
    """Tasks as an fp32 engine serving `model` would record them at `temperature` (tempered
    logprobs, its own top-K), each with the plain prompt as its only teacher candidate (an anchor
    turn, recipes/openclawrl/record2task.ts). The engine's forward is the batch's own padded one,
    so its numbers are the trainer's exactly."""
    rng = np.random.default_rng(seed)
    tasks = []
    for i, (p, r) in enumerate(lengths):
        t = _task(p, r, h=1)
        t.task_id, t.prompt_ids, t.response_ids = f"t{i}", rng.integers(0, 2048, p), rng.integers(0, 2048, r)
        t.teacher_prompt_ids = [t.prompt_ids.copy()]
        t.temperature, t.reward = temperature, (1.0 if i % 2 == 0 else -1.0)
        tasks.append(t)
    with torch.no_grad():
        logits = response_logits(model, [t.prompt_ids for t in tasks], [t.response_ids for t in tasks], torch.device("cpu"))
    for t, lg in zip(tasks, logits):
        lp = torch.log_softmax(lg / temperature, -1)
        t.logprobs = lp.gather(-1, torch.from_numpy(t.response_ids)[:, None]).squeeze(-1).numpy()
        top = torch.topk(lp, k, -1)
        t.topk_ids, t.topk_logprobs = top.indices.numpy(), top.values.numpy()
    return tasks


def _param_grads(model: Any, loss: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss.backward()
    g = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return g


@pytest.mark.parametrize("old_logprobs", ["engine", "trainer"])
def test_a_teacher_that_is_the_policy_gives_no_opd_gradient_at_any_temperature(model, old_logprobs: str) -> None:
    # Before any update the teacher on an anchor turn (the plain prompt) is the policy itself, so d =
    # ℓT − ℓold must be 0 and OPD must push nowhere. With the teacher scored at T = 1 while ℓold
    # came from T = 0.7, d was the gap between the temperatures (mean |d| ~0.3 here) and OPD pulled
    # every turn toward the T = 1 distribution.
    from recipes.openclawrl.objective import openclawrl_loss
    from reef_shim.trainer.scoring import objective_batch

    tasks = _self_scored_tasks(model, 0.7, [(7, 5), (4, 9)])
    cfg = ObjectiveConfig(w_rl=0.0, w_opd=1.0, old_logprobs=old_logprobs)
    batch = objective_batch(model, model, tasks, torch.device("cpu"), "tempered")
    loss, m = openclawrl_loss(batch, cfg)
    grad = _param_grads(model, loss)
    assert m["samples_with_teacher"] == 2 and m["mean_abs_d"] <= 1e-6, m
    assert grad.norm().item() <= 1e-7, grad.norm().item()
    # The same batch's RL term does move the weights: the zero above is OPD's, not a dead graph.
    rl, _ = openclawrl_loss(objective_batch(model, model, tasks, torch.device("cpu"), "tempered"),
                            ObjectiveConfig(w_rl=1.0, w_opd=0.0, old_logprobs=old_logprobs))
    assert _param_grads(model, rl).norm().item() > 1e-3


def test_micro_batches_pack_by_padded_tokens_longest_first() -> None:
    from reef_shim.trainer.scoring import micro_batches

    # Lengths (prompt + response): 20, 110, 15, 40, 10.
    tasks = [_task(10, 10), _task(100, 10), _task(10, 5), _task(20, 20), _task(5, 5)]
    # Longest first: [1] alone (110 > 100 with any other row), then 40 + 20 (2 rows x 40 = 80), then
    # 15 would make 3 x 40 = 120: next micro-batch, 15 + 10.
    assert micro_batches(tasks, 100) == [[1], [0, 3], [2, 4]]
    assert micro_batches(tasks, 0) == [[0, 1, 2, 3, 4]]
    assert micro_batches(tasks, 10_000) == [[0, 1, 2, 3, 4]]
    assert micro_batches(tasks, 1) == [[1], [3], [0], [2], [4]]  # each above the budget: one each
    assert micro_batches([], 100) == []


@pytest.mark.parametrize("old_logprobs, kl_coef", [("engine", 0.0), ("trainer", 0.3)])
def test_micro_batches_accumulate_the_gradient_of_the_whole_batch(model, old_logprobs: str, kl_coef: float) -> None:
    # Gradient accumulation by token budget must keep the loss the batch's global means: each
    # micro-batch's loss weighted by its share of the batch's tokens (local_loss), summed over the
    # backward passes, is the one-shot gradient, and the metrics add up to the one-shot ones.
    from recipes.openclawrl.objective import openclawrl_loss
    from reef_shim.trainer.loss import add_sums, local_loss
    from reef_shim.trainer.scoring import micro_batches, objective_batch

    cpu = torch.device("cpu")
    tasks = _self_scored_tasks(model, 0.7, [(9, 6), (3, 11), (12, 4), (5, 7)])
    # A hinted candidate too, and a drifted engine: ratios, overlaps and TIS weights all take part.
    for i, t in enumerate(tasks):
        t.teacher_prompt_ids = [t.prompt_ids, np.concatenate([t.prompt_ids, [7, 8, 9][: i + 1]])]
        # The engine's ℓ below the trainer's by up to 1: TIS weights up to e, some past the cap of 2.
        t.logprobs = t.logprobs - np.abs(np.sin(np.arange(t.T, dtype=np.float32) + i))
    cfg = ObjectiveConfig(old_logprobs=old_logprobs, kl_coef=kl_coef)
    totals = {"tokens": float(sum(t.T for t in tasks))}
    kl = kl_coef > 0

    loss, whole = local_loss(objective_batch(model, model, tasks, cpu, "tempered", kl), cfg, totals, 1, openclawrl_loss)
    one_shot = _param_grads(model, loss)
    plan = micro_batches(tasks, 30)  # lengths 15, 14, 16, 12
    assert plan == [[2], [0, 1], [3]], plan
    model.zero_grad(set_to_none=True)
    parts = []
    for mb in plan:
        part, sums = local_loss(objective_batch(model, model, [tasks[i] for i in mb], cpu, "tempered", kl), cfg,
                                totals, 1, openclawrl_loss)
        part.backward()
        parts.append(sums)
    accumulated = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    assert torch.allclose(accumulated, one_shot, atol=1e-6, rtol=1e-5), (accumulated - one_shot).abs().max()
    assert one_shot.norm() > 1e-3
    got, want = combine([add_sums(parts)], cfg), combine([whole], cfg)
    for key in ("loss", "rl_loss", "opd_loss", "kl", "rl_clip_frac", "opd_clip_frac", "mean_abs_d", "chosen_overlap",
                "tis_weight_mean", "tis_clip_frac", "tokens", "train_rollout_logprob_abs_diff",
                "train_rollout_logprob_abs_diff_max"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    if old_logprobs == "trainer":
        assert 0 < want["tis_clip_frac"] < 1 and want["kl"] == pytest.approx(0.0, abs=1e-6)


def test_the_kl_term_is_the_exact_kl_to_the_base_model_on_the_plain_prompt(model) -> None:
    from reef_shim.trainer.scoring import objective_batch, policy_logprobs, reference_logprobs

    cpu = torch.device("cpu")
    tasks = _self_scored_tasks(model, 0.7, [(6, 5), (3, 8)])
    # The base: the same architecture with other weights; the policy stays `model`.
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model.config.name_or_path, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in base.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ref = reference_logprobs(base, tasks, cpu, "tempered")
    _, _, kl = policy_logprobs(model, tasks, cpu, "tempered", ref)
    for b, task in enumerate(tasks):
        with torch.no_grad():
            lp = torch.log_softmax(response_logits(model, [task.prompt_ids], [task.response_ids], cpu)[0] / 0.7, -1)
            lq = torch.log_softmax(response_logits(base, [task.prompt_ids], [task.response_ids], cpu)[0] / 0.7, -1)
        want = torch.nn.functional.kl_div(lq, lp, log_target=True, reduction="none").sum(-1)  # KL(p ‖ q)
        assert torch.allclose(kl[b, :task.T], want, atol=1e-5), b
        assert (kl[b, task.T:] == 0).all()
    assert kl.min() >= -1e-6 and kl.max() > 1e-3
    # Against itself the KL is 0; and without it no reference forward runs (one forward per
    # candidate chunk and one of the policy: 2 here, 3 with the KL).
    calls: list[int] = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        b0 = objective_batch(model, model, tasks, cpu, "tempered")
        assert "kl" not in b0 and len(calls) == 2
        b1 = objective_batch(model, model, tasks, cpu, "tempered", kl=True)
        assert len(calls) == 5 and b1["kl"].abs().max() < 1e-5
    finally:
        hook.remove()


def _objective_batch(seed: int, B: int = 4, T: int = 5, K: int = 3, H: int = 2) -> dict[str, torch.Tensor]:
    """Random objective tensors with ragged masks (mixed lengths), ratios and differences on both
    sides of every clip, one sample without a teacher candidate."""
    g = torch.Generator().manual_seed(seed)
    u = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)  # noqa: E731
    old = -0.2 - 2 * u(B, T)
    topk_old = torch.log_softmax(u(B, T, K + 1) * 3, dim=-1)[..., :K]
    lengths = [5, 2, 4, 1]
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths], dtype=torch.float64)
    return {
        "logp_new": old + (u(B, T) - 0.5),
        "logp_old": old,
        "mask": mask,
        "reward": torch.tensor([1.0, -1.0, 0.5, 1.0], dtype=torch.float64),
        "topk_ids": torch.stack([torch.randperm(8, generator=g)[:K] for _ in range(B * T)]).reshape(B, T, K),
        "topk_logp_old": topk_old,
        "topk_logp_new": topk_old + (u(B, T, K) - 0.5),
        "teacher_topk_logp": topk_old[:, None] + 3 * (u(B, H, T, K) - 0.5),
        "teacher_top_ids": torch.randint(0, 8, (B, H, T, K), generator=g),
        "cand_mask": torch.tensor([[True, True], [False, False], [True, False], [False, True]]),
    }


@pytest.mark.parametrize("old_logprobs", ["engine", "trainer"])
def test_ranks_weighted_by_their_tokens_give_the_gradient_of_the_whole_batch(old_logprobs: str) -> None:
    # FSDP2 averages the ranks' gradients; each rank's loss is weighted by its share of the batch's
    # tokens times the world size, so the average is the gradient of the global means. The shards
    # hold 5 + 2 and 4 + 1 tokens (unequal), and only one of them a sample without a teacher.
    from recipes.openclawrl.objective import openclawrl_loss
    from reef_shim.trainer.loss import local_loss

    full = _objective_batch(0)
    cfg = ObjectiveConfig(w_rl=0.7, w_opd=1.3, old_logprobs=old_logprobs)
    leaves = {k: full[k].clone().requires_grad_() for k in ("logp_new", "topk_logp_new")}
    whole, m_whole = openclawrl_loss({**full, **leaves}, cfg)
    whole.backward()
    if old_logprobs == "engine":
        assert m_whole["rl_clip_frac"] > 0 and m_whole["opd_clip_frac"] > 0  # both clips take part
    else:
        assert m_whole["tis_weight_mean"] != 1.0  # the importance weights take part

    totals = {"tokens": float(full["mask"].sum())}
    grads = {k: torch.zeros_like(full[k]) for k in leaves}
    sums = []
    for rows in ([0, 1], [2, 3]):
        part = {k: v[rows] for k, v in full.items()}
        part_leaves = {k: part[k].clone().requires_grad_() for k in leaves}
        loss, s = local_loss({**part, **part_leaves}, cfg, totals, 2, openclawrl_loss)
        loss.backward()
        for k in leaves:
            grads[k][rows] += part_leaves[k].grad / 2  # what FSDP2's average makes of it
        sums.append(s)
    for k in leaves:
        assert torch.allclose(grads[k], leaves[k].grad, atol=1e-12), k
    combined = combine(sums, cfg)
    for key in ("loss", "rl_loss", "opd_loss", "rl_clip_frac", "opd_clip_frac", "mean_abs_d", "chosen_overlap",
                "tis_weight_mean", "tis_clip_frac"):
        assert combined[key] == pytest.approx(m_whole[key], abs=1e-12), key


def _group_holding(tmp_path: Path, version: str, entries: dict[str, tuple[str, str | None]]) -> TrainerGroup:
    """A group (no ranks: not started) holding `version`, its ledger `{batchId: (weightVersion, parent)}`."""
    group = TrainerGroup(driver=None)
    group._ledger = Ledger(tmp_path)
    for batch_id, (v, parent) in entries.items():
        entry = {"batchId": batch_id, "weightVersion": v, "checkpointPath": str(tmp_path / v), "metrics": {}, "stepMs": 1.0}
        group._ledger.record(batch_id, entry if parent is None else {**entry, "parent": parent})
    group._version = version
    return group


@pytest.mark.parametrize("holds", ["v2", "v3", "v4"])
def test_the_ledger_answers_a_batch_whose_weights_the_group_holds_or_descends_from(tmp_path: Path, holds: str) -> None:
    # b:3 trained v3 from v2: a retry on v2 (its release never committed), or a replay on v3 or on
    # v4, trained from v3, which both hold its training already.
    group = _group_holding(tmp_path, holds, {"b:1": ("v1", "v0"), "b:2": ("v2", "v1"), "b:3": ("v3", "v2"),
                                             "b:4": ("v4", "v3")})
    out = group.step("b:3", [])
    assert out["trained"] is False and out["weightVersion"] == "v3" and "parent" not in out


@pytest.mark.parametrize("holds", ["v1", "v0"])
def test_a_batch_trained_from_weights_a_rollback_put_aside_trains_again_on_the_weights_held(tmp_path: Path,
                                                                                          holds: str) -> None:
    # b:3 trained v3 from v2; its publish failed and a rollback loaded v1 (or the base) before the
    # retry. Answered from the ledger, the controller loaded v3 and released it as the rollback's
    # child: the rollback undone, unseen. The step goes on to train it (here: no ranks to train on).
    group = _group_holding(tmp_path, holds, {"b:1": ("v1", "v0"), "b:2": ("v2", "v1"), "b:3": ("v3", "v2")})
    with pytest.raises(ShimError, match="not started"):
        group.step("b:3", [])


def _raw_task(task_id: str, reward: float = 1.0, hints: int = 1) -> dict[str, Any]:
    return {"taskId": task_id, "reward": reward, "weightVersion": "v0", "promptIds": b"\x01\x00\x00\x00",
            "responseIds": b"\x02\x00\x00\x00", "teacherPromptIds": [b"\x03\x00\x00\x00" * (i + 1) for i in range(hints)]}


def test_a_batch_fingerprint_is_of_its_content_in_any_order() -> None:
    from reef_shim.trainer.checkpoint import batch_fingerprint

    a, b = _raw_task("r1"), _raw_task("r2", reward=-1.0)
    assert batch_fingerprint([a, b]) == batch_fingerprint([b, a])
    others = [[a], [a, _raw_task("r3")], [a, {**b, "reward": 1.0}], [a, _raw_task("r2", reward=-1.0, hints=2)],
              [a, {**b, "weightVersion": "v1"}], [a, {**b, "responseIds": b"\x05\x00\x00\x00"}]]
    assert len({batch_fingerprint([a, b]), *(batch_fingerprint(o) for o in others)}) == 1 + len(others)


def test_a_batch_id_trained_on_other_tasks_is_a_conflict_not_an_answer(tmp_path: Path) -> None:
    # After a power loss the store's state is a prefix of what it acknowledged while the ledger,
    # fsynced, is ahead: the controller forms b:3 again from other turns. Answered "already
    # trained", the new turns were counted and never trained.
    from reef_shim.trainer.checkpoint import batch_fingerprint

    group = _group_holding(tmp_path, "v2", {"b:1": ("v1", "v0"), "b:2": ("v2", "v1")})
    entry = {"batchId": "b:3", "weightVersion": "v3", "checkpointPath": str(tmp_path / "v3"), "metrics": {}, "stepMs": 1.0,
             "parent": "v2", "fingerprint": batch_fingerprint([_raw_task("r1"), _raw_task("r2")])}
    group._ledger.record("b:3", entry)
    with pytest.raises(ShimError, match="b:3 was trained before, as v3, on other tasks") as e:
        group.step("b:3", [_raw_task("r1"), _raw_task("r9")])
    assert e.value.code == "REEF_ERR_CONFLICT" and e.value.retryable is False
    # The same tasks are a retry, answered from the ledger, without the fingerprint.
    out = group.step("b:3", [_raw_task("r2"), _raw_task("r1")])
    assert out["trained"] is False and out["weightVersion"] == "v3" and "fingerprint" not in out


def test_a_ledger_entry_written_without_its_parent_still_answers(tmp_path: Path) -> None:
    group = _group_holding(tmp_path, "v1", {"b:3": ("v3", None)})
    assert group.step("b:3", [])["trained"] is False


def test_a_batch_recorded_again_is_the_ledger_s_newest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from reef_shim.trainer import checkpoint

    monkeypatch.setattr(checkpoint, "LEDGER_KEEP", 2)
    ledger = Ledger(tmp_path)
    for batch_id, v in [("b:1", "v1"), ("b:2", "v2"), ("b:1", "v3"), ("b:3", "v4")]:
        (tmp_path / v).mkdir()
        ledger.record(batch_id, {"weightVersion": v})
    assert Ledger(tmp_path).batches == {"b:1": {"weightVersion": "v3"}, "b:3": {"weightVersion": "v4"}}
    # b:1's first training (v1) was never released: a rollback came first, and it trained again.
    # Left, it held a model's size of disk for good. v2 is b:2's, only past LEDGER_KEEP: kept.
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["v2", "v3", "v4"]


@pytest.mark.parametrize("engine_node, refused", [("node-b", True), ("node-a", False), (None, False)])
def test_a_loopback_group_pushes_only_into_an_engine_on_its_node(tmp_path: Path, engine_node: str | None,
                                                                 refused: bool) -> None:
    # The ranks' rendezvous is on 127.0.0.1 when every bundle was on one node at trainer-start; an
    # engine placed on another node afterwards could not reach it, and would wait out the push.
    from types import SimpleNamespace

    ours = {("reef-trainer", 0): "node-a"}
    driver = SimpleNamespace(colocated=False, engine_node=lambda url: engine_node,
                             bundle_node=lambda group, index: ours.get((group, index)))
    group = _group_holding(tmp_path, "v1", {})
    group.driver, group._spec, group._loopback = driver, {"group": "reef-trainer"}, True
    pushed = SimpleNamespace(remote=lambda *args: {"error": None, "bytes": 1, "backend": "gloo", "seconds": 0.0})
    group._ranks = [SimpleNamespace(push_weights=pushed)]
    group._gather = lambda refs, what, deadline: refs  # type: ignore[method-assign]
    if not refused:
        assert group.push_weights("http://127.0.0.1:30000", "v1")["backend"] == "gloo"
        return
    with pytest.raises(ShimError) as err:
        group.push_weights("http://127.0.0.1:30000", "v1")
    assert err.value.code == "REEF_ERR_WEIGHT_SYNC"
    assert "node-b" in err.value.message and "trainer-start" in err.value.message
