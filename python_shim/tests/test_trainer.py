"""The trainer group for real: Ray with logical GPUs, 2 gloo ranks, FSDP2, the tiny model.

Tasks come from real generations of the hf engine (sampled at temperature 0.8 / top_p 0.9, greedy,
and top_k 2 < K: trainer_fixtures.three_tasks). One module-scoped Ray head and placement.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from reef_shim import tiny_model
from reef_shim.engines.hf_engine import HFEngine
from reef_shim.dist_net import LOOPBACK_ENV
from reef_shim.errors import ShimError
from reef_shim.ray_driver import RayDriver
from reef_shim.trainer import TrainerGroup
from reef_shim.trainer.checkpoint import LEDGER
from reef_shim.trainer import group as group_module
from reef_shim.trainer.group import _Deadline
from listeners import listening, not_loopback, refused_from_lan
from trainer_fixtures import (check_bf16_step, check_push_serves_its_checkpoint, generate, i32, params_differ,
                              placed_driver, probe, reference_step, spec, three_tasks)

LAYOUT = {"trainer": {"gpus": 2}, "rollout": {"gpus": 1}, "prm": {"gpus": 1, "replicas": 0}, "student": None,
          "cpusPerBundle": 1, "colocate": False}
LR = 1e-3  # large enough that one step visibly changes the engine's outputs


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    tiny_model.build(out, seed=0, quiet=True)
    return out


@pytest.fixture(scope="module")
def engine(model: Path) -> HFEngine:
    return HFEngine(str(model), weight_version="v0", seed=3)


@pytest.fixture(scope="module")
def tasks(engine: HFEngine) -> list[dict[str, Any]]:
    return three_tasks(engine)


@pytest.fixture(scope="module")
def driver() -> Iterator[RayDriver]:
    # The ranks' env comes from the Ray head this starts: CPU ranks also on a machine with a GPU,
    # where the logical GPUs Ray hands out would otherwise put some ranks on it and some not.
    with placed_driver(LAYOUT, 4, 3, REEF_TRAINER_DEVICE="cpu") as d:
        yield d


def context_length(model: Path) -> int:
    return json.loads((model / "config.json").read_text())["max_position_embeddings"]


def test_one_step_matches_the_engine_then_trains(driver: RayDriver, model: Path, engine: HFEngine,
                                                 tasks: list[dict[str, Any]], tmp_path: Path) -> None:
    group = TrainerGroup(driver)
    ckpt = tmp_path / "ckpt"
    started = group.start(spec(str(model), str(ckpt), lr=LR))
    try:
        assert started["worldSize"] == 2 and started["device"] == "cpu" and started["weightVersion"] == "v0"
        assert len(set(started["pids"])) == 2
        out = group.step("s:openclawrl:1", tasks)
        # A hint that pushes a teacher prompt past the context length costs that candidate, not the batch.
        hinted = next(t for t in tasks if t["teacherPromptIds"])
        too_long = i32([1] * int(context_length(model)))
        second = group.step("s:openclawrl:2", [{**hinted, "teacherPromptIds": [*hinted["teacherPromptIds"], too_long]}])
    finally:
        group.stop()
    assert second["trained"] is True and second["metrics"]["teacher_candidates_overlong"] == 1
    assert second["metrics"]["samples_with_teacher"] == 1
    m = out["metrics"]
    assert m["teacher_candidates_overlong"] == 0
    assert out["trained"] is True and out["weightVersion"] == "v1"
    # ℓθ before the update reproduces the engine's recorded logprobs (same transform, fp32).
    assert m["train_rollout_logprob_abs_diff"] < 1e-3, m
    assert m["train_rollout_logprob_abs_diff_max"] < 1e-2, m
    assert all(torch.isfinite(torch.tensor(v)) for v in m.values())
    assert m["tokens"] == 72 and m["opd_tokens"] == 48 and m["samples"] == 3 and m["samples_with_teacher"] == 2

    # The 2-rank loss and gradient equal one process on the whole batch: the global means hold.
    loss, norm = reference_step(model, tasks, LR)
    assert m["loss"] == pytest.approx(loss, rel=1e-4, abs=1e-6)
    assert m["grad_norm"] == pytest.approx(norm, rel=1e-3)

    # A complete HF checkpoint with changed weights, which the engine loads and serves.
    path = Path(out["checkpointPath"])
    assert path == ckpt / "v1"
    assert {"model.safetensors", "config.json", "tokenizer.json", "reef_checkpoint.json"} <= {p.name for p in path.iterdir()}
    assert json.loads((path / "reef_checkpoint.json").read_text())["batchId"] == "s:openclawrl:1"
    assert len(params_differ(model, path)) > 10
    prompt = list(torch.frombuffer(bytearray(tasks[1]["promptIds"]), dtype=torch.int32).tolist())
    before = generate(engine, prompt, 0.0, 1.0, -1, 4, seed=1)
    engine.update_weights_from_disk(str(path), "v1")
    try:
        after = generate(engine, prompt, 0.0, 1.0, -1, 4, seed=1)
        assert engine.weight_version == "v1"
        assert [e[0] for e in after.token_logprobs] != [e[0] for e in before.token_logprobs]
    finally:
        engine.update_weights_from_disk(str(model), "v0")


def test_a_rank_killed_mid_step_fails_retryably_and_the_retry_trains_once(
        driver: RayDriver, model: Path, tasks: list[dict[str, Any]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = tmp_path / "ckpt"
    hook = {"rank": 1, "batchId": "s:openclawrl:2", "marker": str(tmp_path / "crashed")}
    monkeypatch.setenv("REEF_TRAINER_TEST_CRASH", json.dumps(hook))
    group = TrainerGroup(driver)
    try:
        group.start(spec(str(model), str(ckpt), lr=LR))
        first = group.step("s:openclawrl:1", tasks[:2])
        with pytest.raises(ShimError) as failed:
            group.step("s:openclawrl:2", tasks[2:])  # one task for two ranks: rank 1 runs the dummy pass
        assert failed.value.code == "REEF_ERR_TRAINER_RANK" and failed.value.retryable
        assert "rank 1" in failed.value.message
        assert (tmp_path / "crashed").exists() and not (ckpt / "v2").exists()
        with pytest.raises(ShimError) as broken:
            group.step("s:openclawrl:2", tasks[2:])
        assert broken.value.code == "REEF_ERR_TRAINER_RANK"

        # What the trainer-controller does: restart from the last release, retry the batch.
        assert group.start(spec(str(model), str(ckpt), lr=LR))["weightVersion"] == "v0"
        assert group.load(first["checkpointPath"]) == {"weightVersion": "v1"}
        retried = group.step("s:openclawrl:2", tasks[2:])
        again = group.step("s:openclawrl:2", tasks[2:])
        replayed = group.step("s:openclawrl:1", tasks[:2])
        # Batch 3 trained from v2, its release not published, and a rollback to v1 before the
        # retry: answered from the ledger, v3 went out as the rollback's child, undoing it.
        third = group.step("s:openclawrl:3", tasks[:1])
        group.load(first["checkpointPath"])
        rolled = group.step("s:openclawrl:3", tasks[:1])
    finally:
        group.stop()
    assert third["trained"] is True and third["weightVersion"] == "v3"
    assert rolled["trained"] is True and rolled["weightVersion"] == "v4"
    assert json.loads((ckpt / "v4" / "reef_checkpoint.json").read_text())["parent"] == "v1"
    assert retried["trained"] is True and retried["weightVersion"] == "v2"
    # Trained from v1, not from the base the tasks were generated with.
    assert retried["metrics"]["train_rollout_logprob_abs_diff"] > 1e-3
    assert again["trained"] is False and again["weightVersion"] == "v2" and again["metrics"] == retried["metrics"]
    assert replayed["trained"] is False and replayed["weightVersion"] == "v1"
    ledger = json.loads((ckpt / LEDGER).read_text())["batches"]
    assert sorted(ledger) == ["s:openclawrl:1", "s:openclawrl:2", "s:openclawrl:3"]
    assert ledger["s:openclawrl:3"]["weightVersion"] == "v4"
    # v3, batch 3's first training, put aside by the rollback and never released, is gone.
    assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".")) == [LEDGER, "v1", "v2", "v4"]


def test_a_rank_that_raises_mid_step_fails_the_batch_not_retryably(
        driver: RayDriver, model: Path, tasks: list[dict[str, Any]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A rank alive and raising (out of memory on this batch) raises again on a fresh group: as
    # REEF_ERR_TRAINER_RANK the controller retried it, and then the tick, for good, and training
    # stalled behind it; as REEF_ERR_TRAINER it dead-letters the batch after its attempts.
    ckpt = tmp_path / "ckpt"
    hook = {"rank": 1, "batchId": "s:openclawrl:1", "marker": str(tmp_path / "raised"), "raise": True}
    monkeypatch.setenv("REEF_TRAINER_TEST_CRASH", json.dumps(hook))
    group = TrainerGroup(driver)
    try:
        group.start(spec(str(model), str(ckpt), lr=LR))
        with pytest.raises(ShimError) as failed:
            group.step("s:openclawrl:1", tasks[:2])
        assert failed.value.code == "REEF_ERR_TRAINER" and not failed.value.retryable
        assert "trainer rank 1 raised during trainer-step s:openclawrl:1" in failed.value.message
        assert "out of memory (test hook)" in failed.value.message
        assert (tmp_path / "raised").exists() and not (ckpt / "v1").exists()
        # Its peer was left in a collective: the group was stopped, and a fresh one trains.
        with pytest.raises(ShimError) as broken:
            group.step("s:openclawrl:1", tasks[:2])
        assert broken.value.code == "REEF_ERR_TRAINER_RANK"
        group.start(spec(str(model), str(ckpt), lr=LR))
        assert group.step("s:openclawrl:1", tasks[:2])["weightVersion"] == "v1"
    finally:
        group.stop()


def test_a_step_whose_checkpoint_cannot_be_written_is_retried_on_a_fresh_group(
        driver: RayDriver, model: Path, tasks: list[dict[str, Any]], tmp_path: Path) -> None:
    # A full disk is not the batch's fault: answered REEF_ERR_TRAINER, the controller dead-lettered
    # every batch while the disk stayed full. The ranks have stepped, so they must not train on.
    ckpt = tmp_path / "ckpt"
    group = TrainerGroup(driver)
    try:
        group.start(spec(str(model), str(ckpt), lr=LR))
        shutil.rmtree(ckpt)
        ckpt.write_text("not a directory")  # rank 0's save fails on the filesystem
        with pytest.raises(ShimError) as failed:
            group.step("s:openclawrl:1", tasks[:2])
        assert failed.value.code == "REEF_ERR_TRAINER_RANK" and failed.value.retryable, failed.value.message
        assert "trained, but the checkpoint" in failed.value.message and "could not be saved" in failed.value.message
        with pytest.raises(ShimError) as broken:
            group.step("s:openclawrl:1", tasks[:2])
        assert broken.value.code == "REEF_ERR_TRAINER_RANK" and "send trainer-start again" in broken.value.message
        ckpt.unlink()
        group.start(spec(str(model), str(ckpt), lr=LR))
        out = group.step("s:openclawrl:1", tasks[:2])
    finally:
        group.stop()
    assert out["trained"] is True and out["weightVersion"] == "v1" and (ckpt / "v1" / "model.safetensors").is_file()


def test_a_wait_on_the_ranks_ends_at_its_deadline_however_much_budget_it_had(driver: RayDriver) -> None:
    # trainer-start's phases share one deadline (the bridge client's timeout covers one budget,
    # not one per phase): a phase that starts after the budget is spent fails at once rather
    # than waiting out the budget anew, which here would hang the test.
    import ray

    @ray.remote(num_cpus=0)
    def never() -> None:
        time.sleep(3600)

    ref = never.remote()
    try:
        with pytest.raises(ShimError, match="trainer rank 0 failed: setup: no answer within 1000 s"):
            TrainerGroup(driver)._gather([ref], "setup", _Deadline(1000, since=time.monotonic() - 1001))
    finally:
        ray.cancel(ref, force=True)


def test_a_trained_step_pushed_into_a_running_engine_serves_what_its_checkpoint_serves(
        driver: RayDriver, model: Path, tasks: list[dict[str, Any]], tmp_path: Path) -> None:
    from test_hf_server import launch

    body = probe(tasks)
    group = TrainerGroup(driver)
    with launch(model, tmp_path / "engine.log", "--weight-version", "v0", "--weight-sync-timeout-s", "60") as eng:
        try:
            group.start(spec(str(model), str(tmp_path / "ckpt"), lr=LR))
            base = eng.generate(**body)
            with pytest.raises(ShimError) as unknown:
                group.push_weights(eng.url, "v1")  # the ranks still hold v0
            assert unknown.value.code == "REEF_ERR_INVALID_ARGUMENT" and "holds v0" in unknown.value.message
            step = group.step("s:openclawrl:1", tasks)
            pushed = group.push_weights(eng.url, "v1")
            served = eng.generate(**body)
            # An engine that is not there: a retryable sync error, and the group stays usable.
            with pytest.raises(ShimError) as gone:
                group.push_weights("http://127.0.0.1:9", "v1")
            assert gone.value.code == "REEF_ERR_WEIGHT_SYNC" and gone.value.retryable
            # An engine whose environment runs another torch is refused before any group forms.
            from reef_shim.stack_versions import stack_versions

            other = {**stack_versions(), "torch": "2.0.0"}
            with pytest.raises(ShimError) as built:
                group.push_weights(eng.url, "v1", other)
            assert built.value.code == "REEF_ERR_WEIGHT_SYNC" and "2.0.0 in the engine's environment" in built.value.message
            again = group.push_weights(eng.url, "v1", stack_versions())
        finally:
            group.stop()
        assert pushed["weightVersion"] == "v1" and pushed["backend"] == "gloo"
        assert again["bytes"] == pushed["bytes"]
        assert served["output_ids"] != base["output_ids"] or (
            served["meta_info"]["output_token_logprobs"] != base["meta_info"]["output_token_logprobs"])
        check_push_serves_its_checkpoint(eng, body, pushed, served, step["checkpointPath"])


class _Listeners(threading.Thread):
    """What `pids` listen on, sampled until stopped: a push's group lives only as long as the push."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids, self.seen, self.done = pids, set(), threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.seen.update(listening(self.pids))
            time.sleep(0.005)

    def stop(self) -> set[tuple[int, str, int]]:
        self.done.set()
        self.join(10)
        return self.seen


