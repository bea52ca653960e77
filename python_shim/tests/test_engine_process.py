"""The engine subprocess wrapper the Ray actor uses, driven directly against the fake engine."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from reef_shim.engine_process import (DEFAULT_ENGINE_START_TIMEOUT_S, SGLANG_ENGINE_START_TIMEOUT_S, SGLANG_INIT_OVERRIDE,
                                      EngineProcess, engine_command, engine_env, engine_module, engine_start_timeout_s,
                                      pick_free_port, sglang_rendezvous_file, wait_healthy)
from reef_shim.errors import ShimError
from reef_shim.proc_tree import proc_stat

TESTS_DIR = str(Path(__file__).resolve().parent)

# An engine that crashed and left a worker behind in its process group: the main process starts a
# worker that ignores SIGTERM (so SIGKILL is needed too), writes its pid, and exits with 3.
CRASHED_LEADER = (
    "import subprocess, sys; "
    "w = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(\"armed\", flush=True); time.sleep(120)']); "
    "print('worker', w.pid, flush=True); sys.exit(3)"
)


@pytest.fixture
def make(tmp_path: Path) -> Iterator:
    made: list[EngineProcess] = []

    def _make(*extra: str) -> EngineProcess:
        port = pick_free_port("127.0.0.1")
        argv = engine_command("fake_engine_server", "/models/tiny", "127.0.0.1", port, list(extra))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")])}
        proc = EngineProcess("e0", argv, "127.0.0.1", port, str(tmp_path / f"e0-{port}.log"), env)
        made.append(proc)
        return proc

    yield _make
    for p in made:
        p.stop(grace_s=2)


def test_command_line_and_module_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REEF_ENGINE_MODULE_HF", raising=False)
    assert engine_module("hf") == "reef_shim.engines.hf_server"
    assert engine_module("sglang") == "sglang.launch_server"
    monkeypatch.setenv("REEF_ENGINE_MODULE_HF", "fake_engine_server")
    assert engine_module("hf") == "fake_engine_server"
    assert engine_command("m", "/p", "h", 5, ["--x", "y"]) == [
        sys.executable, "-m", "m", "--model-path", "/p", "--host", "h", "--port", "5", "--x", "y"]
    with pytest.raises(ShimError):
        engine_module("vllm")


def test_engine_start_timeout_is_read_as_the_bridge_client_reads_it() -> None:
    # bridge/client.ts engineStartTimeoutS: blank is the default, only a finite positive number counts.
    assert engine_start_timeout_s({}) == DEFAULT_ENGINE_START_TIMEOUT_S
    assert engine_start_timeout_s({"REEF_ENGINE_START_TIMEOUT_S": ""}) == DEFAULT_ENGINE_START_TIMEOUT_S
    assert engine_start_timeout_s({"REEF_ENGINE_START_TIMEOUT_S": "  "}) == DEFAULT_ENGINE_START_TIMEOUT_S
    assert engine_start_timeout_s({"REEF_ENGINE_START_TIMEOUT_S": "900"}) == 900
    assert engine_start_timeout_s({"REEF_ENGINE_START_TIMEOUT_S": "2.5"}) == 2.5
    # nan and inf would make the health wait endless; 0 and below fail every start at once.
    for raw in ("5m", "nan", "inf", "0", "-1", "1_000"):
        with pytest.raises(ShimError) as err:
            engine_start_timeout_s({"REEF_ENGINE_START_TIMEOUT_S": raw})
        assert err.value.code == "REEF_ERR_CONFIG_INVALID"
        assert f'REEF_ENGINE_START_TIMEOUT_S must be a positive number of seconds, got "{raw}"' in err.value.message


def test_an_sglang_engine_gets_a_longer_start_budget_and_the_override_still_applies() -> None:
    # A first SGLang start loads the weights, captures CUDA graphs and JIT-compiles kernels.
    assert SGLANG_ENGINE_START_TIMEOUT_S == 900 > DEFAULT_ENGINE_START_TIMEOUT_S == 290
    assert engine_start_timeout_s({}, kind="sglang") == SGLANG_ENGINE_START_TIMEOUT_S
    assert engine_start_timeout_s({"REEF_ENGINE_START_TIMEOUT_S": " "}, kind="sglang") == SGLANG_ENGINE_START_TIMEOUT_S
    assert engine_start_timeout_s({}, kind="hf") == DEFAULT_ENGINE_START_TIMEOUT_S
    assert engine_start_timeout_s({"REEF_ENGINE_START_TIMEOUT_S": "60"}, kind="sglang") == 60
    with pytest.raises(ShimError, match="REEF_ENGINE_START_TIMEOUT_S must be a positive number"):
        engine_start_timeout_s({"REEF_ENGINE_START_TIMEOUT_S": "5m"}, kind="sglang")


def test_sglang_is_launched_with_health_generation_off_unless_the_environment_sets_it() -> None:
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert engine_env("sglang", base)["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "0"
    assert engine_env("sglang", base).items() >= base.items()  # the plugin's settings are test_sglang_plugin.py's
    assert engine_env("sglang", {**base, "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "1"})[
        "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "1"
    assert engine_env("hf", base) == base
    assert base == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"}


def test_sglang_rendezvous_goes_through_a_file_unless_the_operator_chose_one_or_it_spans_nodes() -> None:
    at = "/run/reef/engines"
    assert sglang_rendezvous_file({}, [], at, "student-0-8123-ab") == "/run/reef/engines/student-0-8123-ab.tpstore"
    assert sglang_rendezvous_file({}, ["--tp", "2", "--nnodes", "1"], at, "t") == "/run/reef/engines/t.tpstore"
    assert sglang_rendezvous_file({}, ["--nnodes=1"], at, "t") == "/run/reef/engines/t.tpstore"
    assert sglang_rendezvous_file({SGLANG_INIT_OVERRIDE: "tcp://10.0.0.2:5000"}, [], at, "t") is None
    assert sglang_rendezvous_file({}, ["--dist-init-addr", "10.0.0.2:5000"], at, "t") is None
    assert sglang_rendezvous_file({}, ["--dist-init-addr=10.0.0.2:5000"], at, "t") is None
    assert sglang_rendezvous_file({}, ["--nnodes", "2"], at, "t") is None
    assert sglang_rendezvous_file({}, ["--nnodes=2"], at, "t") is None


def test_a_file_rendezvous_like_sglangs_override_listens_on_no_tcp_port(tmp_path: Path) -> None:
    # What the override relies on: torch's `file://` init method hosts no TCPStore, where the
    # `tcp://` one SGLang builds by default binds `::` (the contrast is the second run).
    script = textwrap.dedent("""
        import json, os, sys
        import torch.distributed as dist
        from listeners import listening
        held = []
        for method in sys.argv[1:]:
            dist.init_process_group("gloo", init_method=method, world_size=1, rank=0)
            held.append(listening([os.getpid()]))
            dist.destroy_process_group()
        print(json.dumps(held))
    """)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-c", script, f"file://{tmp_path / 'rdv.tpstore'}", f"tcp://127.0.0.1:{port}"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    by_file, by_tcp = json.loads(out.stdout.strip().splitlines()[-1])
    assert by_file and all(ipaddress.ip_address(a).is_loopback for _, a, _ in by_file), by_file
    assert [a for _, a, p in by_tcp if p == port and not ipaddress.ip_address(a).is_loopback], by_tcp


def test_sglang_with_original_logprobs_on_is_refused_and_the_hf_engine_is_not() -> None:
    # True as SGLang 0.5.23 reads it (srt/environ.py EnvBool, srt/utils/common.py get_bool_env_var).
    for value in ("1", "true", "True", "YES", "y"):
        with pytest.raises(ShimError) as err:
            engine_env("sglang", {"SGLANG_RETURN_ORIGINAL_LOGPROB": value})
        assert err.value.code == "REEF_ERR_CONFIG_INVALID"
        assert f"SGLANG_RETURN_ORIGINAL_LOGPROB={json.dumps(value)}" in err.value.message
        assert "tempered" in err.value.message
        assert engine_env("hf", {"SGLANG_RETURN_ORIGINAL_LOGPROB": value}) == {"SGLANG_RETURN_ORIGINAL_LOGPROB": value}
    # What SGLang reads as false (or as not a boolean, which it treats as false).
    for value in ("0", "false", "no", "", " 1", "on"):
        assert engine_env("sglang", {"SGLANG_RETURN_ORIGINAL_LOGPROB": value})["SGLANG_RETURN_ORIGINAL_LOGPROB"] == value


def test_the_weight_version_is_read_from_model_info_and_from_get_model_info_where_that_is_404(
        make, tmp_path: Path) -> None:
    # SGLang 0.5.23 logs a deprecation warning for every /get_model_info (srt/entrypoints/http_server.py:802-809).
    def asked(name: str, *extra: str) -> tuple[str | None, list[str]]:
        log = tmp_path / f"{name}.log"
        engine = make(*extra, "--request-log", str(log))
        engine.start()
        wait_healthy("e0", engine.probe, timeout_s=20, interval_s=0.1)
        version = engine.weight_version()
        return version, [line.split()[1] for line in log.read_text().splitlines() if "model_info" in line]

    # Both routes (SGLang 0.5.23, the hf engine), then an SGLang older than /model_info.
    assert asked("current", "--weight-version", "w-1") == ("w-1", ["/model_info"])
    assert asked("old", "--api", "sglang", "--weight-version", "w-2") == ("w-2", ["/model_info", "/get_model_info"])


def test_starts_reports_health_and_weight_version(make) -> None:
    engine = make("--startup-delay", "0.5", "--weight-version", "w-3")
    pid = engine.start()
    wait_healthy("e0", engine.probe, timeout_s=20, interval_s=0.1)
    assert engine.pid == pid
    assert engine.weight_version() == "w-3"
    assert engine.stop(grace_s=5) is True
    assert engine.probe()["alive"] is False
    assert engine.stop() is False


def test_an_engine_whose_health_answers_after_a_second_becomes_healthy(make) -> None:
    engine = make("--health-delay", "1.2")  # as SGLang's /health, which runs a generation first
    engine.start()
    wait_healthy("e0", engine.probe, timeout_s=20, interval_s=0.1)


def test_dead_child_fails_fast_with_its_output(make) -> None:
    engine = make("--exit-code", "3")
    engine.start()
    with pytest.raises(ShimError) as err:
        wait_healthy("e0", engine.probe, timeout_s=30, interval_s=0.1)
    assert err.value.code == "REEF_ERR_ENGINE_START"
    assert "exited with code 3" in err.value.message
    assert "fake engine: refusing to start (model /models/tiny)" in err.value.message


def test_health_timeout(make) -> None:
    engine = make("--startup-delay", "60")
    engine.start()
    with pytest.raises(ShimError) as err:
        wait_healthy("e0", engine.probe, timeout_s=0.5, interval_s=0.1)
    assert err.value.code == "REEF_ERR_ENGINE_START"
    assert "/health not ready after" in err.value.message


def test_health_timeout_carries_what_the_engine_wrote(make) -> None:
    # Without it the user of a stuck engine learns only that 290 s went by, not where it is stuck.
    engine = make("--startup-delay", "60")
    engine.start()
    deadline = time.monotonic() + 20
    while "listening" not in engine.tail() and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(ShimError) as err:
        wait_healthy("e0", engine.probe, timeout_s=0.3, interval_s=0.1, output=engine.tail)
    assert "/health not ready after" in err.value.message
    assert "last output:\nfake engine listening on 127.0.0.1:" in err.value.message

    def unreadable() -> str:
        raise RuntimeError("actor died")

    with pytest.raises(ShimError, match=r"its output could not be read \(RuntimeError: actor died\)"):
        wait_healthy("e0", engine.probe, timeout_s=0.1, interval_s=0.1, output=unreadable)


def test_health_budget_counts_from_the_launch() -> None:
    # The launch already spent the budget: the first unhealthy probe ends the wait.
    probes: list[float] = []

    def probe() -> dict:
        probes.append(time.monotonic())
        return {"healthy": False, "alive": True, "returncode": None, "tail": ""}

    with pytest.raises(ShimError, match="/health not ready after 5 s"):
        wait_healthy("e0", probe, timeout_s=5, interval_s=0.1, since=time.monotonic() - 6)
    assert len(probes) == 1


def _worker_pid(engine: EngineProcess) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        words = engine.tail().split()
        if "armed" in words and "worker" in words:
            return int(words[words.index("worker") + 1])
        time.sleep(0.05)
    raise AssertionError(f"no worker pid in the engine log: {engine.tail()!r}")


def test_stop_ends_the_workers_of_an_engine_whose_main_process_exited(tmp_path: Path) -> None:
    engine = EngineProcess("e0", [sys.executable, "-c", CRASHED_LEADER], "127.0.0.1", 1, str(tmp_path / "e0.log"))
    engine.start()
    worker = None
    try:
        worker = _worker_pid(engine)
        assert engine.proc is not None and engine.proc.wait(timeout=30) == 3
        assert proc_stat(worker) is not None and os.getpgid(worker) == engine.pid
        assert engine.stop(grace_s=0.5) is False  # the main process was not running
        assert proc_stat(worker) is None
    finally:
        if worker is not None and proc_stat(worker) is not None:
            os.kill(worker, signal.SIGKILL)


def test_the_engine_log_is_owner_only_and_never_written_through_a_symlink(tmp_path: Path) -> None:
    from reef_shim.engine_process import open_engine_log

    logs = tmp_path / "logs"
    os.close(open_engine_log(str(logs / "rollout-1.log")))
    assert (logs.stat().st_mode & 0o777, (logs / "rollout-1.log").stat().st_mode & 0o777) == (0o700, 0o600)
    # Another user's symlink where the log goes: the engine's output must not land in its target.
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    (logs / "rollout-2.log").symlink_to(victim)
    with pytest.raises(ShimError, match="cannot open the engine log"):
        open_engine_log(str(logs / "rollout-2.log"))
    assert victim.read_text() == "mine\n"
    # A directory of ours that others may enter is closed; a symlinked directory is refused.
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    os.chmod(open_dir, 0o755)
    os.close(open_engine_log(str(open_dir / "e.log")))
    assert open_dir.stat().st_mode & 0o777 == 0o700
    (tmp_path / "linked").symlink_to(open_dir)
    with pytest.raises(ShimError, match="is a symlink"):
        open_engine_log(str(tmp_path / "linked" / "e.log"))


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory to another user")
def test_an_engine_log_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    from reef_shim.engine_process import open_engine_log

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 12345, 12345)
    with pytest.raises(ShimError, match="belongs to uid 12345") as e:
        open_engine_log(str(theirs / "e.log"))
    assert e.value.retryable is False


# Writes 20 numbered 1000-byte lines (20,000 bytes) and exits.
CHATTY = "import sys\nfor i in range(20):\n    sys.stdout.write(f'{i:04d}' + 'x' * 995 + '\\n')\nsys.stdout.flush()\n"


def test_the_engine_log_rotates_by_size_and_keeps_its_backups(tmp_path: Path) -> None:
    # One file for the engine's whole life grew without bound under the data dir.
    log_path = tmp_path / "logs" / "e0-1.log"
    engine = EngineProcess("e0", [sys.executable, "-c", CHATTY], "127.0.0.1", 1, str(log_path),
                           log_max_bytes=3000, log_backups=2)
    engine.start()
    assert engine.proc is not None and engine.proc.wait(timeout=30) == 0
    assert engine.probe()["alive"] is False  # and the pipe drained into the files
    kept = sorted(p.name for p in log_path.parent.iterdir())
    assert kept == ["e0-1.log", "e0-1.log.1", "e0-1.log.2"]
    for p in log_path.parent.iterdir():
        assert p.stat().st_size <= 3000 and p.stat().st_mode & 0o777 == 0o600
    # Oldest first, the files hold the last 20,000 mod 3,000 + 2 × 3,000 bytes of the output.
    written = "".join(f"{i:04d}" + "x" * 995 + "\n" for i in range(20))
    joined = "".join((tmp_path / "logs" / n).read_text() for n in ["e0-1.log.2", "e0-1.log.1", "e0-1.log"])
    assert joined == written[-len(joined):] and len(joined) == 2 * 3000 + 20000 % 3000
    assert joined.endswith("0019" + "x" * 995 + "\n")
    # The tail reaches back into the rotated file when the current one is shorter than asked.
    assert engine.tail(max_chars=2500) == written[-2500:].strip()


def test_a_rotating_log_without_backups_starts_over(tmp_path: Path) -> None:
    from reef_shim.engine_process import open_engine_log
    from reef_shim.log_rotate import RotatingLog

    out = RotatingLog(str(tmp_path / "e.log"), open_engine_log, max_bytes=10, backups=0)
    out.write(b"0123456789abc")
    out.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.log"]
    assert (tmp_path / "e.log").read_bytes() == b"abc"
