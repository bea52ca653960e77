"""The thin Ray side of the shim: connect, create/remove placement groups, run engines in bundles.

Planning is pure (`placement.py`); this module only turns a plan into Ray calls, waits for them
with progress logs and timeouts that name what is stuck, and keeps a registry of what it made so
status and shutdown can account for everything. Ray is imported lazily: `import ray` costs
seconds, and the shim must answer `ping` long before anyone asks for Ray.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from .dist_net import confine_to_loopback, is_loopback
from .engines.admin_key import admin_key, sglang_admin_args
from .engine_process import (SGLANG_INIT_OVERRIDE, EngineProcess, engine_command, engine_env, engine_module,
                             engine_start_timeout_s, sglang_rendezvous_file,
                             pick_free_port, wait_healthy)
from .errors import ShimError
from .placement import COLOCATED_SHARE, TRAINER_GROUP, bundle_label, fmt_number, plan_placement
from .proc_tree import descendants, reap

log = logging.getLogger("reef_shim.ray")

DEFAULT_OBJECT_STORE_BYTES = 128 * 1024 * 1024
ENGINE_ACTOR_CPUS = 0.1
STATUS_PROBE_TIMEOUT_S = 3.0


@dataclass
class _Group:
    planned: dict[str, Any]  # PlannedGroup
    pg: Any  # ray.util.placement_group.PlacementGroup


@dataclass
class _Engine:
    spec: dict[str, Any]  # EngineSpec
    actor: Any
    url: str
    pid: int | None
    started: bool = False  # start-engine saw it healthy; from then on every status probes it
    healthy: bool = False  # the answer of the latest probe
    weight_version: str | None = None  # as the engine last reported it
    versions: dict[str, Any] | None = None  # the torch and NCCL of the interpreter it runs (`stack_versions`)
    probe_ref: Any = None  # the status probe still in flight (an ObjectRef), if any


class EngineActor:
    """A Ray actor that owns one engine server subprocess inside its placement-group bundle.

    The actor holds the bundle's GPUs (Ray sets CUDA_VISIBLE_DEVICES for it, and the engine
    inherits that); the engine itself runs as a child process so it can be killed as a process
    group and its output kept in a log file.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.engine: EngineProcess | None = None

    def launch(self, kind: str, module: str, model_path: str, host: str, port: int, extra_args: list[str],
               log_dir: str, role: str, loopback: bool = False) -> dict[str, Any]:
        import ray

        # Read here, in the worker the engine inherits from, not in the driver: on a cluster the
        # shim joined, the two environments differ.
        env = engine_env(kind)
        if loopback:
            # The engine's end of a weight group then listens on loopback, as the trainer's does
            # (`dist_net`); so do the gloo and NCCL sockets of SGLang's own TP groups.
            confine_to_loopback(env)
        port = port or pick_free_port(host)
        scratch: tuple[str, ...] = ()
        store = sglang_rendezvous_file(env, extra_args, log_dir, f"{self.name}-{port}-{uuid.uuid4().hex[:12]}") \
            if kind == "sglang" and loopback else None
        if store is not None:
            # SGLang's own rendezvous then listens nowhere, instead of on `::` (review §1.1 #11).
            env[SGLANG_INIT_OVERRIDE] = f"file://{store}"
            scratch = (store,)
        probe_host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        public_host = ray.util.get_node_ip_address() if host in ("", "0.0.0.0") else host
        log_path = os.path.join(log_dir, f"{self.name}-{port}.log")
        key = admin_key()
        if kind == "sglang" and key is not None:
            extra_args = [*extra_args, *sglang_admin_args(extra_args, key, log_dir, self.name, port, role)]
        argv = engine_command(module, model_path, host, port, extra_args)
        self.engine = EngineProcess(self.name, argv, probe_host, port, log_path, env, scratch=scratch)
        pid = self.engine.start()
        from .stack_versions import stack_versions

        # The engine runs this actor's interpreter (engine_command: sys.executable), so its build is ours.
        return {"pid": pid, "url": f"http://{public_host}:{port}", "log": log_path, "versions": stack_versions()}

    def probe(self) -> dict[str, Any]:
        if self.engine is None:
            return {"alive": False, "returncode": None, "healthy": False, "tail": "not launched"}
        return self.engine.probe()

    def weight_version(self) -> str | None:
        return self.engine.weight_version() if self.engine else None

    def tail(self) -> str:
        return self.engine.tail() if self.engine else ""

    def report(self) -> dict[str, Any]:
        """`{healthy, weight_version}` for status; the version only from a healthy engine."""
        healthy = self.probe()["healthy"]
        return {"healthy": healthy, "weight_version": self.weight_version() if healthy else None}

    def stop(self) -> bool:
        return self.engine.stop() if self.engine else False