def test_on_one_node_the_groups_and_the_push_listen_on_loopback_alone(
        driver: RayDriver, model: Path, tasks: list[dict[str, Any]], tmp_path: Path) -> None:
    # Review M5: the ranks' store listened on `::`, gloo on the host name's address, and the push's
    # store on `::` too, all without authentication, so a host on the LAN could join either group.
    import ray

    from test_hf_server import launch

    assert driver.single_node()
    group = TrainerGroup(driver)
    # As the driver launches an engine on one node (RayDriver.start_engine); the engine is not ours to test here.
    with launch(model, tmp_path / "engine.log", "--weight-version", "v0", "--weight-sync-timeout-s", "60",
                env_extra=dict(LOOPBACK_ENV)) as eng:
        try:
            started = group.start(spec(str(model), str(tmp_path / "ckpt"), lr=LR))
            pids = started["pids"]
            held = listening(pids)
            assert held and not_loopback(held) == [], held
            for _, _, port in (f for f in held if f[0] == pids[0]):
                assert refused_from_lan(port) in (True, None)
            envs = ray.get([r.__ray_call__.remote(lambda rank: {k: os.environ.get(k) for k in LOOPBACK_ENV})
                            for r in group._ranks])
            assert envs == [LOOPBACK_ENV] * len(pids)
            group.step("s:openclawrl:1", tasks)
            sampler = _Listeners([*pids, eng.proc.pid])
            sampler.start()
            try:
                pushed = group.push_weights(eng.url, "v1")
            finally:
                seen = sampler.stop()
        finally:
            group.stop()
    assert pushed["backend"] == "gloo"
    opened = {f for f in seen if f not in held and f[0] == pids[0]}
    assert opened, "no listener of the push's group was seen on rank 0"
    assert not_loopback(sorted(seen)) == []


