"""The trainer group as the shim's worker thread sees it: start, step, load, stop.

The driver side holds no model. It checks requests, splits the batch, runs one call per rank and
waits for all of them while watching for a dead rank: the first failure kills every rank (the
survivors would block in a collective for minutes) and fails the call with the retryable
REEF_ERR_TRAINER_RANK; the caller then sends trainer-start, trainer-load and the same batch again.
Steps are idempotent by batch id through the ledger in the checkpoint directory.

With `spec.adapter` (adapters.py) each step names its scenario and trains that scenario's LoRA
adapter; the weight versions stay one sequence over every scenario (one ledger), and each scenario
descends from its own last version, `v0` (the base) for a scenario not trained yet.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from ..errors import ShimError
from .checkpoint import Ledger, batch_fingerprint, checkpoint_version, next_version
from .tasks import decode_tasks, shard

log = logging.getLogger("reef_shim.trainer")

BASE_VERSION = "v0"  # the base model's weights, before any step
SETUP_TIMEOUT_S = 600.0
PUSH_TIMEOUT_S = 300.0  # rank 0 gives up on the engine after this; the ranks are waited on a minute longer
# A step's ranks are given up on (killed: REEF_ERR_TRAINER_RANK) after this: the bridge client's
# trainer-step timeout (600 s, bridge/client.ts) less a minute, so the answer arrives before the
# client stops waiting. Without it a hung rank held the shim's worker until the process group's
# own timeout (10 min, as long as the client waits) or, hung outside a collective, for good.
STEP_TIMEOUT_S = 540.0
CRASH_HOOK_ENV = "REEF_TRAINER_TEST_CRASH"


class _Deadline:
    """When a wait on the ranks gives up: `budget_s` after `since` (monotonic; default now)."""

    def __init__(self, budget_s: float, since: float | None = None) -> None:
        self.budget_s = budget_s
        self.at = (time.monotonic() if since is None else since) + budget_s


def _objective_config(options: dict[str, Any]) -> Any:
    from .rank import objective_from_options

    return objective_from_options(options)


def check_devices(devices: list[str]) -> str | None:
    """Why the ranks cannot form one group, or None: all of them must be on CUDA or all on the CPU."""
    if len({d.split(":")[0] for d in devices}) <= 1:
        return None
    from .rank import DEVICE_ENV  # the variable each rank reads

    each = ", ".join(f"rank {i} {d}" for i, d in enumerate(devices))
    return (f"trainer: the ranks are on different devices ({each}). A rank trains on CUDA when it sees a GPU: "
            f"check the GPUs Ray gave each bundle (CUDA_VISIBLE_DEVICES), or set {DEVICE_ENV}=cpu or cuda")


class TrainerGroup:
    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self._ranks: list[Any] = []
        self._spec: dict[str, Any] | None = None
        self._info: dict[str, Any] = {}
        self._cfg: Any = None
        self._ledger: Ledger | None = None
        self._dir = Path(".")
        self._version = BASE_VERSION
        self._broken: str | None = None
        self._loopback = False  # the ranks' groups listen on 127.0.0.1 alone (rank.py, dist_net)
        self._adapter: dict[str, Any] | None = None  # the checked adapter spec, when adapters are on
        self._scenario_versions: dict[str, str] = {}  # with adapters: each scenario's version held

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, spec: dict[str, Any]) -> dict[str, Any]:
        if spec["backend"] != "fsdp2":
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"trainer-start.spec.backend {spec['backend']!r} is not "
                            "implemented; use 'fsdp2' (docs/training.md says why)")
        if spec["group"] != "reef-trainer":
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"trainer-start.spec.group: expected 'reef-trainer', got {spec['group']!r}")
        if not (Path(spec["modelPath"]) / "config.json").is_file():
            raise ShimError("REEF_ERR_NOT_FOUND", f"model {spec['modelPath']} (its config.json) not found")
        cfg = _objective_config(spec["options"])  # invalid options fail here, before any process starts
        adapter = _adapter_spec(spec)
        pg, planned = self.driver.placement_group(spec["group"])
        bundles = planned["bundles"]
        if not 1 <= spec["ranks"] <= len(bundles):
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"trainer-start.spec.ranks: {spec['ranks']} rank(s) do not fit "
                            f"the {len(bundles)} bundle(s) of {spec['group']}")
        if self._ranks:
            log.info("trainer-start: replacing the running group")
            self.stop()
        directory = Path(spec["checkpointDir"])
        directory.mkdir(parents=True, exist_ok=True)
        ledger = Ledger(directory)

        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from .rank import TrainerRank

        world = spec["ranks"]
        actor = ray.remote(TrainerRank)
        hook = os.environ.get(CRASH_HOOK_ENV) or None
        started = time.monotonic()
        share = self.driver.share(spec["group"])
        # Decided once per group: NCCL fixes a process's interface at its first call.
        loopback = self.driver.single_node()
        self._ranks = [
            actor.options(
                num_gpus=bundles[r]["GPU"] * share, num_cpus=bundles[r]["CPU"] * share, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=r),
            ).remote(r, world, spec["seed"], max(1, int(bundles[r]["CPU"] * share)), hook, loopback)
            for r in range(world)
        ]
        # One deadline for the whole start, not one per phase: the bridge client's timeout for
        # trainer-start (bridge/client.ts) is this plus a margin, and must not run out first.
        deadline = _Deadline(SETUP_TIMEOUT_S, started)
        devices = self._gather([r.device_name.remote() for r in self._ranks], "device", deadline)
        mixed = check_devices(devices)
        if mixed is not None:
            self.stop()  # ranks on different devices would wait in their first collective for minutes
            raise ShimError("REEF_ERR_TRAINER", mixed)
        master = self._gather([self._ranks[0].rendezvous.remote()], "rendezvous", deadline)[0]
        options = {**spec["options"], "engineLogprobs": spec["engineLogprobs"], "adapter": adapter}
        infos = self._gather([r.setup.remote(master, spec["modelPath"], options) for r in self._ranks],
                             "setup", deadline)
        self._spec, self._info, self._cfg = spec, infos[0], cfg
        self._ledger, self._dir, self._version, self._broken = ledger, directory, BASE_VERSION, None
        self._loopback = loopback
        self._adapter, self._scenario_versions = adapter, {}
        log.info("trainer: %d rank(s) on %s (%s) ready in %.1f s, pids %s, rendezvous at %s", world, infos[0]["device"],
                 infos[0]["backend"], time.monotonic() - started, [i["pid"] for i in infos], master[0])
        return {"worldSize": world, "device": infos[0]["device"], "pids": [i["pid"] for i in infos],
                "weightVersion": self._version}

    def stop(self) -> dict[str, Any]:
        import ray

        ranks, self._ranks = self._ranks, []
        if ranks:
            refs = [r.close.remote() for r in ranks]
            ray.wait(refs, num_returns=len(refs), timeout=15)  # dead or stuck ranks are killed regardless
            for r in ranks:
                ray.kill(r)
            log.info("trainer: %d rank(s) stopped", len(ranks))
        self._spec = None
        return {}

    # --- requests -------------------------------------------------------------------------------

    def _require(self) -> dict[str, Any]:
        if self._spec is None or self._ledger is None:
            raise ShimError("REEF_ERR_TRAINER", "trainer: not started; send trainer-start first")
        if self._broken is not None:
            raise ShimError("REEF_ERR_TRAINER_RANK", f"trainer rank {self._broken}; send trainer-start again")
        return self._spec

    def _held(self, scenario: str | None) -> str:
        """The version the step descends from: the scenario's adapter's with adapters, else the weights'."""
        if self._adapter is None:
            return self._version
        return self._scenario_versions.get(scenario or "", BASE_VERSION)

    def step(self, batch_id: str, raw_tasks: list[dict[str, Any]], scenario: str | None = None) -> dict[str, Any]:
        """Train one batch. `scenario`: the batch's scenario, required with adapters (whose adapter
        the step trains), ignored without (every scenario trains the one set of weights)."""
        if self._adapter is not None and not scenario:
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", "trainer-step.scenario: required when "
                            "trainer-start.spec.adapter is set (each scenario trains its own adapter)")
        if self._adapter is None:
            scenario = None
        fingerprint = batch_fingerprint(raw_tasks) + (f":{scenario}" if scenario else "")
        if self._ledger is not None and (done := self._ledger.get(batch_id)) is not None:
            # An entry written before fingerprints were kept has none: answered by id, as then.
            if done.get("fingerprint") not in (None, fingerprint):
                raise ShimError("REEF_ERR_CONFLICT", f"trainer: batch id {batch_id} was trained before, as "
                                f"{done.get('weightVersion')}, on other tasks (fingerprint {str(done['fingerprint'])[:12]}, "
                                f"these {fingerprint[:12]}): the controller's state is older than the ledger (its store "
                                "lost commits, or was restored); give this batch a new id")
            if self._answers(done, scenario):
                log.info("trainer-step %s: already trained as %s; not training it again", batch_id, done["weightVersion"])
                return {**{k: v for k, v in done.items() if k not in ("parent", "fingerprint")}, "trained": False}
            # Trained from weights the group does not descend from: a rollback came between the
            # step and its release (whose publish failed). Answering it would put the weights the
            # rollback took back into the engine, as a child of the rollback; that training was
            # never released, so the batch trains now, once, on the weights held.
            log.warning("trainer-step %s: trained before as %s from %s, which the weights held (%s) do not descend "
                        "from; training it on these", batch_id, done["weightVersion"], done["parent"], self._held(scenario))
        self._require()
        assert self._ledger is not None
        started = time.monotonic()
        tasks = decode_tasks(raw_tasks, self._info["vocab"], self._info["maxLen"])
        overlong = sum(t.teacher_overlong for t in tasks)
        if overlong:
            log.warning("trainer-step %s: %d teacher candidate(s) left out: with the hint, prompt + response exceed "
                        "the context length %d", batch_id, overlong, self._info["maxLen"])
        shards = shard(tasks, len(self._ranks))
        totals = {"tokens": float(sum(t.T for t in tasks))}
        version = next_version(self._dir, self._ledger)
        out = self._dir / version
        meta = {"weightVersion": version, "parent": self._held(scenario), "batchId": batch_id}
        # The scenario goes to the ranks only with adapters: ranks of an older shim take 5 arguments.
        extra = (scenario,) if scenario is not None else ()
        refs = [rank.step.remote(batch_id, [tasks[i] for i in shards[r]], totals, str(out) if r == 0 else None, meta,
                                 *extra)
                for r, rank in enumerate(self._ranks)]
        results = self._gather(refs, f"trainer-step {batch_id}", _Deadline(STEP_TIMEOUT_S, started), raised_by_step=True)
        failed = next((r["error"] for r in results if r["error"]), None)
        if failed and any(r.get("applied") for r in results):
            # As with the ledger below: the ranks hold weights no checkpoint or ledger entry has,
            # and a retry on them would train the batch twice. Not the batch's fault (a full disk).
            self._broken = f"0 failed: {failed}"
            raise ShimError("REEF_ERR_TRAINER_RANK", f"trainer: batch {batch_id}: trained, but {failed}; "
                            "send trainer-start again")
        if failed:
            raise ShimError("REEF_ERR_TRAINER", f"trainer: batch {batch_id}: {failed}")
        from .loss import combine

        metrics = combine([r["sums"] for r in results], self._cfg)
        metrics.update(grad_norm=results[0]["sums"]["grad_norm"], grad_clipped=results[0]["sums"]["grad_clipped"],
                       micro_batches=max(r["sums"]["micro_batches"] for r in results),
                       lr=float(self._spec_options()["lr"]),
                       train_ms=results[0]["train_s"] * 1000, save_ms=results[0]["save_s"] * 1000,
                       teacher_candidates_overlong=float(overlong))
        result = {"batchId": batch_id, "weightVersion": version, "checkpointPath": str(out), "metrics": metrics,
                  "stepMs": (time.monotonic() - started) * 1000}
        try:
            self._ledger.record(batch_id, {**result, "parent": meta["parent"], "fingerprint": fingerprint})
        except OSError as e:
            # The ranks have taken the step, the ledger does not know it: a retry on these ranks
            # would train the batch a second time on top of the first. A fresh group restarts from
            # the last release, and the retry trains it once there.
            self._broken = f"0 failed: the ledger could not be written ({e})"
            raise ShimError("REEF_ERR_TRAINER_RANK", f"trainer: batch {batch_id}: trained, but the ledger could not "
                            f"be written ({e}); send trainer-start again") from e
        if scenario is not None:
            self._scenario_versions[scenario] = version
        else:
            self._version = version
        log.info("trainer-step %s → %s: loss %.4g, |Δℓ| %.2g, %d tokens, %.0f ms (save %.0f ms)", batch_id, version,
                 metrics["loss"], metrics["train_rollout_logprob_abs_diff"], metrics["tokens"], result["stepMs"],
                 metrics["save_ms"])
        return {**result, "trained": True}

    def _answers(self, done: dict[str, Any], scenario: str | None = None) -> bool:
        """Whether a ledger entry is the answer to its batch for the weights held: they are the ones
        it was trained from (a retry), or descend from its checkpoint (the batch is in them)."""
        assert self._ledger is not None
        held = self._held(scenario)
        if done.get("parent") is None or done["parent"] == held:  # no parent: written before it was kept
            return True
        trained_from = {e["weightVersion"]: e.get("parent") for e in self._ledger.batches.values()}
        seen: set[str] = set()
        v: str | None = held
        while v is not None and v not in seen:
            if v == done["weightVersion"]:
                return True
            seen.add(v)
            v = trained_from.get(v)
        return False

    def _spec_options(self) -> dict[str, Any]:
        return self._spec["options"] if self._spec else {}

    def load(self, checkpoint_path: str) -> dict[str, Any]:
        """Weights from a checkpoint. With adapters: one scenario's adapter and its optimizer state
        (the scenario is in the checkpoint), which is how a restarted trainer resumes each adapter."""
        spec = self._require()
        path = Path(checkpoint_path)
        if self._adapter is not None:
            return self._load_adapter(path)
        _check_checkpoint(path, Path(spec["modelPath"]))
        self._load_on_ranks(path)
        self._version = checkpoint_version(path)
        log.info("trainer: loaded %s (%s); optimizer state reset", path, self._version)
        return {"weightVersion": self._version}

    def _load_on_ranks(self, path: Path) -> None:
        """Every rank loads `path`. Only the tensors are read there (the driver holds no model); a
        file they cannot use fails the load like one checked here, and the ranks keep what they held."""
        errors = self._gather([r.load.remote(str(path)) for r in self._ranks], f"trainer-load {path}",
                              _Deadline(SETUP_TIMEOUT_S))
        failed = [(rank, e) for rank, e in enumerate(errors) if e]
        if failed:
            from .rank import PEER_FAILED

            # The reason, not rank 0's "another rank could not use it": a path only some ranks
            # see (a disk local to rank 0's node) was reported as that alone, and said nothing.
            rank, why = next(((r, e) for r, e in failed if e != PEER_FAILED), failed[0])
            where = f" (rank {rank} of {len(errors)})" if len(errors) > 1 else ""
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"checkpoint {path}{where}: {why}")

    def _load_adapter(self, path: Path) -> dict[str, Any]:
        from .adapters import ADAPTER_CONFIG
        from .checkpoint import META

        if not (path / ADAPTER_CONFIG).is_file():
            what = "a full-weight checkpoint" if (path / "config.json").is_file() else "not an adapter checkpoint"
            raise ShimError("REEF_ERR_INVALID_ARGUMENT" if path.is_dir() else "REEF_ERR_NOT_FOUND",
                            f"checkpoint {path}: {what if path.is_dir() else 'not found'} (the trainer trains "
                            f"LoRA adapters: trainer-load takes a step's adapter checkpoint, with its {ADAPTER_CONFIG})")
        try:
            scenario = str(json.loads((path / META).read_text())["scenario"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"checkpoint {path}: its {META} names no scenario ({e})") from e
        self._load_on_ranks(path)
        version = checkpoint_version(path)
        self._scenario_versions[scenario] = version
        log.info("trainer: loaded scenario %r's adapter %s (%s) with its optimizer state", scenario, path, version)
        return {"weightVersion": version}

    def push_weights(self, engine_url: str, weight_version: str,
                     engine_versions: dict[str, Any] | None = None) -> dict[str, Any]:
        """Gather the policy's full weights and push them into the engine at `engine_url`, whose
        torch and NCCL (`stack_versions`) rank 0 checks against its own first."""
        self._require()
        if self._adapter is not None:
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", "trainer-push-weights: the trainer trains LoRA adapters and "
                            "never changes the base; load a step's checkpointPath into the engine with "
                            "/load_lora_adapter instead")
        if weight_version != self._version:
            # The label must be what the ranks hold: after a restart they may hold an older release.
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"trainer-push-weights: the trainer holds {self._version}, "
                            f"not {weight_version}")
        colocated = self.driver.colocated
        if self._loopback and not colocated:
            self._check_on_our_node(engine_url)
        refs = [r.push_weights.remote(engine_url, weight_version, PUSH_TIMEOUT_S, colocated, engine_versions)
                for r in self._ranks]
        first = self._gather(refs, f"trainer-push-weights {weight_version}", _Deadline(PUSH_TIMEOUT_S + 60))[0]
        if first["error"]:
            raise ShimError("REEF_ERR_WEIGHT_SYNC", f"weight sync into {engine_url} failed: {first['error']}")
        log.info("trainer-push-weights %s → %s: %.1f MB over %s in %.2f s", weight_version, engine_url,
                 first["bytes"] / 1e6, first["backend"], first["seconds"])
        return {"weightVersion": weight_version, "backend": first["backend"], "bytes": first["bytes"],
                "seconds": first["seconds"]}

    def _check_on_our_node(self, engine_url: str) -> None:
        """Refuse a push whose engine could not reach rank 0's loopback rendezvous: placement that
        came after trainer-start put it on another node. A push goes only to engines this shim
        started, whose node the driver knows (None: one it did not start, as the tests push into)."""
        assert self._spec is not None
        theirs = self.driver.engine_node(engine_url)
        ours = self.driver.bundle_node(self._spec["group"], 0)
        if theirs is not None and theirs != ours:
            raise ShimError("REEF_ERR_WEIGHT_SYNC", f"weight sync into {engine_url} failed: the engine is on node "
                            f"{theirs}, trainer rank 0 on {ours}, and the trainer's groups listen on loopback (every "
                            "bundle was on one node at trainer-start); send trainer-start again to push across nodes")

    # --- waiting on ranks -----------------------------------------------------------------------

    def _gather(self, refs: list[Any], what: str, deadline: _Deadline | None, raised_by_step: bool = False) -> list[Any]:
        """All results, or: kill the group at the first failed rank and raise REEF_ERR_TRAINER_RANK
        (with `raised_by_step`, REEF_ERR_TRAINER when no rank died and one raised)."""
        import ray

        started = time.monotonic()
        pending, logged = list(refs), started
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            failures = _failures(ray, refs, ready)
            if failures:
                # A dead rank makes its peers' collectives fail too, often first: give Ray a moment
                # to report the death, so the error names the rank that died, not a bystander.
                failures += _failures(ray, refs, ray.wait(pending, num_returns=len(pending), timeout=3.0)[0])
                rank, e = min(failures, key=lambda f: (not isinstance(f[1], ray.exceptions.RayActorError), f[0]))
                reason = str(e).strip().splitlines()[-1][:500] if str(e).strip() else type(e).__name__
                self._broken = f"{rank} failed: {type(e).__name__}"
                log.error("%s: rank %d failed (%s); stopping every rank", what, rank, reason)
                self._kill_all()
                if raised_by_step and not any(isinstance(f[1], ray.exceptions.RayActorError) for f in failures):
                    # Every rank is alive and one raised (out of memory on this batch, say): the same
                    # batch on a fresh group raises again. Not retryable, so the controller dead-letters
                    # it after its attempts instead of retrying it, and stalling training, for good.
                    raise ShimError("REEF_ERR_TRAINER", f"trainer rank {rank} raised during {what}: {reason}") from e
                raise ShimError("REEF_ERR_TRAINER_RANK", f"trainer rank {rank} failed: {what}: {reason}") from e
            now = time.monotonic()
            if self.driver.closing.is_set():
                self._kill_all()
                raise ShimError("REEF_ERR_SHIM", f"python shim failed: shutting down during {what}")
            if deadline is not None and now > deadline.at:
                self._kill_all()
                # Which one hung is not known from here: its peers wait on it in a collective.
                silent = ", ".join(str(refs.index(p)) for p in pending)
                raise ShimError("REEF_ERR_TRAINER_RANK", f"trainer rank {refs.index(pending[0])} failed: "
                                f"{what}: no answer within {deadline.budget_s:.0f} s (rank(s) {silent} had not "
                                "answered); every rank was stopped")
            if pending and now - logged >= 10:
                log.info("%s: waiting for %d of %d rank(s) (%.0f s)", what, len(pending), len(refs), now - started)
                logged = now
        return ray.get(refs)

    def _kill_all(self) -> None:
        import ray

        for r in self._ranks:
            ray.kill(r)
        self._ranks = []
        if self._broken is None:
            self._broken = "stopped"


