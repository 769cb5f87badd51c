"""The engine's ledger: the rows of the works in flight, until each has ended.

Rows end here, whatever ended them (a run's outcomes, a cancel, a deadline, a failed
dependency, a dead model, the engine's close): their outputs or error go to their Work and
Requests, and a work whose every row has ended is finished (the Scheduler releases what it
held, the inbox's books let `wait_all()` hear of it). The engine calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from inferchain.core.batcher import ModelBatcher
from inferchain.core.callbacks import CallbackThread
from inferchain.core.inbox import Inbox
from inferchain.core.records import RunResult
from inferchain.core.request import Request, RequestState, conclude
from inferchain.core.scheduler import Scheduler
from inferchain.core.sequences import Sequences
from inferchain.core.work import Work, row_outputs
from inferchain.errors import RequestCancelled
from inferchain.shapes import crop_rows

if TYPE_CHECKING:
    from inferchain.core.workers import WorkerSet

S = RequestState


class Ledger:
    """Rows in flight and their ending (see the module docstring)."""

    def __init__(
        self,
        scheduler: Scheduler,
        sequences: Sequences,
        callbacks: CallbackThread,
        inbox: Inbox,
        batchers: Mapping[str, ModelBatcher],
    ) -> None:
        self._scheduler = scheduler
        self._sequences = sequences
        self._callbacks = callbacks
        self._inbox = inbox  # the books: what is in flight, the requests by id
        self._batchers = batchers  # per model: the one writer of its works' `taken`
        # left by a step for after it (the loop's thread): written under the engine's lock
        self.landed: list[Work] = []  # runners' step batches that finished
        self.listening: list[Request] = []  # requests that ended with done-listeners

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
            self._inbox.unqueue(work.rows)
        else:
            if work.taken < work.rows:  # e.g. its last rows' requests were cancelled while READY
                self._batchers[work.model].forget(work)
            self._scheduler.release(work)
        work.finish()
        steps = work.steps
        if steps is not None and steps.cohort is not None:
            self.landed.append(work)
        self._inbox.finished()

    def _ended(self, requests: Iterable[Request]) -> None:
        """Bookkeeping of requests that just ended."""
        inbox = self._inbox
        live = inbox.live
        scheduler = self._scheduler
        put = self._callbacks.put
        for r in requests:
            live.pop(r.id, None)
            if r.outputs is None:
                inbox.remember_failed(r)
            if scheduler.watches(r.id):
                scheduler.dependency_ended(r)
            if r.callback is not None:
                put(r)
