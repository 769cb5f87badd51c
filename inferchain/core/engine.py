"""The ExecutionEngine: one loop thread that owns scheduling, batching and dispatch.

`_step(now)` is the whole control flow, in named phases, under the engine's lock:

1. `_take_results`: what the workers posted (`BatchResult`, `WorkerChanged`): the outputs
   go back to their Works and Requests, and the Scheduler releases what finished works held;
2. `_take_submissions`: new Works into the Scheduler, then the cancels callers made;
3. `_take_due_steps`: sequence steps whose batching window passed (`Sequences.due`);
4. `_schedule`: `Scheduler.schedule(now)` until it has nothing more: admitted works go to
   their model's batcher, expired and failed ones end;
5. `_mark_flushes`: partial batches of `batching: fill` / `wait` models that a flush asked
   for may leave;
6. `_dispatch`: per model, same-shape batches to free (worker, stream) pairs.

Then, on the loop thread but outside the lock, `_after_step` runs the code a step must not
run under it: the done-listeners of the requests that ended, and the sequence layer's steppers
(`Sequences.after`), whose next step batches go into the Scheduler at the next step.

Lower layers never call upward: a worker posts a record to `post()` and wakes the loop; the
sequence layer returns Works. The loop sleeps until a submission, a completion, a cancel,
the next deadline or the end of a batching window: an idle engine uses no CPU. Every field
below is written only by the loop (under `_lock`), except the inboxes and counters named as
thread-shared.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from inferchain.config import ModelConfig
from inferchain.core.callbacks import CallbackThread
from inferchain.core.records import (
    Batch,
    BatchKey,
    BatchResult,
    BatchTiming,
    Plan,
    Slice,
    WorkerChanged,
)
from inferchain.core.request import Request, RequestState, advance, conclude
from inferchain.core.scheduler import Scheduler
from inferchain.core.sequences import Sequences
from inferchain.core.work import Work, row_outputs
from inferchain.core.workers import WorkerSet
from inferchain.errors import (
    BackendError,
    Closed,
    QueueFull,
    RequestCancelled,
    RequestError,
    RequestTimeout,
)
from inferchain.logs import get_logger, log_safely
from inferchain.metrics import Metrics, ModelMetrics
from inferchain.shapes import ShapeKey, ShapePolicy, crop_rows, envelope

if TYPE_CHECKING:  # the engine reads a worker's surface only: no backend is imported
    from inferchain.core.worker import ModelWorker

log = get_logger(__name__)

S = RequestState
_FAILED_KEPT = 65536  # failed requests remembered whole for depends_on by id (then a bit)
INLINE_S = 0.0005  # streams run on the caller's thread when a model's batches are shorter


class ExecutionEngine:
    """Owns the loop thread, the batchers, the workers' streams and the callback thread."""

    def __init__(self, metrics: Metrics, max_queue_size: int) -> None:
        self._metrics = metrics
        self._max_queue = max_queue_size  # rows submitted and not yet admitted, at most
        self._models: dict[str, WorkerSet] = {}
        self._scheduler: Scheduler | None = None
        self._sequences = Sequences()
        self._inline = False  # run-now on the caller's thread is allowed (set in start)
        self._lock = threading.Lock()  # held by _step() and by the run-now path
        # thread-shared inboxes: appended by any thread, drained by the loop
        self._submitted: deque[Work] = deque()
        self._posted: deque[BatchResult | WorkerChanged] = deque()
        self._cancelled: deque[Request | Work] = deque()
        self._wakeups: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._wake_pending = False
        self._flush = False  # a flush of `batching: fill` / `wait` models was asked for ...
        self._flush_if_stalled = False  # ... or one only when nothing else can run
        # left by a step for `_after_step` (written under `_lock`, taken by the loop)
        self._landed: list[Work] = []  # runners' step batches that finished
        self._listening: list[Request] = []  # requests that ended with done-listeners
        # thread-shared counters, each under its condition
        self._space = threading.Condition()  # guards _queued; full queues wait here
        self._queued = 0  # rows submitted, not yet admitted nor dropped
        self._drains = threading.Lock()  # guards _outstanding (taken as is on hot paths)
        self._drained = threading.Condition(self._drains)  # ... and wait_all waits on it
        self._outstanding = 0  # works submitted, not yet finished
        self._recovering = 0  # workers re-initialising after failures
        self.live: dict[int, Request] = {}  # requests not yet terminal, by id
        self.failed: dict[int, Request] = {}  # the latest that ended without outputs
        self._failed_ids = bytearray()  # one bit per request id: it ended without outputs
        self._callbacks = CallbackThread()
        self._inlined: set[Work] = set()  # works running on a caller's thread (run_now)
        self._items = 0  # items running on a caller's thread in the one-item lane
        self._stopping = False
        self._halted = False  # close() stopped the workers: nothing more is dispatched
        self._closing = False  # close() waits for `_inlined` to empty: tell it when it does
        self._thread = threading.Thread(target=self._loop, name="inferchain-engine", daemon=True)

    # -- life cycle -----------------------------------------------------------------------

    def start(
        self,
        scheduler: Scheduler,
        models: Iterable[tuple[ModelConfig, Sequence[ModelWorker], ShapePolicy]],
        sequences: Sequences,
        *,
        inline: bool,
    ) -> None:
        """Take the loaded workers and the sequence layer; start the loop and callback
        threads."""
        self._scheduler = scheduler
        self._models = {c.name: WorkerSet(c, w, s) for c, w, s in models}
        self._sequences = sequences
        self._inline = inline
        self._callbacks.start()
        self._thread.start()

    def close(self, callbacks_timeout: float | None = None) -> None:
        """Stop every worker (each finishes its queue), deliver their last results, then
        stop the loop and the callback thread. Joins every thread it started (the callback
        thread for at most `callbacks_timeout` seconds: a user callback may never end)."""
        with self._drained:  # a caller's thread may be running a batch on a session
            self._closing = True
            self._drained.wait_for(lambda: not self._inlined and not self._items)
        with self._lock:  # no batch goes to a worker after its stop (a step in progress
            self._halted = True  # has dispatched its batches once the lock is free)
        workers = [w for m in self._models.values() for w in m.workers]
        for w in workers:
            w.stop()
        for w in workers:
            w.join()
        with self._space:
            self._stopping = True
            self._space.notify_all()
        self._wakeups.put(None)
        if self._thread.is_alive():
            self._thread.join()
        self._step_and_after(time.perf_counter())  # anything posted after the loop ended
        self._callbacks.stop(callbacks_timeout)

    # -- thread-safe surface --------------------------------------------------------------

    def post(self, record: BatchResult | WorkerChanged) -> None:
        """A worker's outbox: a finished batch or a change of health (worker threads)."""
        self._posted.append(record)
        self.wake()

    def wake(self) -> None:
        """Make the loop run a step soon (any thread; cheap when one is pending)."""
        if not self._wake_pending:
            self._wake_pending = True
            self._wakeups.put(None)

    def submit(self, work: Work, block: bool = True) -> None:
        """Queue a WAITING work; blocks (or raises `QueueFull`) at `max_queue_size` rows."""
        rows = work.rows
        with self._space:
            if self._stopping:
                raise Closed("the engine is stopped")
            if self._queued + rows > self._max_queue and self._queued > 0:
                if not block:
                    raise QueueFull(
                        f"waiting queue is full ({self._queued}/{self._max_queue} rows)"
                    )
                self._space.wait_for(
                    lambda: (
                        self._stopping
                        or self._queued + rows <= self._max_queue
                        or self._queued == 0
                    )
                )
                if self._stopping:
                    raise Closed("the engine is stopped")
            self._queued += rows
        self._register(work)
        self._submitted.append(work)
        self.wake()

    def submit_steps(self, work: Work) -> None:
        """Queue a batch of sequence steps (any thread). Never blocks: steps are bounded by
        the model's `max_sequences`, one each at most."""
        self._take_in(work, refuse=True)
        self._submitted.append(work)
        self.wake()

    def flush(self, *, if_stalled: bool = False) -> None:
        """Send the partial batches of `batching: fill` / `wait` models as they are (any thread);
        with `if_stalled`, only when nothing else is left to run (no batch in flight, nothing
        waiting or ready but those partial batches): a caller that cannot submit more waits
        for them then."""
        if if_stalled:
            self._flush_if_stalled = True
        else:
            self._flush = True
        self.wake()

    def cancelled(self, item: Request | Work) -> None:
        """A request was cancelled, or a work's untaken rows should be (any thread)."""
        self._cancelled.append(item)
        self.wake()

    def run_or_submit(self, work: Work, short_only: bool = False) -> None:
        """Run a bulk `work` here (`run_now`) or queue it with its waiter armed: either
        way `work.wait()` returns once it has finished."""
        if not self.run_now(work, short_only):
            work.arm()
            self.submit(work)

    def run_now(self, work: Work, short_only: bool = False) -> bool:
        """Run `work` here on the calling thread, batch by batch, while its model is idle
        (nothing waiting or ready, a worker with nothing in flight) and its sessions may
        run on any thread; with `short_only`, only where the model's batches are shorter
        than a thread hand-off is worth (`INLINE_S`). Its batches are cut and ended as
        the loop's are (a work whose rows the session takes as they are runs them in one
        stretch, `_run_stretch`); as soon as other work for the model arrives, the rows
        left go to the model's batcher like any admitted work.

        False: nothing was done (submit the work). True: it has finished, or its waiter is
        armed and the loop finishes it (`work.wait()`)."""
        if not self._inline or work.requests is not None or work.steps is not None:
            return False
        model = self._models[work.model]
        assert self._scheduler is not None
        with self._lock:  # one section before each batch, one after it
            if self._submitted or model.batcher.num_ready:
                return False
            worker = model.idle_worker()
            if worker is None or (short_only and model.batch_s[worker.index] > INLINE_S):
                return False
            if not self._scheduler.admit_now(work, time.perf_counter()):
                return False
            self._register(work)
            self._inlined.add(work)
            stretch = self._stretches(model, worker, work)
            batch = None if stretch else self._cut(model, worker, work)
        pending = True
        try:
            if batch is None:
                pending = self._run_stretch(work, model, worker, short_only)
            else:
                pending = self._run_here(work, model, worker, batch, short_only)
        finally:
            if work in self._inlined:  # _run_here raised
                with self._lock:
                    self._inlined.discard(work)
            self._tell_closer()
        if pending:  # e.g. a dependent it unblocked, or work that arrived meanwhile
            self.wake()
        return True

    def run_item(
        self,
        model: str,
        feed: list[np.ndarray],
        key: ShapeKey,
        nbytes: int,
        submitted: float,
        replay: Callable[[], Work],
    ) -> tuple[np.ndarray, ...] | BaseException | None:
        """The one-item lane, `infer()`'s: run one item (`feed`, its arrays with a row axis,
        of item shapes `key`) here on the calling thread while its model is idle, and
        return its outputs (one row each). It holds what `run_now` holds (a worker and its
        stream, the model's admission, a place in `wait_all` and `close`) and records the
        batch in the metrics as the loop does, but it builds no Work and no batch record.

        None: nothing was done (the lane is closed now: take the run-now path). A failed run
        is replayed on the records of the run-now path (`replay()` builds the item's Work)
        and handled as the loop handles a failed batch; its error comes back."""
        if not self._inline or log.enabled(logging.INFO):  # info: the batch's log line
            return None
        models = self._models[model]
        assert self._scheduler is not None
        with self._lock:
            if self._submitted or models.batcher.num_ready:
                return None
            worker = models.idle_worker()
            if worker is None or not worker.takes_items:
                return None
            if not self._scheduler.admit_rows(model, 1, nbytes):
                return None
            stream = models.take_stream(worker)
            sent = time.perf_counter()
            self._enter(sent)
            self._items += 1
        held = True  # the item holds its stream, admission and place until they are freed
        try:
            value, run_start, run_end = worker.run_item(feed, stream)
            if isinstance(value, Exception):
                work = replay()
                held = False  # _replay hands them to the item's Work
                return self._replay(work, nbytes, models, worker, stream, (sent, run_start), value)
            timing = worker.item_timing(key, stream, sent, run_start, run_end)
            with self._lock:
                held = False
                models.give_back_stream(worker.index, stream, timing.end - sent)
                self._metrics.models[model].record_rows(timing, submitted, sent, sent)
                pending = self._end_item(models, nbytes, timing.end)
        finally:
            if held:  # e.g. KeyboardInterrupt: free what the item held, then re-raise
                with self._lock:
                    models.give_back_stream(worker.index, stream, time.perf_counter() - sent)
                    self._end_item(models, nbytes)
        if pending:
            self.wake()
        return value

    def _end_item(self, models: WorkerSet, nbytes: int, now: float | None = None) -> bool:
        """A lane item ended (under `_lock`, at `now` if given): free its admission and its
        place; True when the loop has something to do after it (work that waited for the
        worker)."""
        assert self._scheduler is not None
        self._scheduler.release_rows(models.name, 1, nbytes)
        self._items -= 1
        self._leave(now)
        self._tell_closer()
        return self._pending(models)

    def _pending(self, models: WorkerSet) -> bool:
        """Under `_lock`, after a run on a caller's thread: True when the loop has
        something to do (news, or work for the model that waited for its worker)."""
        assert self._scheduler is not None
        pending = bool(self._submitted or self._posted or self._cancelled)
        pending = pending or bool(self._landed or self._listening)
        return pending or self._scheduler.has_news or models.batcher.num_ready > 0

    def _tell_closer(self) -> None:
        """A run on a caller's thread ended: wake `close()` if it waits for one."""
        if self._closing:
            with self._drained:
                self._drained.notify_all()

    def _replay(
        self,
        work: Work,
        nbytes: int,
        models: WorkerSet,
        worker: ModelWorker,
        stream: int,
        times: tuple[float, float],
        error: Exception,
    ) -> BaseException:
        """A lane item's run raised `error`: hand its admission and stream to `work` (its
        records, built now) and end it as the loop ends a failed batch. `times`: when it
        was sent and when its run started."""
        assert self._scheduler is not None
        sent, run_start = times
        with self._lock:
            self._scheduler.hand_over(work, 1, nbytes, sent)
            self._register(work)
            self._inlined.add(work)  # close() waits for it as for run_now's
            self._items -= 1
            self._leave()
            slices, rows = models.batcher.cut(work)
            batch = Batch(work.model, worker.index, stream, tuple(slices), rows, work.shape_key,
                          sent)  # fmt: skip
        try:
            result = worker.failed_inline(batch, sent, run_start, error)
            with self._lock:
                self._on_result(result)
        finally:
            with self._lock:
                self._inlined.discard(work)
            self._tell_closer()
        self.wake()  # the loop re-plans after a failure (a worker may be re-initialising)
        failed = work.item(0)
        assert isinstance(failed, BaseException)
        return failed

    def _cut(self, model: WorkerSet, worker: ModelWorker, work: Work) -> Batch:
        slices, rows = model.batcher.cut(work)
        return self._batch(model, worker, slices, rows)

    def _run_here(
        self, work: Work, model: WorkerSet, worker: ModelWorker, batch: Batch, short_only: bool
    ) -> bool:
        """run_now's batches from `batch` on; True when the loop has something to do after
        them. Ends with `work` out of `_inlined`."""
        while True:
            result = self._run_inline(worker, batch)
            with self._lock:
                self._on_result(result)
                verdict = self._after_here(work, model, worker, short_only)
                if verdict is not None:
                    return verdict
                batch = self._cut(model, worker, work)

    def _after_here(
        self,
        work: Work,
        model: WorkerSet,
        worker: ModelWorker,
        short_only: bool,
        hand_over: bool = False,
    ) -> bool | None:
        """Under `_lock`, after run_now ran rows of `work` here: None where it may go on
        here; else what `_run_here` returns, with `work` out of `_inlined` (finished, or
        its rows left in the model's batcher, the loop's now; always so with `hand_over`)."""
        if work.cancelled and not work.done:
            cancelled = RequestCancelled(f"work {work.id} ({work.model}) was cancelled")
            self._drop_rows(work, cancelled, S.CANCELLED)
        if work.done:
            self._inlined.discard(work)
            return self._pending(model)
        if (
            hand_over
            or self._submitted
            or model.batcher.num_ready
            or not (worker.healthy and model.idle(worker))
            or (short_only and model.batch_s[worker.index] > INLINE_S)
        ):  # the loop takes over: the rows left join the batcher
            work.arm()
            model.batcher.add(work)
            self._inlined.discard(work)
            return True
        return None

    def _stretches(self, model: WorkerSet, worker: ModelWorker, work: Work) -> bool:
        """run_now runs `work` in stretches (`_run_stretch`): its session takes the rows as
        they are (`takes_items`: no buffer, no layout) at its own shapes (no padding, no
        crop) and runs a batch in one call (`at_once`), and no batch log line is asked
        for."""
        return (
            worker.takes_items
            and worker.at_once
            and work.batched
            and work.exact == work.shape_key
            and not model.crops
            and not log.enabled(logging.INFO)
        )

    def _run_stretch(
        self, work: Work, model: WorkerSet, worker: ModelWorker, short_only: bool
    ) -> bool:
        """run_now's batches of a work that `_stretches`: one stretch of batches after
        another on one stream, each row range fed as a view and its outputs kept as they
        came, without batch records; one lock section per stretch, where the metrics take
        its batches together. A stretch ends where run_now would hand over after a batch
        (other work arrived, a cancel, a long batch: read without the lock, decided under
        it by `_after_here`) or at a failed run, which ends as the loop's failed batch does
        and hands the rows after it to the loop. What `_run_here` returns."""
        batcher, submitted, rows = model.batcher, self._submitted, work.rows
        size, inputs = batcher.max_rows, work.inputs
        (first, *more) = inputs
        metrics = self._metrics.models[work.model]
        run, pieces = worker.run_item, work.pieces
        start = 0
        with self._lock:
            stream = model.take_stream(worker)
            work.start()
            work.taken = rows  # a cancel the loop takes leaves the rows to the stretch
        while True:
            runs: list[tuple[int, float, float]] = []  # (rows, run start, run end) each
            result: BatchResult | None = None  # a failed batch's
            try:
                while start < rows:
                    stop = min(rows, start + size)
                    feed = [a[start:stop] for a in inputs] if more else [first[start:stop]]
                    value, run_start, run_end = run(feed, stream, stop - start)
                    if isinstance(value, Exception):
                        batch = self._rows_batch(work, worker, stream, start, stop, run_start)
                        result = worker.failed_inline(batch, run_start, run_start, value)
                        break
                    pieces.append((start, stop, value))
                    runs.append((stop - start, run_start, run_end))
                    start = stop
                    if (
                        submitted
                        or batcher.num_ready
                        or work.cancelled
                        or (short_only and run_end - run_start > INLINE_S)
                    ):
                        break
            except BaseException as e:  # e.g. KeyboardInterrupt: end the work, then re-raise
                stop = min(rows, start + size)  # the batch it interrupted, if any
                with self._lock:
                    self._stretch_ran(work, model, worker, stream if stop == start else None,
                                      start, runs, metrics)  # fmt: skip
                    work.taken = stop
                if stop > start:
                    batch = self._rows_batch(work, worker, stream, start, stop, time.perf_counter())
                    self._interrupted(worker, batch, e)
                raise
            with self._lock:
                if result is None:
                    self._stretch_ran(work, model, worker, stream, start, runs, metrics)
                else:  # the failed batch gives the stream back and ends its rows
                    self._stretch_ran(work, model, worker, None, start, runs, metrics)
                    work.taken = result.batch.slices[0].stop
                    self._on_result(result)
                verdict = self._after_here(work, model, worker, short_only, result is not None)
                if verdict is not None:
                    return verdict
                stream = model.take_stream(worker)
                work.taken = rows

    def _rows_batch(
        self, work: Work, worker: ModelWorker, stream: int, start: int, stop: int, sent: float
    ) -> Batch:
        """The batch record of rows [start, stop) of `work` alone: a stretch makes one only
        for a batch that must end as the loop's failed batches end."""
        rows = (Slice(work, start, stop, 0),)
        return Batch(work.model, worker.index, stream, rows, stop - start, work.shape_key, sent)

    def _stretch_ran(
        self,
        work: Work,
        model: WorkerSet,
        worker: ModelWorker,
        stream: int | None,
        ran: int,
        runs: list[tuple[int, float, float]],
        metrics: ModelMetrics,
    ) -> None:
        """Under `_lock`: a stretch ran the rows of `work` up to `ran` in `runs` (rows, run
        start, run end each); count its batches, give the stream back (unless None) and
        finish the work once every row has ended."""
        if runs:
            timings = worker.run_timings(work.shape_key, 0 if stream is None else stream, runs)
            metrics.record_runs(timings, work.submitted, work.admitted or runs[0][1])
        if stream is not None:
            wall = (runs[-1][2] - runs[0][1]) / len(runs) if runs else 0.0
            model.give_back_stream(worker.index, stream, wall)
        work.taken = work.ended = ran
        if ran >= work.rows:
            self._finish(work)

    def _run_inline(self, worker: ModelWorker, batch: Batch) -> BatchResult:
        try:
            return worker.run_inline(batch)
        except BaseException as e:  # e.g. KeyboardInterrupt: end the work, then re-raise
            self._interrupted(worker, batch, e)
            raise

    def _interrupted(self, worker: ModelWorker, batch: Batch, error: BaseException) -> None:
        """A batch run on the caller's thread was interrupted by `error` (no Exception:
        e.g. KeyboardInterrupt): it ends as a failed batch (its stream given back), and the
        rows of its work not yet run end CANCELLED."""
        end = time.perf_counter()
        t = batch.dispatched
        timing = BatchTiming(batch.model, worker.name, batch.rows, batch.shape_key, False,
                             t, t, end, end)  # fmt: skip
        with self._lock:
            self._on_result(BatchResult(batch, None, error, timing))
            work = batch.slices[0].work
            interrupted = RequestCancelled(f"work {work.id} ({work.model}) was interrupted")
            self._drop_rows(work, interrupted, S.CANCELLED)

    def cancel_all(self) -> int:
        """Cancel every request and work not yet running; returns how many requests."""
        count = 0
        with self._lock:
            works = list(self._submitted)
            for m in self._models.values():
                works.extend(w for g in m.batcher.groups.values() for w in g)
            assert self._scheduler is not None
            works.extend(self._scheduler.waiting_works())
            works.extend(self._inlined)
        for work in works:
            if work.requests is None:
                work.cancel()
        for request in list(self.live.values()):
            if request.state <= S.READY and request.cancel():
                count += 1
        return count

    def wait_all(self, timeout: float | None = None) -> bool:
        """WaitForAllTaskDone: True once every submitted work has finished and no worker is
        re-initialising (within `timeout` seconds in all)."""
        with self._drained:
            return self._drained.wait_for(
                lambda: self._outstanding == 0 and self._recovering <= 0, timeout
            )

    def lookup(self, id: int) -> Request | None:
        """Request `id` while it is live or after it ended without outputs (any thread); a
        stand-in ended in ERROR where only the fact of its failure is still kept; None once
        it finished DONE (or was never submitted)."""
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

    # -- the loop -------------------------------------------------------------------------

    def _loop(self) -> None:
        timeout: float | None = None
        while True:
            if timeout != 0.0:
                with contextlib.suppress(queue.Empty):
                    self._wakeups.get(timeout=timeout)
            if self._stopping:
                return
            try:
                timeout = self._step_and_after(time.perf_counter())
            except Exception:  # a bug here must not strand every request: log and go on
                log_safely(log.exception, "engine_step_failed")
                timeout = 0.01

    def _step_and_after(self, now: float) -> float | None:
        """A step under the lock, then what it left for after it; the loop's sleep."""
        with self._lock:
            timeout = self._step(now)
            landed, self._landed = self._landed, []
            listening, self._listening = self._listening, []
        if self._after_step(landed, listening):
            return 0.0
        return timeout

    def _step(self, now: float) -> float | None:
        """One step (under `_lock`); returns how long the loop may sleep (seconds; None =
        until woken)."""
        self._wake_pending = False  # before draining: a later append wakes the loop again
        # flushes asked for before this step (one asked "if stalled" before results that
        # this step delivers is moot: their caller asks again once it waits again)
        flush, self._flush = self._flush, False
        if_stalled, self._flush_if_stalled = self._flush_if_stalled, False
        delivered = self._take_results()
        self._take_submissions()
        next_due = self._take_due_steps(now)
        self._schedule(now)
        self._mark_flushes(flush or (if_stalled and not delivered and self._stalled()))
        for model in self._models.values():
            if not model.batcher.num_ready:
                continue
            if self._halted:  # close() stopped the workers: these rows can never run
                for work in model.batcher.drain():
                    closed = Closed(f"work {work.id} ({work.model}): the engine closed first")
                    self._drop_rows(work, closed, S.CANCELLED)
            else:
                next_due = min(next_due, self._dispatch(model, now))
        assert self._scheduler is not None
        next_due = min(next_due, self._scheduler.next_deadline, self._sequences.next_deadline)
        if next_due == float("inf"):
            return None
        return max(next_due - time.perf_counter(), 0.0)

    def _after_step(self, landed: list[Work], listening: list[Request]) -> bool:
        """Outside the lock (the loop's thread): the done-listeners of the requests the step
        ended, then the sequence layer's steppers. True when that gave the loop more to do
        (the next step batches are in the inbox)."""
        for request in listening:
            request.notify_listeners()  # a listener's bug strands neither the others nor steps
        works = self._sequences.after(landed, time.perf_counter())
        for work in works:
            self._take_in(work, refuse=False)
            self._submitted.append(work)
        return bool(works)

    # -- the phases of a step (under `_lock`) ---------------------------------------------

    def _take_results(self) -> bool:
        """Phase 1: the workers' records; True when some batch result was delivered."""
        posted = self._posted
        delivered = bool(posted)
        while posted:
            record = posted.popleft()
            if isinstance(record, BatchResult):
                self._on_result(record)
            else:  # WorkerChanged: healthy again, or dead
                with self._drained:
                    self._recovering -= 1
                    self._drained.notify_all()
        return delivered

    def _take_submissions(self) -> None:
        """Phase 2: new works into the Scheduler, then the cancels. Cancels are taken
        before the submissions: the work of any cancel taken here was submitted before it
        (a sequence step's work is submitted before its requests can tell the engine of a
        cancel), so it is in the Scheduler when its cancel is handled."""
        assert self._scheduler is not None
        cancels = []
        cancelled = self._cancelled
        while cancelled:
            cancels.append(cancelled.popleft())
        submitted = self._submitted
        while submitted:
            self._scheduler.add(submitted.popleft())
        for item in cancels:
            self._on_cancelled(item)

    def _take_due_steps(self, now: float) -> float:
        """Phase 3: sequence steps that leave now; returns when the next window ends."""
        works, next_due = self._sequences.due(now)
        for work in works:
            self._take_in(work, refuse=False)
            assert self._scheduler is not None
            self._scheduler.add(work)
        return next_due

    def _schedule(self, now: float) -> None:
        """Phase 4: plan until nothing more is admitted, expired or failed (ending rows may
        unblock, fail or make room for others)."""
        assert self._scheduler is not None
        plan = self._scheduler.schedule(now)
        while plan.admitted or plan.expired or plan.failed:
            self._apply(plan)
            plan = self._scheduler.schedule(now)

    def _mark_flushes(self, flush: bool) -> None:
        """Phase 5: after admission (what was submitted before the flush is in the
        batchers), the partial batches of `fill` / `wait` models may leave."""
        if flush:
            for model in self._models.values():
                batcher = model.batcher
                if (batcher.fill or batcher.wait) and batcher.num_ready:
                    batcher.flushing = True

    def _stalled(self) -> bool:
        """Nothing can run but partial batches of `batching: fill` / `wait` models."""
        assert self._scheduler is not None
        if self._submitted or self._scheduler.num_waiting:
            return False
        for model in self._models.values():
            batcher = model.batcher
            if model.busy or (batcher.num_ready and not (batcher.fill or batcher.wait)):
                return False
            if self._sequences.num_pending(model.name):
                return False
        return True

    def _apply(self, plan: Plan) -> None:
        admitted = plan.admitted
        if admitted:
            now = time.perf_counter()
            for work in admitted:
                self._models[work.model].batcher.add(work)
                if work.requests is not None:
                    advance(work.requests, S.READY, work.lock, now)
            self._unqueue(sum(w.rows for w in admitted))
        for work in plan.expired:
            timeout = RequestTimeout(
                f"work {work.id} ({work.model}) passed its deadline while {work.state.name}"
            )
            self._drop_rows(work, timeout, S.TIMED_OUT)
        for work, error in plan.failed:
            self._drop_rows(work, error, S.ERROR)

    def _dispatch(self, model: WorkerSet, now: float) -> float:
        """Phase 6: send what is due to free (worker, stream) pairs; returns when a window
        ends."""
        why = model.unusable()
        if why is not None:
            error = BackendError(f"every worker of model {model.name!r} is {why}")
            for work in model.batcher.drain():
                self._drop_rows(work, error, S.ERROR)
            return float("inf")
        room = model.open_room()
        if not any(n > 0 for n in room.values()):
            return float("inf")
        healthy = [w for w in model.workers if w.index in room]
        all_idle = all(model.idle(w) for w in healthy)
        batcher = model.batcher
        skip: set[BatchKey] = set()  # groups pinned to an instance with no room now
        while batcher.groups:
            # the least loaded first: fewest batches in flight, then the most room
            open_ = [w for w in healthy if room[w.index] > 0]
            if not open_:
                break
            key, due_at = batcher.due(now, all_idle, skip)
            if key is None:
                return due_at
            pin = batcher.pinned(key)
            if pin is None:
                worker = min(open_, key=lambda w: (model.in_flight[w.index], -room[w.index]))
            elif model.workers[pin].dead:  # the state of its sequences went with it
                error = BackendError(
                    f"model {model.name!r}: instance {pin}, which held these sequences' "
                    "state, is dead"
                )
                for work in batcher.drop_group(key):
                    self._drop_rows(work, error, S.ERROR)
                continue
            elif room.get(pin, 0) > 0:
                worker = model.workers[pin]
            else:  # its instance is busy or re-loading: the group waits for it
                skip.add(key)
                continue
            slices, rows = batcher.take(key)
            if not slices:
                continue
            room[worker.index] -= 1
            all_idle = False
            worker.dispatch(self._batch(model, worker, slices, rows))
        return float("inf")

    def _batch(
        self, model: WorkerSet, worker: ModelWorker, slices: list[Slice], rows: int
    ) -> Batch:
        """The batch of `slices` on a stream of `worker` (the loop's and run_now's)."""
        shape_key = slices[0].work.shape_key  # the same for every work of the group ...
        if model.longest:  # ... except where a batch takes the envelope of its rows
            shape_key = envelope([s.work.shape_key for s in slices])
        stream = model.take_stream(worker)
        sent = time.perf_counter()  # not the step's `now`: a work may have come within it
        return Batch(model.name, worker.index, stream, tuple(slices), rows, shape_key, sent)

    # -- ending rows ----------------------------------------------------------------------

    def _on_result(self, result: BatchResult) -> None:
        batch = result.batch
        model = self._models[batch.model]
        model.give_back(result)
        if result.recovering:
            with self._drained:
                self._recovering += 1
        self._metrics.models[batch.model].record_batch(result.timing, batch)
        if log.enabled(logging.INFO):
            self._log_batch(result)
        outputs = result.outputs
        if outputs is None:
            error = result.error or BackendError("batch failed without an error")
            for s in batch.slices:
                self._end_slice(s, error)
            return
        whole = len(batch.slices) == 1  # the slice is the batch: its outputs as they are
        for s in batch.slices:
            work = s.work
            if not work.batched or (whole and not model.crops):
                pieces = outputs
            else:
                end = s.offset + s.rows
                pieces = tuple(o[s.offset : end] for o in outputs)
                if model.crops and work.exact != batch.shape_key:
                    pieces = tuple(crop_rows(pieces, work.exact, model.crops))
            self._end_slice(s, pieces)

    def _log_batch(self, result: BatchResult) -> None:
        """The canonical line per batch, where the application enabled info events."""
        t = result.timing
        log_safely(
            log.info,
            "batch",
            model=t.model,
            worker=t.worker,
            stream=t.stream,
            size=t.size,
            ok=t.ok,
            shape=[list(s) for s in t.shape_key],
            run_ms=round((t.run_end - t.run_start) * 1e3, 3),
            batch_ms=round((t.end - t.picked) * 1e3, 3),
            work_ids=[s.work.id for s in result.batch.slices],
        )

    def _end_slice(self, s: Slice, value: tuple[np.ndarray, ...] | BaseException) -> None:
        """The rows of slice `s` ran: their outputs (`value`, a range of the batch's) or
        the batch's error."""
        work = s.work
        if work.requests is None:
            work.pieces.append((s.start, s.stop, value))
        else:
            self._sequences.landing(work, s.rows)
            requests = work.requests[s.start : s.stop]
            if isinstance(value, BaseException):
                ended = conclude(requests, S.ERROR, work.lock, None, value, self._listening)
            else:
                outputs = row_outputs(work.names, value, work.batched)
                ended = conclude(requests, S.DONE, work.lock, outputs, None, self._listening)
            self._ended(ended)
        work.ended += s.rows
        if work.ended >= work.rows:
            self._finish(work)

    def _ended(self, requests: Iterable[Request]) -> None:
        """Bookkeeping of requests that just ended (engine thread)."""
        live = self.live
        scheduler = self._scheduler
        assert scheduler is not None
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

    def _on_cancelled(self, item: Request | Work) -> None:
        if isinstance(item, Request):
            work = item.work
            assert work is not None
            self._sequences.landing(work, 1)
            self._ended((item,))
            work.ended += 1
            if work.ended >= work.rows and not work.done:
                self._finish(work)
        elif not item.done:
            cancelled = RequestCancelled(f"work {item.id} ({item.model}) was cancelled")
            self._drop_rows(item, cancelled, S.CANCELLED)

    def _drop_rows(self, work: Work, error: BaseException, state: RequestState) -> None:
        """End the rows of `work` that were not taken into a batch."""
        if work.done:
            return
        start = work.taken
        untaken = self._take_rest(work)
        if untaken <= 0:
            return
        if work.requests is None:
            work.pieces.append((start, work.rows, error))
            work.ended += untaken
        else:
            left = work.requests[start:]
            self._sequences.landing(work, sum(not r.done() for r in left))  # before they end
            ended = conclude(left, state, work.lock, None, error, self._listening)
            self._ended(ended)
            work.ended += len(ended)
        if work.ended >= work.rows:
            self._finish(work)

    def _take_rest(self, work: Work) -> int:
        """Mark the rows of `work` not yet in a batch as taken (so no batch takes them) and
        drop them from its model's batcher; returns how many there were."""
        return self._models[work.model].batcher.forget(work)

    def _finish(self, work: Work) -> None:
        """Every row of `work` has ended: free what it held and wake its waiter; a runner's
        step batch goes to its runner after the step."""
        assert self._scheduler is not None
        if work.state is S.WAITING:
            self._scheduler.drop(work)
            self._unqueue(work.rows)
        else:
            self._take_rest(work)  # e.g. its last rows' requests were cancelled while READY
            self._scheduler.release(work)
        work.finish()
        if work.steps is not None and work.steps.cohort is not None:
            self._landed.append(work)
        self._leave()

    def _enter(self, now: float | None = None) -> None:
        """One more work (or lane item) in flight, until `_leave` (`now`: a stamp the
        caller took already)."""
        with self._drains:  # the condition's lock itself: no Python frame of a Condition's
            self._outstanding += 1
            if self._outstanding == 1:  # the engine has something in flight again
                self._metrics.engine_activity.enter(now)

    def _leave(self, now: float | None = None) -> None:
        with self._drains:
            self._outstanding -= 1
            if self._outstanding == 0:
                self._metrics.engine_activity.leave(now)
                self._drained.notify_all()

    # -- thread-shared counters -----------------------------------------------------------

    def _register(self, work: Work) -> None:
        self._enter()
        requests = work.requests
        if requests is not None:
            if work.steps is not None:  # sequence steps: their ids are not consecutive
                self.live.update((r.id, r) for r in requests)
            else:
                self.live.update(zip(range(work.id, work.id + work.rows), requests, strict=True))

    def _take_in(self, work: Work, *, refuse: bool) -> None:
        """Count the rows of `work` against the queue, with no bound, and register it;
        `refuse`: raise `Closed` once the engine is stopping."""
        with self._space:
            if refuse and self._stopping:
                raise Closed("the engine is stopped")
            self._queued += work.rows
        self._register(work)

    def _unqueue(self, rows: int) -> None:
        with self._space:
            self._queued -= rows
            self._space.notify_all()
