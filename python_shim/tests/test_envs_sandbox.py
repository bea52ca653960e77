"""The sandbox stops a command that escapes, runs forever, forks without end or floods output,
and nothing outside its directory changes. Run under every isolation this host offers."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket

import pytest

from reef_shim.envs.sandbox import Limits, Sandbox, bwrap_works, kill_uid

ISOLATIONS = [i for i, ok in (("bwrap", bwrap_works()), ("uid", os.geteuid() == 0), ("rlimits", os.geteuid() != 0)) if ok]
FAST = Limits(wall_s=5, output_bytes=4096, processes=24, memory_bytes=256 * 1024 * 1024, file_bytes=1024 * 1024)
SHORT = dataclasses.replace(FAST, wall_s=0.5)  # for the runs that are meant to hit the wall limit


@pytest.fixture(params=ISOLATIONS)
def sandbox(request):
    sb = Sandbox(FAST, isolation=request.param)
    yield sb
    sb.close()


@pytest.fixture
def canary(tmp_path_factory):
    """A directory outside the sandbox, readable by all and writable by its owner only, as most of a
    system is (world-writable places such as /tmp are the `uid` isolation's documented gap)."""
    d = tmp_path_factory.mktemp("canary")
    os.chmod(d, 0o755)
    os.chmod(os.path.dirname(d), 0o755)
    (d / "canary.txt").write_text("untouched\n")
    os.chmod(d / "canary.txt", 0o644)
    return d


def snapshot(d) -> dict[str, str]:
    out = {}
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(root, n)
            out[os.path.relpath(p, d)] = "<dir>" if os.path.isdir(p) else open(p).read()
    return out


def no_process_left(sb: Sandbox) -> bool:
    return sb.uid is None or kill_uid(sb.uid) == 0


def test_escape_attempts_change_nothing_outside(sandbox, canary):
    if sandbox.isolation == "rlimits":
        pytest.skip("isolation rlimits (not root, no working bwrap) guards no writes, as docs/agents-envs.md says")
    before = snapshot(canary)
    c = str(canary)
    attempts = [
        "echo x > ../x",  # the parent
        f"echo x > {c}/new.txt",  # an absolute path
        f"echo pwned > {c}/canary.txt",
        f"rm -rf {c}",
        "ln -s ../ up && echo x > up/y",  # a link out
        f"ln -s {c}/canary.txt link && echo pwned > link",
        f"ln -s {c} out && touch out/z",
        "cd .. && touch w && mkdir v",
    ]
    for cmd in attempts:
        sandbox.run(cmd)
    assert snapshot(canary) == before
    assert sorted(os.listdir(os.path.dirname(sandbox.path))) == ["work"]
    # The links were made, and are inside; the checker-side reader does not follow them.
    assert {"up", "link", "out"} <= set(sandbox.listing())
    assert sandbox.read_file("link") is None and sandbox.read_file("up/y") is None


def test_commands_write_inside_their_directory(sandbox):
    r = sandbox.run("mkdir -p d && echo hi > d/f && cat d/f && pwd")
    assert r.exit_code == 0 and r.stdout.split() == ["hi", sandbox.path]
    assert sandbox.read_file("d/f") == "hi\n"
    assert r.isolation == sandbox.isolation


@pytest.mark.parametrize("cmd", ["while :; do :; done", "sleep 1000"])
def test_a_command_that_runs_forever_is_killed(sandbox, cmd):
    r = sandbox.run(cmd, SHORT)
    assert r.timed_out and r.exit_code is None and r.signal is not None
    assert "killed" in r.as_tool_output()
    assert no_process_left(sandbox)


def test_a_fork_bomb_is_bounded_and_cleaned_up(sandbox):
    r = sandbox.run("f(){ f|f& }; f; sleep 1000", SHORT)
    # The process limit is what bounds it: forks fail (dash says `Cannot fork`, bash `fork: ...`),
    # and the run ends by the wall limit or by flooding stderr with those failures.
    assert "fork" in r.stderr.lower(), r
    assert r.timed_out or r.truncated
    assert no_process_left(sandbox)
    assert sandbox.run("echo alive").stdout == "alive\n"


def test_a_background_child_does_not_outlive_its_run(sandbox):
    r = sandbox.run("sleep 1000 & echo started")
    assert r.stdout == "started\n" and not r.timed_out
    assert no_process_left(sandbox)


def test_output_flood_is_cut_and_stopped(sandbox):
    r = sandbox.run("yes")
    assert r.truncated and r.exit_code is None
    assert len(r.stdout.encode()) + len(r.stderr.encode()) <= FAST.output_bytes
    assert "cut at the size limit" in r.as_tool_output()


def test_a_large_file_is_stopped_by_the_file_size_limit(sandbox):
    r = sandbox.run("head -c 4000000 /dev/zero > big; echo rc=$?")
    assert os.path.getsize(os.path.join(sandbox.path, "big")) <= FAST.file_bytes
    assert "rc=0" not in r.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for /dev/tcp")
def test_no_network_where_isolated(sandbox):
    if not sandbox.net_isolated:
        pytest.skip(f"isolation {sandbox.isolation} here gives no network namespace")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    try:
        port = srv.getsockname()[1]
        r = sandbox.run(f"bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}' && echo connected")
        assert "connected" not in r.stdout
    finally:
        srv.close()


def test_close_removes_the_directory_even_when_made_hard_to_delete():
    sb = Sandbox(FAST)
    sb.run("mkdir -p a/b && touch a/b/f && chmod 000 a/b a")
    parent = os.path.dirname(sb.path)
    sb.close()
    sb.close()  # idempotent
    assert not os.path.exists(parent)
    with pytest.raises(RuntimeError, match="after close"):
        sb.run("true")


def test_bad_limits_and_isolation_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"limits\.wall_s"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="isolation must be auto or one of"):
        Sandbox(isolation="chroot", parent_dir=str(tmp_path))
    if os.geteuid() == 0:
        os.chmod(tmp_path, 0o700)
        with pytest.raises(ValueError, match="not searchable by others"):
            Sandbox(FAST, parent_dir=str(tmp_path))
    with Sandbox(FAST) as sb:
        with pytest.raises(ValueError, match="inside the sandbox"):
            sb.write_file("../x", "no")
        with pytest.raises(ValueError, match="non-empty"):
            sb.run("  ")
