"""Checkpoint directories and the completed-batch ledger (docs/training.md "Checkpoints").

    <checkpointDir>/v<n>/model.safetensors      full weights (a tied lm_head is saved once, as the embedding)
    <checkpointDir>/v<n>/config.json            + the base model's tokenizer / generation files
    <checkpointDir>/v<n>/reef_checkpoint.json   {weightVersion, parent, batchId, createdAt}
    <checkpointDir>/reef_trainer_ledger.json    {batches: {batchId: step result + parent + fingerprint}}, the newest LEDGER_KEEP

A checkpoint is written into a hidden temporary directory and renamed into place, so a directory
named `v<n>` is always complete (the next save removes a temporary one a crash left, the next
ledger entry a `v<n>` a crash left unrecorded or the one it supersedes); the ledger
is replaced the same way (write, fsync, rename). Every file, the directory and the rename are
fsynced before the call returns: the ledger and then a release point at the checkpoint, and after
a power loss they must not point at empty files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import ShimError

LEDGER = "reef_trainer_ledger.json"
META = "reef_checkpoint.json"
# Small files that make a checkpoint a complete HF directory (the engine needs config.json). The
# tokenizer's in each form it ships in: a base with no tokenizer.json (a sentencepiece
# tokenizer.model, or a BPE vocab.json + merges.txt) gave a checkpoint AutoTokenizer could not load.
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "chat_template.jinja", "tokenizer.model", "vocab.json", "merges.txt",
          "added_tokens.json")
_VERSION = re.compile(r"^v(\d+)$")
# Batches a ledger remembers. The controller trains batches one at a time and retries only the one
# it has not committed, so the newest entry is the one a retry can hit; the rest is margin. Without
# a bound the file, rewritten and fsynced on every step, grew with every batch of the deployment.
LEDGER_KEEP = 1024
_PARTIAL = re.compile(r"^\.v\d+\.\d+\.tmp$")  # publish_dir's temporary directory


def _fsync(path: Path) -> None:
    """A file's data, or a directory's entries (which is what makes a rename in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            # Not sorted: the ledger's order is the order its batches were trained in.
            json.dump(value, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # Named by pid, a partial copy (a full disk) was never written over: one more per restart.
        tmp.unlink(missing_ok=True)
        raise
    _fsync(path.parent)


def batch_fingerprint(raw_tasks: list[dict[str, Any]]) -> str:
    """sha256 of what a batch trains, in any task order: each task's id, reward, weight version,
    prompt, response and teacher prompts (the hints). A batch id the controller forms again after
    its store lost commits (power loss, a restored backup) may hold other turns, or the same turns
    judged otherwise; the ledger must not answer those with a checkpoint trained on the first."""
    def part(b: Any) -> bytes:
        raw = b if isinstance(b, (bytes, bytearray, memoryview)) else str(b).encode()
        return len(raw).to_bytes(8, "little") + bytes(raw)

    rows = []
    for t in raw_tasks:
        fields = [t.get("taskId"), struct.pack("<d", float(t.get("reward", 0.0))), t.get("weightVersion"),
                  t.get("promptIds", b""), t.get("responseIds", b""), *t.get("teacherPromptIds", [])]
        rows.append(b"".join(part(f) for f in fields))
    h = hashlib.sha256()
    for row in sorted(rows):
        h.update(part(row))
    return h.hexdigest()


class Ledger:
    """Batch ids already trained, with the result each one answered."""

    def __init__(self, checkpoint_dir: Path) -> None:
        self.path = checkpoint_dir / LEDGER
        self.batches: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            try:
                self.batches = dict(json.loads(self.path.read_text())["batches"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ShimError("REEF_ERR_TRAINER", f"trainer: cannot read the batch ledger {self.path}: {e}") from e

    def get(self, batch_id: str) -> dict[str, Any] | None:
        return self.batches.get(batch_id)

    def record(self, batch_id: str, result: dict[str, Any]) -> None:
        # Memory follows the disk: an entry only here would answer "already trained" to a retry
        # and be gone after a restart.
        # A batch trained again (on the weights of a rollback) moves to the end, as the newest.
        batches = {k: v for k, v in self.batches.items() if k != batch_id}
        batches[batch_id] = result
        # Oldest first: dicts keep insertion order, and the file keeps the dict's. The entry just
        # recorded, the one a retry can hit, is always kept.
        for old in list(batches)[: max(0, len(batches) - LEDGER_KEEP)]:
            del batches[old]
        newest = max(_versions(self.batches.values()), default=0)
        replaced = self.batches.get(batch_id)
        _write_json_atomic(self.path, {"batches": batches})
        self.batches = batches
        self._prune_unlisted(newest, result)
        if replaced is not None and replaced.get("weightVersion") != result.get("weightVersion"):
            # Trained again because a rollback came before its release (its publish failed): the
            # first training was never released, no entry names it now, and nothing descends from
            # it (the controller trains the next batch only after this one's release).
            self._remove(str(replaced.get("weightVersion")))

    def _remove(self, version: str) -> None:
        if _VERSION.match(version) and (self.path.parent / version).is_dir():
            shutil.rmtree(self.path.parent / version, ignore_errors=True)

    def _prune_unlisted(self, newest: int, result: dict[str, Any]) -> None:
        """Removes the `v<n>` directories above the ledger's newest version before this entry and
        below this entry's: saved by steps that never recorded them (a crash between the rename and
        the ledger write, a ledger write that failed). No reply ever named them, so no release or
        ledger entry can; nothing else removed them, each as large as the model. With no entry
        before, the directories may be releases of a ledger that was removed: left alone."""
        m = _VERSION.match(str(result.get("weightVersion")))
        if newest == 0 or m is None:
            return
        for p in self.path.parent.iterdir():
            n = _VERSION.match(p.name)
            if n and newest < int(n.group(1)) < int(m.group(1)):
                self._remove(p.name)


def _versions(entries: Any) -> list[int]:
    return [int(m.group(1)) for r in entries if (m := _VERSION.match(str(r.get("weightVersion"))))]


def next_version(checkpoint_dir: Path, ledger: Ledger) -> str:
    """`v<n>` one past every version on disk or in the ledger: monotonic across restarts, and never
    the name of a directory a crashed step may have left behind."""
    seen = [0]
    if checkpoint_dir.is_dir():
        seen += [int(m.group(1)) for p in checkpoint_dir.iterdir() if (m := _VERSION.match(p.name))]
    seen += _versions(ledger.batches.values())
    return f"v{max(seen) + 1}"


def publish_dir(out: Path, write: Callable[[Path], None]) -> None:
    """Write a checkpoint directory atomically: `write` fills a hidden temporary directory beside
    `out`, every file and the directory are fsynced, and it is renamed into place."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    # A rank that died mid-save (OOM, a killed group) left its temporary directory, as large as the
    # model, under another pid: nothing else would ever remove it. One trainer writes here at a time.
    if out.parent.is_dir():
        for p in out.parent.iterdir():
            if _PARTIAL.match(p.name):
                shutil.rmtree(p, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
        # The directory's fsync covers its entries, not the files' contents: without these a crash
        # after the rename could leave `v<n>` complete by name with empty or short files.
        for f in tmp.iterdir():
            _fsync(f)
        _fsync(tmp)
    except BaseException:
        # A full disk, most often: what was written of the copy, up to the model's size, would
        # hold the disk full for everything else on it until the next save.
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)  # a leftover of a step that crashed after its rename but before the ledger
    os.rename(tmp, out)
    _fsync(out.parent)  # the rename: the ledger written next must not name a `v<n>` a crash could lose


def save_checkpoint(state: dict[str, Any], base_model: Path, out: Path, meta: dict[str, Any]) -> float:
    """Write `state` (full tensors, CPU) as an HF directory at `out`; returns the seconds it took.
    A tied lm_head must not be in `state` (safetensors refuses tensors that share storage): the
    rank's gather leaves it out, and loading puts the embedding back in its place."""
    from safetensors.torch import save_file

    started = time.monotonic()

    def write(tmp: Path) -> None:
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for name in COPIED:
            if (base_model / name).is_file():
                shutil.copyfile(base_model / name, tmp / name)
        (tmp / META).write_text(json.dumps({**meta, "createdAt": int(time.time() * 1000)}, indent=1, sort_keys=True))

    publish_dir(out, write)
    return time.monotonic() - started


def checkpoint_version(path: Path) -> str:
    """The weight version a checkpoint directory holds: from its meta file, else its name."""
    try:
        return str(json.loads((path / META).read_text())["weightVersion"])
    except (OSError, ValueError, KeyError):
        return path.name