def test_a_bf16_group_trains_over_fp32_master_weights(driver: RayDriver, model: Path, tasks: list[dict[str, Any]],
                                                      tmp_path: Path) -> None:
    group = TrainerGroup(driver)
    try:
        group.start(spec(str(model), str(tmp_path / "ckpt"), lr=LR, dtype="bf16"))
        out = group.step("s:openclawrl:1", tasks)
    finally:
        group.stop()
    check_bf16_step(out, model, tasks, LR)


def test_start_and_load_refuse_what_they_cannot_use(driver: RayDriver, model: Path, tmp_path: Path) -> None:
    group = TrainerGroup(driver)
    with pytest.raises(ShimError, match="not started"):
        group.load(str(model))
    with pytest.raises(ShimError, match="do not fit the 2 bundle"):
        group.start(spec(str(model), str(tmp_path), ranks=3))
    with pytest.raises(ShimError, match="'tp' is not implemented"):
        group.start({**spec(str(model), str(tmp_path)), "backend": "tp"})
    with pytest.raises(ShimError, match="hint_selection"):
        group.start(spec(str(model), str(tmp_path), hintSelection="best"))
    assert group.stop() == {}


def test_a_checkpoint_cut_short_or_missing_a_tensor_fails_the_load_and_the_group_trains_on(
        driver: RayDriver, model: Path, tasks: list[dict[str, Any]], tmp_path: Path) -> None:
    # Regression: the ranks' own check of the tensors (names, shapes, a readable file) raised
    # inside every rank; the driver took that for dead ranks, killed the group and answered the
    # retryable REEF_ERR_TRAINER_RANK, so a rollback to a bad checkpoint took the trainer down
    # and each restart from it did again.
    from safetensors.torch import load_file, save_file

    cut = tmp_path / "cut"
    shutil.copytree(model, cut)
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])  # a copy that stopped halfway
    short = tmp_path / "short"
    shutil.copytree(model, short)
    state = load_file(str(short / "model.safetensors"))
    dropped = sorted(state)[-1]
    save_file({k: v for k, v in state.items() if k != dropped}, str(short / "model.safetensors"))
    group = TrainerGroup(driver)
    try:
        group.start(spec(str(model), str(tmp_path / "ckpt"), lr=LR))
        for path, names in ((cut, "model.safetensors"), (short, dropped)):
            with pytest.raises(ShimError) as bad:
                group.load(str(path))
            assert bad.value.code == "REEF_ERR_INVALID_ARGUMENT" and not bad.value.retryable, bad.value.message
            assert names in bad.value.message and str(path) in bad.value.message
        out = group.step("s:openclawrl:1", tasks)  # the same ranks, on the weights they held
    finally:
        group.stop()
    assert out["trained"] is True and out["weightVersion"] == "v1"
    assert out["metrics"]["train_rollout_logprob_abs_diff"] < 1e-3