def _ray() -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    return ray


# Ray's own switch for a one-host cluster (its default on macOS and Windows): the node's address is
# then 127.0.0.1, and the GCS, raylet, object manager, agents and workers listen there alone. Given
# `127.0.0.1` (`ray.init(_node_ip_address=…)`, `ray start --node-ip-address`) Ray would replace it
# with the LAN address (`services.resolve_ip_for_localhost`). Read once, when `ray` is imported.
RAY_SINGLE_HOST_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _confine_local_head() -> None:
    """Keep the head this shim starts on loopback: no other host can reach its ports or join it as
    a node. An operator's own setting of the switch wins; a `ray` imported already keeps what it read."""
    if "ray" not in sys.modules:
        os.environ.setdefault(RAY_SINGLE_HOST_ENV, "0")


class RayDriver:
    """All Ray state of one shim. Long calls run on one worker thread; `status` may run alongside."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}
        self._engines: dict[str, _Engine] = {}
        # The last placed layout's `colocate`: the rollout engine and the trainer's rank share the
        # trainer group's one bundle (`share`), and releases go by `update_weights_from_tensor`.
        self.colocated = False
        self._connected = False
        self._address: str | None = None
        self._started_head = False
        self._actor_cls: Any = None
        self.closing = threading.Event()

    @property
    def connected(self) -> bool:
        return self._connected

    def _require_ray(self) -> Any:
        if not self._connected:
            raise ShimError("REEF_ERR_RAY", "ray: not connected; send init-ray first", retryable=False)
        return _ray()

    # --- connection ---------------------------------------------------------------------------

    def init_ray(self, address: str | None, num_cpus: int | None, num_gpus: int | None,
                 object_store_bytes: int | None) -> dict[str, Any]:
        if address is None and not self._connected:
            _confine_local_head()
        ray = _ray()
        if self._connected:
            log.info("ray already connected to %s; init-ray is a no-op", self._address)
        else:
            started = time.monotonic()
            common = dict(namespace="reef", logging_level=logging.WARNING, log_to_driver=False)
            try:
                if address is None:
                    log.info("starting a local Ray head (cpus=%s, logical gpus=%s)", num_cpus, num_gpus)
                    ray.init(
                        address="local", num_cpus=num_cpus, num_gpus=num_gpus,
                        object_store_memory=object_store_bytes or DEFAULT_OBJECT_STORE_BYTES,
                        include_dashboard=False,
                        # Prestarting one idle worker per declared CPU would fork a dozen Python
                        # processes on a small machine for actors that may never come.
                        _system_config={"enable_worker_prestart": False, "prestart_worker_first_driver": False},
                        **common,
                    )
                else:
                    if num_cpus is not None or num_gpus is not None or object_store_bytes is not None:
                        log.warning("init-ray: numCpus/numGpus/objectStoreBytes apply only to a local head; ignored")
                    _check_reachable(address)
                    log.info("connecting to Ray at %s", address)
                    ray.init(address=address, **common)
            except Exception as e:  # Ray raises many types (ConnectionError, RuntimeError, ValueError)
                raise ShimError("REEF_ERR_RAY", f"ray: init failed: {e}") from e
            self._address = ray.get_runtime_context().gcs_address
            self._started_head = address is None
            self._connected = True
            log.info("ray ready at %s in %.1f s", self._address, time.monotonic() - started)
            if self._started_head and not is_loopback(ray.util.get_node_ip_address()):
                log.warning("the local Ray head listens on %s, not on loopback (%s=%s, or ray was imported before "
                            "init-ray): its ports are reachable from the network", ray.util.get_node_ip_address(),
                            RAY_SINGLE_HOST_ENV, os.environ.get(RAY_SINGLE_HOST_ENV))
        return {"address": self._address, "startedHead": self._started_head,
                "resources": _plain(ray.cluster_resources())}

    # --- placement groups ---------------------------------------------------------------------

    def create_placement(self, layout: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
        ray = self._require_ray()
        from ray.util.placement_group import placement_group

        total = ray.cluster_resources()
        # Checked against the cluster's totals first, so an impossible layout fails at once and
        # names its bundle, instead of sitting PENDING until the timeout.
        plan = plan_placement(layout, total.get("GPU", 0.0), total.get("CPU", 0.0))
        self.colocated = bool(layout["colocate"])
        created: list[str] = []
        for planned in plan["groups"]:
            name = planned["name"]
            with self._lock:
                existing = self._groups.get(name)
            if existing is not None:
                if existing.planned != planned:
                    self._remove_many(created)
                    raise ShimError("REEF_ERR_PLACEMENT", f"cannot place {name}: a group of that name exists "
                                    "with a different shape; remove-placement it first")
                continue
            bundles = [{k: float(v) for k, v in b.items()} for b in planned["bundles"]]
            pg = placement_group(bundles, strategy=planned["strategy"], name=name)
            with self._lock:
                self._groups[name] = _Group(planned, pg)
            created.append(name)
        try:
            self._wait_created([g["name"] for g in plan["groups"]], timeout_s)
        except ShimError:
            self._remove_many(created)  # all or nothing: a failed create leaves the cluster as it was
            raise
        return [self._group_status(self._groups[g["name"]]) for g in plan["groups"]]

    def _wait_created(self, names: list[str], timeout_s: float) -> None:
        ray = _ray()
        started = time.monotonic()
        pending = {name: self._groups[name].pg.ready() for name in names}
        while pending:
            refs = list(pending.values())
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=1.0)
            ready_set = set(ready)
            pending = {n: r for n, r in pending.items() if r not in ready_set}
            elapsed = time.monotonic() - started
            if not pending:
                log.info("placement: %d group(s) created in %.1f s", len(names), elapsed)
                return
            if self.closing.is_set():
                raise ShimError("REEF_ERR_SHIM", "python shim failed: shutting down during create-placement")
            if elapsed >= timeout_s:
                raise self._pending_error(next(iter(pending)), elapsed)
            log.info("placement: waiting for %s (%.0f of %s s)", ", ".join(pending), elapsed, fmt_number(timeout_s))

    def _pending_error(self, name: str, elapsed: float) -> ShimError:
        """Name the first bundle of a stuck group that the free resources cannot hold."""
        ray = _ray()
        planned = self._groups[name].planned
        free = _plain(ray.available_resources())
        total = ray.cluster_resources()
        culprit = 0
        reason = f"{planned['strategy']} group still pending after {elapsed:.0f} s"
        for index, bundle in enumerate(planned["bundles"]):
            short = [k for k, v in bundle.items() if free.get(k, 0.0) + 1e-9 < v]
            if short:
                culprit = index
                have = "; ".join(f"{k} {fmt_number(free.get(k, 0.0))} of {fmt_number(total.get(k, 0.0))} free"
                                 for k in short)
                reason = f"still pending after {elapsed:.0f} s ({have})"
                break
            for k, v in bundle.items():
                free[k] = free.get(k, 0.0) - v
        label = bundle_label(name, culprit, planned["bundles"][culprit])
        return ShimError("REEF_ERR_PLACEMENT", f"cannot place {label}: {reason}")

    def remove_placement(self, names: list[str] | None) -> list[str]:
        self._require_ray()
        with self._lock:
            targets = list(self._groups) if names is None else [n for n in names if n in self._groups]
        return self._remove_many(targets)

    def _remove_many(self, names: list[str]) -> list[str]:
        from ray.util.placement_group import remove_placement_group

        with self._lock:
            engines = [e for e, rec in self._engines.items() if rec.spec["group"] in names]
        self._stop_engines(engines)
        removed = []
        for name in names:
            with self._lock:
                group = self._groups.pop(name, None)
            if group is None:
                continue
            try:
                remove_placement_group(group.pg)
            except Exception as e:  # already gone with its job, or GCS hiccup: the group is ours no more
                log.warning("removing placement group %s: %s", name, e)
            removed.append(name)
            log.info("placement group %s removed", name)
        return removed

    def share(self, group: str) -> float:
        """The share of a bundle of `group` that one of its actors takes: all of it, except in the
        colocated trainer bundle, which the rank and the rollout engine split."""
        return COLOCATED_SHARE if self.colocated and group == TRAINER_GROUP else 1.0

    def placement_group(self, name: str) -> tuple[Any, dict[str, Any]]:
        """The Ray placement group `name` and its PlannedGroup (the trainer places its ranks in it)."""
        self._require_ray()
        with self._lock:
            group = self._groups.get(name)
        if group is None:
            raise ShimError("REEF_ERR_NOT_FOUND", f"placement group {name} not found; create-placement first")
        return group.pg, group.planned

    def single_node(self) -> bool:
        """Whether every bundle of every group placed is on one node. Then every trainer rank and
        every engine a push can reach (only engines this shim started, each in a bundle) runs on
        that node, and torch.distributed can listen on loopback alone (`dist_net`)."""
        with self._lock:
            groups = list(self._groups.values())
        nodes: set[str] = set()
        for group in groups:
            placed = _bundle_nodes(group)
            if len(placed) < len(group.planned["bundles"]):
                return False  # not placed yet: nothing says where it will go
            nodes.update(placed.values())
        return len(nodes) == 1

    def bundle_node(self, name: str, index: int) -> str | None:
        """The node holding bundle `index` of group `name`; None while it is not placed."""
        with self._lock:
            group = self._groups.get(name)
        return None if group is None else _bundle_nodes(group).get(index)

    def engine_node(self, url: str) -> str | None:
        """The node of the started engine at `url`; None for an engine this shim did not start."""
        with self._lock:
            spec = next((r.spec for r in self._engines.values() if r.url.rstrip("/") == url.rstrip("/")), None)
        return None if spec is None else self.bundle_node(spec["group"], spec["bundleIndex"])

    def _group_status(self, group: _Group) -> dict[str, Any]:
        from ray.util.placement_group import placement_group_table

        table = placement_group_table(group.pg) or {}
        raw_state = table.get("state", "PENDING")
        state = raw_state if raw_state in ("CREATED", "REMOVED") else "PENDING"
        nodes = table.get("bundles_to_node_id") or {}
        bundles = []
        for index, resources in enumerate(group.planned["bundles"]):
            node = nodes.get(index)
            bundles.append({"index": index, "resources": {k: float(v) for k, v in resources.items()},
                            "nodeId": None if node is None or state != "CREATED" else str(node)})
        planned = group.planned
        return {"name": planned["name"], "role": planned["role"], "strategy": planned["strategy"],
                "state": state, "bundles": bundles}

    # --- engines ------------------------------------------------------------------------------

    def start_engine(self, spec: dict[str, Any]) -> dict[str, Any]:
        ray = self._require_ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        name = spec["name"]
        budget_s = engine_start_timeout_s(kind=spec["kind"])
        with self._lock:
            if name in self._engines:
                raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"engine {name} is already running; stop-engine it first")
            group = self._groups.get(spec["group"])
        if group is None:
            raise ShimError("REEF_ERR_NOT_FOUND", f"placement group {spec['group']} not found")
        bundles = group.planned["bundles"]
        if not 0 <= spec["bundleIndex"] < len(bundles):
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"bundleIndex {spec['bundleIndex']} is out of range for "
                            f"{spec['group']} ({len(bundles)} bundle(s))")
        bundle = bundles[spec["bundleIndex"]]
        module = engine_module(spec["kind"])
        if self._actor_cls is None:
            self._actor_cls = ray.remote(EngineActor)
        share = self.share(spec["group"])
        actor = self._actor_cls.options(
            name=f"reef-engine-{name}", num_gpus=bundle["GPU"] * share,
            num_cpus=min(ENGINE_ACTOR_CPUS, bundle["CPU"] * share),
            max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group.pg, placement_group_bundle_index=spec["bundleIndex"]),
        ).remote(name)
        log.info("engine %s: starting %s in %s bundle %d", name, module, spec["group"], spec["bundleIndex"])
        # One budget for launch and health together: the bridge client's timeout for start-engine
        # (bridge/client.ts) is REEF_ENGINE_START_TIMEOUT_S plus a margin, and must not run out first.
        started = time.monotonic()
        try:
            launched = self._wait_launch(name, actor.launch.remote(spec["kind"], module, spec["modelPath"], spec["host"],
                                                                   spec["port"], spec["extraArgs"], _engine_log_dir(),
                                                                   spec["role"], self.single_node()),
                                         min(120.0, budget_s))
        except Exception as e:
            ray.kill(actor)
            if isinstance(e, ShimError):
                raise
            if isinstance(e, ray.exceptions.GetTimeoutError):
                # Ray's own words ("Get timed out: some object(s) not ready") do not say that the
                # actor is almost always still waiting for its bundle's resources.
                raise self._no_room_error(spec, bundle, time.monotonic() - started) from e
            raise ShimError("REEF_ERR_ENGINE_START", f"engine {name} failed to start: {e}") from e
        record = _Engine(spec, actor, launched["url"], launched["pid"], versions=launched.get("versions"))
        with self._lock:
            self._engines[name] = record
        log.info("engine %s: pid %s, url %s, log %s", name, launched["pid"], launched["url"], launched["log"])
        try:
            wait_healthy(name, lambda: ray.get(actor.probe.remote(), timeout=30), budget_s,
                         cancelled=self.closing.is_set, since=started,
                         output=lambda: ray.get(actor.tail.remote(), timeout=10))
            record.weight_version = ray.get(actor.weight_version.remote(), timeout=30)
        except Exception as e:
            self.stop_engine(name)
            if isinstance(e, ShimError):
                raise
            raise ShimError("REEF_ERR_ENGINE_START", f"engine {name} failed to start: {e}") from e
        record.healthy = record.started = True
        return self._engine_info(record)

    def _wait_launch(self, name: str, ref: Any, timeout_s: float) -> dict[str, Any]:
        """The launch's answer; GetTimeoutError after `timeout_s`. A shutdown ends the wait: one
        blocking get held the shim's exit for up to two minutes on an actor that had no room."""
        ray = _ray()
        deadline = time.monotonic() + timeout_s
        while not ray.wait([ref], timeout=max(0.0, min(1.0, deadline - time.monotonic())))[0]:
            if self.closing.is_set():
                raise ShimError("REEF_ERR_SHIM", f"python shim failed: shutting down while engine {name} was starting")
            if time.monotonic() >= deadline:
                raise ray.exceptions.GetTimeoutError(f"engine {name}: launch not done after {timeout_s:.0f} s")
        return ray.get(ref, timeout=0)

    def _no_room_error(self, spec: dict[str, Any], bundle: dict[str, Any], waited_s: float) -> ShimError:
        where = bundle_label(spec["group"], spec["bundleIndex"], bundle)
        with self._lock:
            holders = sorted(n for n, r in self._engines.items()
                             if r.spec["group"] == spec["group"] and r.spec["bundleIndex"] == spec["bundleIndex"])
        if holders:
            why = f"engine(s) {', '.join(holders)} hold it; stop-engine first, or start it in another bundle"
        elif spec["group"] == TRAINER_GROUP:
            why = "the trainer's ranks may hold it (trainer-stop first)"
        else:
            why = "its resources are taken by something else, or the group is not CREATED (see status)"
        return ShimError("REEF_ERR_ENGINE_START", f"engine {spec['name']} failed to start: its actor got no place in "
                         f"{where} within {waited_s:.0f} s: {why}")

    def stop_engine(self, name: str) -> bool:
        self._require_ray()
        return self._stop_engines([name]) == [name]

    def _stop_engines(self, names: list[str]) -> list[str]:
        """Stop these engines all at once; the names of those that were registered.

        At once, not one after another: each may take its SIGTERM grace and more, and shutdown
        stopping three engines in turn outlasted the 30 s a parent gives the shim before SIGKILL.
        """
        ray = _ray()
        with self._lock:
            records = [(n, r) for n in names if (r := self._engines.pop(n, None)) is not None]
        stops = []
        for name, record in records:
            try:
                stops.append(record.actor.stop.remote())
            except Exception as e:  # the actor handle is unusable: ray.kill below still ends it
                log.warning("engine %s: stop: %s", name, e)
                stops.append(None)
        deadline = time.monotonic() + 30
        for (name, record), ref in zip(records, stops):
            try:
                if ref is not None and not ray.get(ref, timeout=max(0.0, deadline - time.monotonic())):
                    log.warning("engine %s: its main process had already exited; its process group is ended", name)
            except Exception as e:  # actor already dead: its engine got SIGTERM through PDEATHSIG
                log.warning("engine %s: stop: %s", name, e)
            ray.kill(record.actor)
            log.info("engine %s stopped", name)
        return [name for name, _ in records]

    def _engine_info(self, record: _Engine) -> dict[str, Any]:
        spec = record.spec
        return {"name": spec["name"], "role": spec["role"], "kind": spec["kind"], "url": record.url,
                "pid": record.pid, "healthy": record.healthy, "weightVersion": record.weight_version,
                "modelPath": spec["modelPath"], "group": spec["group"], "bundleIndex": spec["bundleIndex"]}

    def engine_versions(self, url: str) -> dict[str, Any] | None:
        """The torch and NCCL the engine at `url` runs with, as its actor read them at launch."""
        with self._lock:
            return next((rec.versions for rec in self._engines.values() if rec.url.rstrip("/") == url.rstrip("/")), None)

    def started_engine(self, url: str) -> bool:
        """Whether `url` is an engine this shim started: a push sends the whole model to whoever
        answers at the URL it is given, so only those are pushed into."""
        with self._lock:
            return any(rec.url.rstrip("/") == url.rstrip("/") for rec in self._engines.values())

    # --- status and shutdown ------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        if not self._connected:
            return {"ray": None, "groups": [], "engines": []}
        ray = _ray()
        with self._lock:
            groups = list(self._groups.values())
            engines = list(self._engines.values())
        # A starting engine's health is the start call's to report.
        self._probe([record for record in engines if record.started])
        return {
            "ray": {"address": self._address,
                    "resources": _plain(ray.cluster_resources()),
                    "available": _plain(ray.available_resources())},
            "groups": [self._group_status(g) for g in groups],
            "engines": [self._engine_info(e) for e in engines],
        }

    def _probe(self, records: list[_Engine]) -> None:
        """Set `healthy` and `weight_version` of `records` from one probe each, all at once.

        Status is answered on the shim's socket thread, so the probes share one short deadline;
        an engine that misses it counts as unhealthy this time. Its probe stays in flight and the
        next status waits on it instead of queueing another behind it on the actor.
        """
        ray = _ray()
        in_flight = [r.probe_ref for r in records if r.probe_ref is not None]
        # A probe that answered after an earlier status stopped waiting is stale: ask again.
        done = set(ray.wait(in_flight, num_returns=len(in_flight), timeout=0)[0]) if in_flight else set()
        for record in records:
            if record.probe_ref is None or record.probe_ref in done:
                try:
                    record.probe_ref = record.actor.report.remote()
                except Exception:
                    record.probe_ref = None
        refs = [r.probe_ref for r in records if r.probe_ref is not None]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=STATUS_PROBE_TIMEOUT_S)[0]) if refs else set()
        for record in records:
            if record.probe_ref is None or record.probe_ref not in ready:
                record.healthy = False
                continue
            ref, record.probe_ref = record.probe_ref, None
            try:
                got = ray.get(ref, timeout=0)
            except Exception:  # the actor died with its engine
                record.healthy = False
                continue
            record.healthy = bool(got["healthy"])
            if got["weight_version"] is not None:
                record.weight_version = got["weight_version"]

    def close(self) -> None:
        """Stop every engine, remove every group, disconnect (and stop a head we started)."""
        self.closing.set()
        if not self._connected:
            return
        with self._lock:
            engines = list(self._engines)
        self._stop_engines(engines)
        self.remove_placement(None)
        # Ray's agents (started by the raylet we started) can outlive ray.shutdown(), stuck
        # reporting the raylet's death to a GCS that is already gone: remember our descendants
        # now and end the ones still there afterwards, by pid.
        leftovers = descendants(os.getpid()) if self._started_head else {}
        _ray().shutdown()
        self._connected = False
        reap(leftovers)
        log.info("ray disconnected")


