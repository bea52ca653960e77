"""The trainer's ledger across the power-loss emulation (fsync granularity, not a real power cut:
docs/benchmarks.md "The power-loss emulation"): a writer process records batches through the real
Ledger, each batch answered "trained" is logged (fsynced, outside the watched directory), the cut
comes at a random moment, and every answered batch must be in the restored ledger with its
fingerprint. With the directory's fsync left out the same check must fail (the control)."""

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

import powercut
from reef_shim.trainer.checkpoint import Ledger

WRITER = Path(__file__).with_name("ledger_writer.py")


def _round(tmp: Path, seed: int, *flags: str) -> tuple[dict[str, str], Ledger]:
    watched, shadow = tmp / "checkpoints", tmp / "durable"
    watched.mkdir()
    rng = random.Random(seed)
    answers_before_cut = rng.randint(2, 25)
    log_path = tmp / "answered.log"
    shim = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, str(WRITER), str(watched), *flags], stdout=subprocess.PIPE, text=True,
                            env={**powercut.env(watched, shadow), "PYTHONPATH": str(shim)}, start_new_session=True)
    answered: dict[str, str] = {}
    try:
        with open(log_path, "a") as log:
            for line in proc.stdout:
                _, batch_id, fingerprint = line.split()
                log.write(line)
                log.flush()
                os.fsync(log.fileno())
                answered[batch_id] = fingerprint
                if len(answered) == answers_before_cut:
                    time.sleep(rng.uniform(0, 0.005))  # lands anywhere in the next record
                    break
        assert proc.pid in powercut.watched_pids(shadow), "the writer did not load the powercut library"
        powercut.cut(proc, watched, shadow)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    logged = dict(line.split()[1:] for line in log_path.read_text().splitlines())
    assert logged == answered
    return logged, Ledger(watched)


@pytest.mark.parametrize("seed", [1, 2])
def test_every_batch_answered_trained_survives_the_cut_with_its_fingerprint(tmp_path, seed):
    logged, ledger = _round(tmp_path, seed)
    assert logged
    for batch_id, fingerprint in logged.items():
        entry = ledger.get(batch_id)
        assert entry is not None, f"{batch_id} was answered as trained and the ledger lost it"
        assert entry["fingerprint"] == fingerprint


def test_control_without_the_directory_fsync_the_answered_batches_are_lost(tmp_path):
    # The rename that puts the ledger in place is durable only once its directory is fsynced; the
    # emulation keeps the fsynced temporary file under its own name and no ledger at all.
    logged, ledger = _round(tmp_path, 3, "--no-dir-fsync")
    assert logged
    assert not any(ledger.get(b) is not None for b in logged)
