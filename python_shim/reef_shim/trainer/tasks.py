"""Training tasks off the wire: decode the raw byte arrays, check their sizes, split across ranks.

Everything here runs on the shim's driver before any rank sees a task, so a malformed task fails
the `trainer-step` call with REEF_ERR_INVALID_ARGUMENT naming it, instead of crashing a rank in the
middle of a collective (which would take the whole group down).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ShimError


@dataclass
class TrainTask:
    task_id: str
    prompt_ids: np.ndarray  # int64 [P]
    response_ids: np.ndarray  # int64 [T]
    logprobs: np.ndarray  # float32 [T], recorded by the engine (ℓold)
    topk_ids: np.ndarray  # int64 [T, K]
    topk_logprobs: np.ndarray  # float32 [T, K], recorded by the engine
    reward: float
    teacher_prompt_ids: list[np.ndarray] = field(default_factory=list)  # int64 [P_h] per candidate
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    weight_version: str | None = None
    teacher_overlong: int = 0  # candidates left out: their prompt + the response exceed the context length

    @property
    def T(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def K(self) -> int:
        return int(self.topk_ids.shape[1])

    @property
    def H(self) -> int:
        return len(self.teacher_prompt_ids)

    def cost(self) -> int:
        """Tokens the step runs through the models for this task (policy + every teacher prompt)."""
        return len(self.prompt_ids) + self.T + sum(len(p) + self.T for p in self.teacher_prompt_ids)


def _array(raw: bytes, dtype: str, path: str) -> np.ndarray:
    if len(raw) % 4:
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"{path}: {len(raw)} bytes is not a whole number of 4-byte values")
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))


def _ids(raw: bytes, path: str, vocab: int) -> np.ndarray:
    ids = _array(raw, "i4", path).astype(np.int64)
    bad = (ids < 0) | (ids >= vocab)
    if bad.any():
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"{path}: token id {int(ids[bad][0])} is outside the vocabulary [0, {vocab})")
    return ids


def decode_task(raw: dict[str, Any], path: str, vocab: int) -> TrainTask:
    """One wire Task (already schema-checked by messages.py) → TrainTask; sizes and ids checked."""
    prompt = _ids(raw["promptIds"], f"{path}.promptIds", vocab)
    response = _ids(raw["responseIds"], f"{path}.responseIds", vocab)
    t, k = len(response), raw["topK"]
    if len(prompt) == 0 or t == 0:
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"{path}: prompt and response must not be empty "
                        f"({len(prompt)} prompt, {t} response tokens)")
    if k < 1:
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"{path}.topK: expected at least 1, got {k}")
    if k > vocab:
        # The ranks take the policy's and the teacher's own top-K over the vocabulary: more than
        # it holds fails torch.topk inside the step, on a rank, and takes the group down.
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"{path}.topK: {k} exceeds the vocabulary size {vocab}")
    logprobs = _array(raw["logprobs"], "f4", f"{path}.logprobs").astype(np.float32)
    if len(logprobs) != t:
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"{path}.logprobs: {len(logprobs)} values for {t} response tokens")
    # Padding ids (< 0) are allowed in a top-K row: an engine may report fewer than K tokens.
    topk_ids = _array(raw["topkIds"], "i4", f"{path}.topkIds").astype(np.int64)
    topk_lp = _array(raw["topkLogprobs"], "f4", f"{path}.topkLogprobs").astype(np.float32)
    for name, arr in (("topkIds", topk_ids), ("topkLogprobs", topk_lp)):
        if len(arr) != t * k:
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"{path}.{name}: {len(arr)} values, expected {t} x {k}")
    if (topk_ids >= vocab).any():
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"{path}.topkIds: an id is outside the vocabulary [0, {vocab})")
    if not np.isfinite(logprobs).all():
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"{path}.logprobs: holds NaN or infinite values")
    from ..engines.sampling import LOGPROB_FLOOR  # imports torch: not at shim start

    # The wire writes -inf as the floor, so the check above cannot see it: a token the engine gave
    # no probability was not sampled by it, and its ratio exp(ℓθ − ℓold) overflows to a
    # non-finite loss or gradient that fails the whole batch without naming the task.
    floored = np.flatnonzero(logprobs <= LOGPROB_FLOOR)
    if floored.size:
        i = int(floored[0])
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"{path}.logprobs[{i}]: {logprobs[i]:g} is the engine's floor "
                        f"({LOGPROB_FLOOR:g}, -inf on the wire): the engine cannot have sampled that token")
    teachers = []
    for h, p in enumerate(raw["teacherPromptIds"]):
        ids = _ids(p, f"{path}.teacherPromptIds[{h}]", vocab)
        if len(ids) == 0:
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"{path}.teacherPromptIds[{h}]: empty prompt")
        teachers.append(ids)
    s = raw["sampling"]
    return TrainTask(task_id=raw["taskId"], prompt_ids=prompt, response_ids=response, logprobs=logprobs,
                     topk_ids=topk_ids.reshape(t, k), topk_logprobs=topk_lp.reshape(t, k), reward=float(raw["reward"]),
                     teacher_prompt_ids=teachers, temperature=float(s["temperature"]), top_p=float(s["topP"]),
                     top_k=int(s["topK"]), weight_version=raw["weightVersion"])


def decode_tasks(raw: list[dict[str, Any]], vocab: int, max_len: int) -> list[TrainTask]:
    """The batch's tasks. A task whose own prompt + response exceed `max_len` fails the batch; a
    teacher candidate that does is left out of its task (counted in `teacher_overlong`): the hint
    makes the teacher's prompt longer than the turn the gateway admitted, so a turn that fit may
    not fit with its hint, and that must cost the turn its distillation term, not the batch."""
    if not raw:
        raise ShimError("REEF_ERR_INVALID_ARGUMENT", "trainer-step.tasks: a batch needs at least one task")
    tasks = [decode_task(r, f"trainer-step.tasks[{i}]", vocab) for i, r in enumerate(raw)]
    for i, t in enumerate(tasks):
        if len(t.prompt_ids) + t.T > max_len:
            raise ShimError("REEF_ERR_INVALID_ARGUMENT", f"trainer-step.tasks[{i}]: {len(t.prompt_ids) + t.T} tokens "
                            f"exceed the model's context length {max_len}")
        fits = [p for p in t.teacher_prompt_ids if len(p) + t.T <= max_len]
        t.teacher_overlong = len(t.teacher_prompt_ids) - len(fits)
        t.teacher_prompt_ids = fits
    return tasks


def shard(tasks: list[TrainTask], world: int) -> list[list[int]]:
    """Task indices per rank, balanced by cost (largest first onto the least loaded rank).

    Deterministic, so a retried batch lands on the ranks the same way. A rank may get none when
    there are fewer tasks than ranks; it still takes part in every collective of the step.
    """
    loads = [0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(tasks)), key=lambda i: (-tasks[i].cost(), i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        out[r].append(i)
        loads[r] += tasks[i].cost()
    return [sorted(ix) for ix in out]
