"""Continuous batching for the `hf` engine: one model thread steps every running request together.

Handler threads `submit` a prepared `Run` and read its states from the returned `Ticket`. The model
thread loops:

1. take queued requests while the batch has room (`max_batch`) and no weight swap waits; a request
   whose client already left (or that arrives as the server stops) ends there, `NotStarted`;
2. prefill each newcomer alone, draw its first token, merge its KV cache into the batch;
3. decode one token for every running row in one forward, draw each row's token from its own
   generator, apply each row's finishing rules (`Run.accept`), hand the states out;
4. drop the rows that finished or whose handler cancelled.

Weights: the model thread holds the engine's `lock` from the moment its batch stops being empty
until it is empty again, and admits nobody while a swap waits (`exclusive`). A swap therefore
waits for the running batch to drain, new requests wait for the swap, and every request's tokens
come from one weight version, the one its reply names.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import torch

from .generation import GenState, Run
from .sampling import sample_rows

if TYPE_CHECKING:
    from .hf_engine import HFEngine
    from .kv_batch import KVBatch

log = logging.getLogger("reef_shim.hf_server")


class NotStarted(Exception):
    """The request left the queue without generating; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Ticket:
    """A submitted request as its handler sees it: the states the model thread hands out (every
    stable one when streaming, else the last), or the error that ended it.

    A stream's states are cumulative, so a reader that falls `MAX_PENDING` behind (a slow client)
    gets the newest one next instead of each in turn: memory stays bounded and the batch never
    waits for a socket.
    """

    MAX_PENDING = 8

    def __init__(self, run: Run) -> None:
        self.run = run
        self.cancelled = False
        self._cond = threading.Condition()
        self._pending: deque[GenState | BaseException] = deque()

    def states(self) -> Iterator[GenState]:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                item = self._pending.popleft()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finish is not None:
                return

    def cancel(self) -> None:
        """Nobody reads on: the row leaves the batch at the next step."""
        self.cancelled = True

    def publish(self) -> None:
        state = self.run.state
        if state.finish is not None:
            # Final: the model thread never touches it again.
            self._put(state)
        elif self.run.req.stream and state.stable:
            self._put(state.snapshot(), coalesce=True)

    def fail(self, error: BaseException) -> None:
        self._put(error)

    def _put(self, item: GenState | BaseException, coalesce: bool = False) -> None:
        with self._cond:
            if coalesce and len(self._pending) >= self.MAX_PENDING:
                self._pending.clear()  # only unsent cumulative states: this one contains them
            self._pending.append(item)
            self._cond.notify_all()


class Scheduler:
    def __init__(self, engine: "HFEngine", max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.engine = engine
        self.max_batch = max_batch
        self._cond = threading.Condition()
        self._queue: deque[Ticket] = deque()
        self._holds = 0  # weight swaps waiting or running
        self._running = 0  # rows in the batch, as of the last step (for the log)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="model", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def submit(self, run: Run) -> Ticket:
        ticket = Ticket(run)
        if run.finished:  # nothing to generate (a zero budget)
            run.state.weight_version = self.engine.weight_version
            run.state.adapter = run.req.lora_path
            ticket.publish()
            return ticket
        with self._cond:
            if self._closed:
                raise NotStarted("the engine is stopping")
            self._queue.append(ticket)
            self._cond.notify_all()
        return ticket

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the model with no request generating: waits for the running batch to drain; new
        requests wait until the block ends."""
        with self._cond:
            self._holds += 1
            running = self._running
            self._cond.notify_all()
        if running:
            log.info("weight swap waits for %d running request(s); new requests wait for the swap", running)
        try:
            with self.engine.lock:
                yield
        finally:
            with self._cond:
                self._holds -= 1
                self._cond.notify_all()

    # --- the model thread -------------------------------------------------------------------------
    def _loop(self) -> None:
        from .kv_batch import KVBatch  # transformers: imported once the model is (hf_engine.py)

        kv = KVBatch(self.engine.model)
        running: list[Ticket] = []
        holding = False
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._closed and not running and (self._holds or not self._queue):
                        self._cond.wait()
                    if self._closed:
                        break
                    taken: list[Ticket] = []
                    while not self._holds and self._queue and len(running) + len(taken) < self.max_batch:
                        taken.append(self._queue.popleft())
                if taken and not holding:
                    # Blocks while a swap that began after the check above copies the weights.
                    self.engine.lock.acquire()
                    holding = True
                try:
                    running += self._admit(kv, taken, running)
                    if running:
                        running = self._step(kv, running)
                except Exception as e:  # a bug or a model failure: fail the batch, keep serving
                    log.exception("a batch step failed; its %d request(s) end with an error", len(running))
                    for t in running:
                        t.fail(e)
                    running = []
                    kv = KVBatch(self.engine.model)
                with self._cond:
                    self._running = len(running)
                if not running and holding:
                    self.engine.lock.release()
                    holding = False
        if holding:
            self.engine.lock.release()
        for t in running:
            t.fail(RuntimeError("the engine stopped"))
        with self._cond:
            for t in self._queue:
                t.fail(NotStarted("the engine is stopping"))
            self._queue.clear()

    def _admit(self, kv: KVBatch, taken: list[Ticket], running: list[Ticket] | None = None) -> list[Ticket]:
        """Prefill the newcomers, draw their first tokens, merge the unfinished into `kv`. A newcomer
        whose LoRA adapter cannot be brought into memory now (every loaded one is in use by a
        running row: `lora_serving.AdapterSet.acquire`) goes back to the head of the queue."""
        joined: list[Ticket] = []
        caches = []
        deferred: list[Ticket] = []
        busy = {t.run.req.lora_path for t in running or [] if t.run.req.lora_path is not None}
        for t in taken:
            why = "the client left" if t.cancelled else t.run.should_stop()
            if why is not None:
                t.fail(NotStarted(why))
                continue
            run = t.run
            name = run.req.lora_path
            try:
                if not self.engine._acquire_adapter(name, busy):
                    deferred.append(t)
                    continue
            except Exception as e:  # unloaded since the request was checked
                t.fail(e)
                continue
            if name is not None:
                busy.add(name)
            run.state.weight_version = self.engine.weight_version
            run.state.adapter = name
            try:
                with self.engine.adapters.rows([name]):
                    logits, cache = kv.prefill(run.prompt)
                run.accept(sample_rows(logits.unsqueeze(0), [run.sampling])[0])
            except Exception as e:
                log.exception("request %s failed in its prefill", run.state.rid)
                t.fail(e)
                continue
            t.publish()
            if not run.finished and not t.cancelled:
                joined.append(t)
                caches.append(cache)
        kv.merge(caches)
        if deferred:
            with self._cond:
                self._queue.extendleft(reversed(deferred))
        return joined

    def _step(self, kv: KVBatch, running: list[Ticket]) -> list[Ticket]:
        """One decode step for every row; returns the rows still running (and cuts the rest from `kv`)."""
        with self.engine.adapters.rows([t.run.req.lora_path for t in running]):
            logits = kv.step([t.run.last_token for t in running])
        picks = sample_rows(logits, [t.run.sampling for t in running])
        keep = []
        for i, (t, pick) in enumerate(zip(running, picks)):
            if t.cancelled:
                continue
            try:
                t.run.accept(pick)
            except Exception as e:  # e.g. a decode that fails: this request only
                log.exception("request %s failed", t.run.state.rid)
                t.fail(e)
                continue
            t.publish()
            if not t.run.finished:
                keep.append(i)
        kv.keep(keep)
        return [running[i] for i in keep]
