"""Engines on a real Ray head with logical GPUs, as `status` reports them.

The engine is the stand-in `fake_engine_server` (as the hf engine, and with `--api sglang` and a
slow /health as SGLang); everything around it (actor in the bundle, subprocess, health wait, probes) is the
production path. One Ray head for the module.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from reef_shim.errors import ShimError
from reef_shim.ray_driver import RayDriver
from trainer_fixtures import placed_driver

TESTS_DIR = Path(__file__).resolve().parent
LAYOUT = {"trainer": {"gpus": 1}, "rollout": {"gpus": 1}, "prm": {"gpus": 1, "replicas": 0}, "student": {"gpus": 1},
          "cpusPerBundle": 0.5, "colocate": False}


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayDriver]:
    # The Ray head started here hands this environment to the engine actors, and they to the engines.
    path = os.pathsep.join([str(TESTS_DIR), str(TESTS_DIR.parent), os.environ.get("PYTHONPATH", "")])
    with placed_driver(LAYOUT, 2, 3, PYTHONPATH=path, REEF_ENGINE_MODULE_HF="fake_engine_server",
                       REEF_ENGINE_MODULE_SGLANG="fake_engine_server",
                       REEF_ENGINE_LOG_DIR=str(tmp_path_factory.mktemp("engine-logs"))) as d:
        yield d


def spec(kind: str, group: str, *extra: str) -> dict[str, Any]:
    return {"name": f"{kind}-0", "role": "rollout" if group == "reef-rollout" else "student", "kind": kind,
            "modelPath": "/models/base", "group": group, "bundleIndex": 0, "host": "127.0.0.1", "port": 0,
            "extraArgs": ["--weight-version", "v0", *extra]}


@pytest.fixture
def engines(driver: RayDriver) -> Iterator[Callable[[dict[str, Any]], dict[str, Any]]]:
    started: list[str] = []

    def start(s: dict[str, Any]) -> dict[str, Any]:
        info = driver.start_engine(s)
        started.append(s["name"])
        return info

    yield start
    for name in started:
        driver.stop_engine(name)


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def status_until(driver: RayDriver, name: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The engine's status entry once `done` holds (or the last one seen, after 60 s).

    A probe that misses status's deadline on a loaded machine only reports unhealthy once, so the
    wait asks again rather than judging one answer.
    """
    deadline = time.monotonic() + 60
    while True:
        info = next(e for e in driver.status()["engines"] if e["name"] == name)
        if done(info) or time.monotonic() > deadline:
            return info
        time.sleep(0.2)


@pytest.mark.parametrize("kind, group, extra", [("hf", "reef-rollout", ()), ("sglang", "reef-student", ("--api", "sglang", "--health-delay", "1.2"))])
def test_status_reports_the_weight_version_the_engine_serves_after_an_update(
        driver: RayDriver, engines: Callable[[dict[str, Any]], dict[str, Any]], kind: str, group: str,
        extra: tuple[str, ...]) -> None:
    info = engines(spec(kind, group, *extra))
    assert (info["healthy"], info["weightVersion"]) == (True, "v0")
    # The trainer-controller loads a release into the engine directly, not through the shim.
    assert post(info["url"] + "/update_weights_from_disk", {"model_path": "/ckpt/v3", "weight_version": "v3"})["success"]
    now = status_until(driver, info["name"], lambda e: e["healthy"] and e["weightVersion"] == "v3")
    assert (now["healthy"], now["weightVersion"]) == (True, "v3")