def test_a_rank_that_hangs_mid_step_is_given_up_on_and_a_new_group_starts_in_its_bundles(
        driver: RayDriver, model: Path, tasks: list[dict[str, Any]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: a step had no deadline on the driver. A rank hung before a collective left its
    # peers waiting out the process group's 10 minutes, as long as the bridge client waits for
    # trainer-step, so the controller gave up first and its trainer-start queued behind the step;
    # a rank hung outside a collective (rank 0 saving to a stuck disk) held the shim's worker for good.
    ckpt = tmp_path / "ckpt"
    hook = {"rank": 1, "batchId": "s:openclawrl:1", "marker": str(tmp_path / "hung"), "hangS": 3600}
    monkeypatch.setenv("REEF_TRAINER_TEST_CRASH", json.dumps(hook))
    monkeypatch.setattr(group_module, "STEP_TIMEOUT_S", 8.0)  # rank 1 never answers: any deadline is passed
    group = TrainerGroup(driver)
    try:
        group.start(spec(str(model), str(ckpt), lr=LR))
        with pytest.raises(ShimError) as hung:
            group.step("s:openclawrl:1", tasks)
        assert hung.value.code == "REEF_ERR_TRAINER_RANK" and hung.value.retryable
        assert "no answer within 8 s" in hung.value.message and "rank(s) 0, 1 had not answered" in hung.value.message
        assert (tmp_path / "hung").exists()
        assert not (ckpt / "v1").exists()
        # The hung rank was killed, not left holding its bundle or the group's port.
        monkeypatch.undo()  # the retry under the real deadline: a busy machine may take 30 s for it
        group.start(spec(str(model), str(ckpt), lr=LR))
        retried = group.step("s:openclawrl:1", tasks)
    finally:
        group.stop()
    assert retried["trained"] is True and retried["weightVersion"] == "v1"


def test_a_start_replaces_a_running_group_in_its_bundles_and_calls_after_stop_are_refused(
        driver: RayDriver, model: Path, tasks: list[dict[str, Any]], tmp_path: Path) -> None:
    group = TrainerGroup(driver)
    try:
        first = group.start(spec(str(model), str(tmp_path / "ckpt"), lr=LR))
        # No trainer-stop between: each bundle has room for one rank, so the second group places
        # only once the first one's ranks are gone.
        second = group.start(spec(str(model), str(tmp_path / "ckpt"), lr=LR))
        out = group.step("s:openclawrl:1", tasks[:1])
    finally:
        group.stop()
    assert set(first["pids"]).isdisjoint(second["pids"]) and out["trained"] is True
    for call in (lambda: group.step("s:openclawrl:2", tasks[:1]), lambda: group.load(out["checkpointPath"]),
                 lambda: group.push_weights("http://127.0.0.1:9", out["weightVersion"])):
        with pytest.raises(ShimError) as stopped:
            call()
        assert stopped.value.code == "REEF_ERR_TRAINER" and "not started" in stopped.value.message
    assert group.stop() == {}
