"""The engine's ledger: the works in flight and their rows until each has ended.

Rows end here, whatever ended them (a run's outcomes, a cancel, a deadline, a failed
dependency, a dead model, the engine's close): their outputs or error go to their Work and
Requests, a work whose every row has ended is finished (the Scheduler releases what it held)
and `wait_all()` hears of it. The engine calls it under its lock; the counters it keeps for
other threads (the queue bound, the works outstanding) are under locks of their own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from inferchain.core.batcher import ModelBatcher
from inferchain.core.callbacks import CallbackThread
from inferchain.core.records import RunResult
from inferchain.core.request import Request, RequestState, conclude
from inferchain.core.scheduler import Scheduler
from inferchain.core.sequences import Sequences
from inferchain.core.work import Work, row_outputs
from inferchain.errors import Closed, QueueFull, RequestCancelled, RequestError
from inferchain.shapes import crop_rows
from inferchain.utilisation import Activity

if TYPE_CHECKING:
    from inferchain.core.workers import WorkerSet

S = RequestState
_FAILED_KEPT = 65536  # failed requests remembered whole for depends_on by id (then a bit)


class Ledger:
    """Rows in flight and their ending (see the module docstring)."""

    def __init__(
        self,
        scheduler: Scheduler,
        sequences: Sequences,
        callbacks: CallbackThread,
        activity: Activity,
        batchers: Mapping[str, ModelBatcher],
        max_queue_size: int,
    ) -> None:
        self._scheduler = scheduler
        self._batchers = batchers  # per model: the one writer of its works' `taken`
        self._sequences = sequences
        self._callbacks = callbacks
        self._activity = activity  # the engine's "something is in flight" clock
        self._max_queue = max_queue_size  # rows submitted and not yet admitted, at most
        # left by a step for after it (the loop's thread): written under the engine's lock
        self.landed: list[Work] = []  # runners' step batches that finished
        self.listening: list[Request] = []  # requests that ended with done-listeners
        # thread-shared counters, each under its lock
        self._space_lock = threading.Lock()  # guards _queued, _space_waiters, stopping
        self._space = threading.Condition(self._space_lock)  # full queues wait here
        self._queued = 0  # rows submitted, not yet admitted nor dropped
        self._space_waiters = 0
        self.stopping = False
        self._drains = threading.Lock()  # guards _outstanding (taken as is on hot paths)
        self._drained = threading.Condition(self._drains)  # ... and wait_all waits on it
        self._outstanding = 0  # works submitted, not yet finished
        self._recovering = 0  # workers re-initialising after failures
        self._waiting = 0  # callers in wait_all (told when the last work finishes)
        self.live: dict[int, Request] = {}  # requests not yet terminal, by id
        self.failed: dict[int, Request] = {}  # the latest that ended without outputs
        self._failed_ids = bytearray()  # one bit per request id: it ended without outputs

    # -- intake (any thread) --------------------------------------------------------------

    def enqueue(self, work: Work, *, block: bool, bounded: bool, refuse: bool = True) -> None:
        """Count the rows of `work` against the queue (waiting, or raising `QueueFull`
        without `block`, at `max_queue_size` rows where `bounded`) and register it;
        `refuse`: raise `Closed` once the engine is stopping."""
        rows = work.rows
        with self._space_lock:
            if refuse and self.stopping:
                raise Closed("the engine is stopped")
            if bounded and self._queued + rows > self._max_queue and self._queued > 0:
                if not block:
                    raise QueueFull(
                        f"waiting queue is full ({self._queued}/{self._max_queue} rows)"
                    )
                self._space_waiters += 1
                try:
                    self._space.wait_for(
                        lambda: (
                            self.stopping
                            or self._queued + rows <= self._max_queue
                            or self._queued == 0
                        )
                    )
                finally:
                    self._space_waiters -= 1
                if self.stopping:
                    raise Closed("the engine is stopped")
            self._queued += rows
        with self._drains:  # the condition's lock itself: no Python frame of a Condition's
            self._outstanding += 1
            if self._outstanding == 1:  # the engine has something in flight again
                self._activity.enter()
        requests = work.requests
        if requests is not None:
            if work.steps is not None:  # sequence steps: their ids are not consecutive
                self.live.update((r.id, r) for r in requests)
            else:
                self.live.update(zip(range(work.id, work.id + work.rows), requests, strict=True))

    def unqueue(self, rows: int) -> None:
        """`rows` left the waiting queue (admitted, or dropped before)."""
        with self._space_lock:
            self._queued -= rows
            if self._space_waiters:
                self._space.notify_all()

    def stop(self) -> None:
        """Refuse every later submission and wake the callers waiting for room."""
        with self._space:
            self.stopping = True
            self._space.notify_all()

    def wait_all(self, timeout: float | None) -> bool:
        """True once every work registered has finished and no worker is re-initialising
        (within `timeout` seconds)."""
        with self._drained:
            self._waiting += 1
            try:
                return self._drained.wait_for(
                    lambda: self._outstanding == 0 and self._recovering <= 0, timeout
                )
            finally:
                self._waiting -= 1

    def recovering_changed(self, by: int) -> None:
        """A worker began re-initialising (+1), or is healthy again or dead (-1)."""
        with self._drained:
            self._recovering += by
            self._drained.notify_all()

    # -- ending rows (under the engine's lock) --------------------------------------------

    def end_run(self, result: RunResult, model: WorkerSet) -> None:
        """A run's outcomes to its slices' rows: batch i holds the run's rows [i * size,
        (i + 1) * size); a slice's rows in it get its outputs' rows (cropped back where the
        batch was padded to a bucket), or its error."""
        run, outcomes = result.run, result.outcomes
        slices = run.slices
        if len(outcomes) == 1 and len(slices) == 1:  # one batch of one work's rows, whole
            s = slices[0]
            value = outcomes[0]
            if model.crops and s.work.exact != run.shape_key and type(value) is tuple:
                value = tuple(crop_rows(value, s.work.exact, model.crops))
            self.end_rows(s.work, s.start, s.stop, value)
            return
        size, total, crops = run.size, run.rows, model.crops
        for s in slices:
            work = s.work
            lo, hi = s.offset, s.offset + s.rows
            i = lo // size
            while lo < hi:
                b0 = i * size
                b1 = b0 + size if b0 + size < total else total
                top = hi if hi < b1 else b1
                value = outcomes[i]
                if not isinstance(value, BaseException) and work.batched:
                    if lo != b0 or top != b1:
                        value = tuple(o[lo - b0 : top - b0] for o in value)
                    if crops and work.exact != run.shape_key:
                        value = tuple(crop_rows(value, work.exact, crops))
                start = s.start + lo - s.offset
                self.end_rows(work, start, start + top - lo, value)
                lo = top
                i += 1

    def end_rows(
        self, work: Work, start: int, stop: int, value: tuple[np.ndarray, ...] | BaseException
    ) -> None:
        """Rows [start, stop) of `work` ran: their outputs (`value`) or their error."""
        requests = work.requests
        if requests is None:
            work.pieces.append((start, stop, value))
        else:
            self._sequences.landing(work, stop - start)
            part = requests[start:stop]
            if isinstance(value, BaseException):
                ended = conclude(part, S.ERROR, work.lock, None, value, self.listening)
            else:
                outputs = row_outputs(work.names, value, work.batched)
                ended = conclude(part, S.DONE, work.lock, outputs, None, self.listening)
            self._ended(ended)
        work.ended += stop - start
        if work.ended >= work.rows:
            self.finish(work)

    def on_cancelled(self, item: Request | Work) -> None:
        """A request was cancelled (its row ends), or a work's untaken rows should be."""
        if isinstance(item, Request):
            work = item.work
            assert work is not None
            self._sequences.landing(work, 1)
            self._ended((item,))
            work.ended += 1
            if work.ended >= work.rows and not work.done:
                self.finish(work)
        elif not item.done:
            cancelled = RequestCancelled(f"work {item.id} ({item.model}) was cancelled")
            self.drop_rows(item, cancelled, S.CANCELLED)

    def drop_rows(self, work: Work, error: BaseException, state: RequestState) -> None:
        """End the rows of `work` that were not taken into a run (the batcher forgets
        them: none will be)."""
        if work.done:
            return
        start = work.taken
        untaken = self._batchers[work.model].forget(work)
        if untaken <= 0:
            return
        if work.requests is None:
            work.pieces.append((start, work.rows, error))
            work.ended += untaken
        else:
            left = work.requests[start:]
            self._sequences.landing(work, sum(not r.done() for r in left))  # before they end
            ended = conclude(left, state, work.lock, None, error, self.listening)
            self._ended(ended)
            work.ended += len(ended)
        if work.ended >= work.rows:
            self.finish(work)

    def finish(self, work: Work) -> None:
        """Every row of `work` has ended: free what it held and wake its waiter; a runner's
        step batch goes to its runner after the step."""
        if work.state is S.WAITING:
            self._scheduler.drop(work)
            self.unqueue(work.rows)
        else:
            if work.taken < work.rows:  # e.g. its last rows' requests were cancelled while READY
                self._batchers[work.model].forget(work)
            self._scheduler.release(work)
        work.finish()
        steps = work.steps
        if steps is not None and steps.cohort is not None:
            self.landed.append(work)
        with self._drains:
            self._outstanding -= 1
            if self._outstanding == 0:
                self._activity.leave()
                if self._waiting:
                    self._drained.notify_all()

    def _ended(self, requests: Iterable[Request]) -> None:
        """Bookkeeping of requests that just ended."""
        live = self.live
        scheduler = self._scheduler
        put = self._callbacks.put
        for r in requests:
            live.pop(r.id, None)
            if r.outputs is None:
                self._remember_failed(r)
            if scheduler.watches(r.id):
                scheduler.dependency_ended(r)
            if r.callback is not None:
                put(r)

    def _remember_failed(self, r: Request) -> None:
        failed = self.failed
        failed[r.id] = r  # remembered so that depends_on=[id] fails later too
        if len(failed) > _FAILED_KEPT:
            failed.pop(next(iter(failed)), None)
        byte = r.id >> 3
        bits = self._failed_ids
        if byte >= len(bits):
            bits.extend(bytes(max(byte + 1 - len(bits), len(bits))))
        bits[byte] |= 1 << (r.id & 7)

    # -- requests by id (any thread) ------------------------------------------------------

    def cancel_live(self) -> int:
        """Cancel every live request not yet running; returns how many were."""
        return sum(1 for r in list(self.live.values()) if r.state <= S.READY and r.cancel())

    def lookup(self, id: int) -> Request | None:
        """Request `id` while it is live or after it ended without outputs; a stand-in
        ended in ERROR where only the fact of its failure is still kept; None once it
        finished DONE (or was never submitted)."""
        found = self.live.get(id) or self.failed.get(id)
        if found is not None:
            return found
        byte = id >> 3
        bits = self._failed_ids
        if 0 <= byte < len(bits) and bits[byte] >> (id & 7) & 1:
            gone = Request(id, "(forgotten)")
            gone.try_transition(S.ERROR, error=RequestError(
                f"request {id} failed (only the fact is kept after {_FAILED_KEPT} later failures)"
            ))  # fmt: skip
            return gone
        return None