def test_an_sglang_engine_on_one_node_rendezvouses_through_a_file_of_its_own_removed_at_stop(
        driver: RayDriver, engines: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    # Review §1.1 #11: SGLang's own tcp:// rendezvous hosted a TCPStore on `::`, open to the LAN.
    info = engines(spec("sglang", "reef-student", "--api", "sglang"))
    with urllib.request.urlopen(info["url"] + "/fake/rendezvous", timeout=10) as r:
        method = json.loads(r.read())["init_method"]
    assert method is not None and method.startswith("file://") and method.endswith(".tpstore"), method
    path = Path(method[len("file://"):])
    assert path.exists() and (path.parent.stat().st_mode & 0o077) == 0, "the store's directory must be ours alone"
    driver.stop_engine(info["name"])
    assert not path.exists()
    # The hf engine has no rendezvous of its own, and nothing is set for it.
    other = engines(spec("hf", "reef-rollout"))
    with urllib.request.urlopen(other["url"] + "/fake/rendezvous", timeout=10) as r:
        assert json.loads(r.read())["init_method"] is None


def test_status_probes_again_an_engine_that_failed_a_probe(
        driver: RayDriver, engines: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    info = engines(spec("hf", "reef-rollout"))
    post(info["url"] + "/fake/health", {"code": 503})
    assert status_until(driver, info["name"], lambda e: not e["healthy"])["healthy"] is False
    post(info["url"] + "/fake/health", {"code": 200})
    assert status_until(driver, info["name"], lambda e: e["healthy"])["healthy"] is True


def test_an_engine_that_never_gets_healthy_fails_with_its_output_and_is_stopped(
        driver: RayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REEF_ENGINE_START_TIMEOUT_S", "4")
    with pytest.raises(ShimError) as err:
        driver.start_engine(spec("hf", "reef-rollout", "--startup-delay", "120"))
    assert err.value.code == "REEF_ERR_ENGINE_START"
    assert "/health not ready after 4 s; last output:\nfake engine listening on 127.0.0.1:" in err.value.message
    assert [e["name"] for e in driver.status()["engines"]] == []


def test_an_engine_whose_bundle_is_taken_names_the_bundle_and_who_holds_it(
        driver: RayDriver, engines: Callable[[dict[str, Any]], dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    engines(spec("hf", "reef-rollout"))
    monkeypatch.setenv("REEF_ENGINE_START_TIMEOUT_S", "3")
    with pytest.raises(ShimError) as err:
        driver.start_engine({**spec("hf", "reef-rollout"), "name": "second"})
    assert err.value.code == "REEF_ERR_ENGINE_START"
    assert ("engine second failed to start: its actor got no place in reef-rollout bundle 0 {GPU:1, CPU:0.5} "
            "within 3 s: engine(s) hf-0 hold it") in err.value.message
    assert [e["name"] for e in driver.status()["engines"]] == ["hf-0"]


def test_a_shutdown_ends_the_wait_for_an_engine_that_has_no_room_yet(
        driver: RayDriver, engines: Callable[[dict[str, Any]], dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    # A SIGTERM during start-engine sets `closing`; the shim must not hold its exit (and the
    # cleanup of everything it started) for the launch's two minutes.
    engines(spec("hf", "reef-rollout"))
    monkeypatch.setenv("REEF_ENGINE_START_TIMEOUT_S", "60")
    timer = threading.Timer(1.0, driver.closing.set)
    timer.start()
    # Ignored, the shutdown would leave the wait to its 60 s and a placement timeout as the error.
    try:
        with pytest.raises(ShimError) as err:
            driver.start_engine({**spec("hf", "reef-rollout"), "name": "second"})
    finally:
        timer.cancel()
        driver.closing.clear()
    assert (err.value.code, err.value.message) == (
        "REEF_ERR_SHIM", "python shim failed: shutting down while engine second was starting")
    assert [e["name"] for e in driver.status()["engines"]] == ["hf-0"]


def test_removing_groups_stops_their_engines_at_once(
        driver: RayDriver, engines: Callable[[dict[str, Any]], dict[str, Any]], tmp_path: Path) -> None:
    # Two engines that take 2 s each to exit: one after the other, a shutdown of three such
    # engines outlasted the 30 s spawnShim gives the shim before SIGKILL. Each engine notes when
    # SIGTERM reaches it and when it exits; stopped at once, both SIGTERMs come before either exit.
    log = tmp_path / "stops.log"
    engines(spec("hf", "reef-rollout", "--stop-delay", "2", "--stop-log", str(log)))
    engines(spec("sglang", "reef-student", "--api", "sglang", "--stop-delay", "2", "--stop-log", str(log)))
    try:
        assert driver.remove_placement(["reef-rollout", "reef-student"]) == ["reef-rollout", "reef-student"]
    finally:
        driver.create_placement(LAYOUT, 60)  # the module's other tests place engines there
    assert driver.status()["engines"] == []
    events = [line.split()[0] for line in log.read_text().splitlines()]
    assert events == ["term", "term", "exit", "exit"], f"the engines were stopped one after the other: {events}"


HEAD = """
import json, os, sys
from reef_shim.proc_tree import descendants
from reef_shim.ray_driver import RayDriver
from listeners import listening

d = RayDriver()
d.init_ray(None, 1, 0, None)
import ray  # after init-ray, as in the shim: imported before, it would keep the LAN address
try:
    # One task, so a worker process is there too, with its own gRPC server.
    ray.get(ray.remote(num_cpus=1)(lambda: None).remote(), timeout=120)
    print(json.dumps({"node": ray.util.get_node_ip_address(),
                      "listening": listening([os.getpid(), *descendants(os.getpid())])}))
finally:
    d.close()
"""


def test_the_ray_head_the_shim_starts_listens_on_loopback_alone(tmp_path: Path) -> None:
    # Ray's GCS, raylet, object manager, agents and workers listened on `::`, reachable from the
    # LAN (review §1.1 #6). A process of its own: `ray` reads the switch when it is imported, and
    # this one may have imported it, or been given the switch by a head started here.
    import subprocess
    import sys

    from listeners import not_loopback
    from reef_shim.ray_driver import RAY_SINGLE_HOST_ENV

    env = {k: v for k, v in os.environ.items() if k != RAY_SINGLE_HOST_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR.parent), str(TESTS_DIR)])
    out = subprocess.run([sys.executable, "-c", HEAD], env=env, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    found = [tuple(f) for f in seen["listening"]]
    assert seen["node"] == "127.0.0.1"
    assert len(found) >= 3, found  # the GCS, the raylet, the worker at least
    assert not_loopback(found) == [], found


def test_an_engine_on_one_node_gets_gloo_and_nccl_on_loopback(
        driver: RayDriver, engines: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    # The engine's end of a weight group listens too; on one node it must stay on loopback as the trainer's end does.
    from reef_shim.dist_net import LOOPBACK_ENV

    info = engines(spec("hf", "reef-rollout"))
    assert driver.single_node()
    assert driver.engine_node(info["url"]) == driver.bundle_node("reef-trainer", 0) is not None
    environ = dict(line.split("=", 1) for line in Path(f"/proc/{info['pid']}/environ").read_text().split("\0")
                   if "=" in line)
    assert {k: environ.get(k) for k in LOOPBACK_ENV} == LOOPBACK_ENV