GCS_PROBE_TIMEOUT_S = 5.0


def _check_reachable(address: str) -> None:
    """Fail at once when nothing listens at a `host:port` Ray address.

    ray.init retries an unreachable GCS 20 times, each wait ending in its own timeout: it held the
    shim's worker (every later request queued behind it, and the cleanup at exit) for many
    minutes, long after the bridge client had given up on init-ray at 120 s.
    """
    if "://" in address or ":" not in address:
        return  # `auto`, `ray://` client mode: Ray finds the head itself
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=GCS_PROBE_TIMEOUT_S).close()
    except OSError as e:
        raise ShimError("REEF_ERR_RAY", f"ray: init failed: no Ray head answers at {address} ({e}); start one there "
                        "(ray start --head) or correct the address") from e


def _bundle_nodes(group: _Group) -> dict[int, str]:
    """Bundle index -> node id of a CREATED group (empty for any other state)."""
    from ray.util.placement_group import placement_group_table

    table = placement_group_table(group.pg) or {}
    if table.get("state") != "CREATED":
        return {}
    return {int(i): str(n) for i, n in (table.get("bundles_to_node_id") or {}).items() if n is not None}


def _plain(resources: dict[str, Any]) -> dict[str, float]:
    """Cluster resources without the per-placement-group entries Ray adds (`GPU_group_0_<id>`...)."""
    return {k: float(v) for k, v in resources.items() if "_group_" not in k}


def _engine_log_dir() -> str:
    return os.environ.get("REEF_ENGINE_LOG_DIR") or os.path.join("/tmp", f"reef-engines-{os.getuid()}")