def _failures(ray: Any, refs: list[Any], ready: list[Any]) -> list[tuple[int, Exception]]:
    """(rank, error) of every finished call that raised: RayActorError (the process died) or
    RayTaskError (it raised)."""
    out = []
    for ref in ready:
        try:
            ray.get(ref)
        except Exception as e:
            out.append((refs.index(ref), e))
    return out


def _adapter_spec(spec: dict[str, Any]) -> dict[str, Any] | None:
    """`spec.adapter`, checked (absent: full-weight training, as before adapters existed)."""
    raw = spec.get("adapter")
    if raw is None:
        return None
    from .adapters import AdapterError, check_spec

    try:
        return check_spec(raw)
    except AdapterError as e:
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", str(e)) from e


def _check_checkpoint(path: Path, base: Path) -> None:
    """What can be checked without the model: the directory, its files, its shape against the base."""
    from ..engines.weights import SHAPE_KEYS, WeightError, safetensors_files  # imports torch: not at shim start

    if not path.is_dir():
        raise ShimError("REEF_ERR_NOT_FOUND", f"checkpoint {path} not found")
    try:
        safetensors_files(path)
        theirs = json.loads((path / "config.json").read_text())
        ours = json.loads((base / "config.json").read_text())
    except (WeightError, OSError, ValueError) as e:
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"checkpoint {path}: {e}") from e
    diffs = [k for k in SHAPE_KEYS if ours.get(k) != theirs.get(k)]
    if diffs:
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"checkpoint {path} is another model than {base} "
                        f"(differs in {', '.join(diffs)})")
