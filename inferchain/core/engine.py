"""The ExecutionEngine: scheduling, batching and dispatch, stepped by its loop or by a caller.

`_step(now)` is the whole control flow, in named phases, under the engine's lock, whichever
thread runs it:

1. `_take_results`: what the executors gave back (`RunResult`, `WorkerChanged`), settled in
   one place (`_on_result`): the stream goes back, the metrics take the run, the outputs go
   to their Works and Requests, and the Scheduler releases what finished works held;
2. `_take_submissions`: new Works into the Scheduler (admitted at once where they fit), then
   the cancels callers made;
3. the sequence steps whose batching window passed (`Sequences.due`);
4. `Scheduler.schedule(now)` until it has nothing more (`_apply`): admitted works go to
   their model's batcher, expired and failed ones end;
5. the partial batches of `batching: fill` / `wait` models that a flush asked for may leave;
6. `_dispatch`: per model, runs of same-shape batches to free (worker, stream) pairs, each
   handed to an executor: the worker's own thread (`ModelWorker.dispatch`), or the thread
   stepping the engine for a caller (`run_until`), where the model's sessions may run on any
   thread and its worker has nothing else in flight (`ModelWorker.execute`, after the step,
   outside the lock). Both give back the same `RunResult`, settled by the next step.

The loop thread steps when woken; `run_until` steps on the caller's thread while the caller's
work can run there, and leaves the rest to the loop. After the loop's steps only, outside the
lock, `_after_step` runs the code a step must not run under it: the done-listeners of the
requests that ended, and the sequence layer's steppers (`Sequences.after`). Lower layers
never call upward: executors and the sequence layer post records to the `Inbox`. The loop
sleeps until something arrives, the next deadline or the end of a batching window: an idle
engine uses no CPU. Every field is written under `_lock`, except the inbox's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from inferchain.core.callbacks import CallbackThread
from inferchain.core.inbox import Inbox
from inferchain.core.ledger import Ledger
from inferchain.core.records import EMPTY_PLAN, BatchKey, Plan, Run, RunResult, failed_run
from inferchain.core.request import Request, RequestState, advance
from inferchain.core.scheduler import Scheduler
from inferchain.core.sequences import Sequences
from inferchain.core.work import Work
from inferchain.core.workers import WorkerSet, stop_all
from inferchain.errors import BackendError, Closed, RequestCancelled, RequestTimeout
from inferchain.logs import get_logger, log_safely
from inferchain.metrics import Metrics
from inferchain.shapes import envelope

if TYPE_CHECKING:  # the engine reads a worker's surface only: no backend is imported
    from inferchain.core.worker import ModelWorker


log = get_logger(__name__)

S = RequestState
_INF = float("inf")
Skip = set[BatchKey]  # groups pinned to an instance with no room now


class ExecutionEngine:
    """Owns the loop thread, the batchers, the workers' streams and the callback thread."""

    def __init__(
        self,
        scheduler: Scheduler,
        models: Iterable[WorkerSet],
        sequences: Sequences,
        metrics: Metrics,
        inbox: Inbox,
    ) -> None:
        """Everything it drives, built before it: the workers and the sequence layer post
        to `inbox`."""
        self._scheduler = scheduler
        self._models = {m.name: m for m in models}
        self._sequences = sequences
        self._metrics = metrics
        self._inbox = inbox
        self._lock = threading.Lock()  # held by every step, whichever thread runs it
        self._flush = False  # a flush of `batching: fill` / `wait` models was asked for ...
        self._flush_if_stalled = False  # ... or one only when nothing else can run
        self._here: list[tuple[ModelWorker, Run]] = []  # inline runs of a caller's step
        self._inline: list[Run] = []  # inline runs not yet settled
        self._inline_back = threading.Condition(self._lock)  # close() waits for them here
        self._closing = False
        self._halted = False  # close() stopped the workers: nothing more is dispatched
        self._callbacks = CallbackThread()
        batchers = {name: m.batcher for name, m in self._models.items()}
        self.ledger = Ledger(scheduler, sequences, self._callbacks, inbox, batchers)
        self._thread = threading.Thread(target=self._loop, name="inferchain-engine", daemon=True)

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop and callback threads."""
        self._callbacks.start()
        self._thread.start()

    def close(self, callbacks_timeout: float | None = None) -> None:
        """Wait for the inline runs to come back, stop every worker (each finishes its
        queue), settle their last results, then stop the loop and the callback thread (for
        at most `callbacks_timeout` seconds: a user callback may never end)."""
        with self._lock:  # a caller's thread may be running a run on a session
            self._closing = True
            self._take_results()
            while self._inline:  # settled by their callers, or here once posted
                self._inline_back.wait()
                self._take_results()
            self._halted = True  # no run goes to a worker after its stop
        stop_all([w for m in self._models.values() for w in m.workers])
        self._inbox.stop()  # refuses what comes now, and wakes the loop to end
        if self._thread.is_alive():
            self._thread.join()
        self._step_and_after(time.perf_counter())  # anything posted after the loop ended
        self._callbacks.stop(callbacks_timeout)

    # -- thread-safe surface --------------------------------------------------------------

    def submit(self, work: Work, block: bool = True) -> None:
        """Queue a WAITING work; blocks (or raises `QueueFull`) at `max_queue_size` rows."""
        self._inbox.submit(work, block=block, bounded=True)

    def run_until(self, work: Work) -> bool:
        """Submit a bulk `work` and step the engine on this thread while it can run here (a
        run of it on a free worker of a model whose sessions may run on any thread: the
        inline executor, one run per step, settled as soon as it is back); True once it has
        finished, False where it waits for the loop and the worker threads (`work.wait()`
        returns once they finished it). An interrupt of this thread in a run (e.g.
        KeyboardInterrupt) ends the work's rows not yet run, then is raised here."""
        self._inbox.submit(work, block=True, bounded=True, wake=False)  # stepped here
        result: RunResult | None = None  # the last inline run's, not yet settled
        here: tuple[ModelWorker, Run] | None = None  # the inline run in hand, not yet back
        try:
            while True:
                with self._lock:
                    timeout = None
                    if result is not None:
                        self._on_result(result)
                        if result.interrupt is not None:
                            raise result.interrupt
                        result = None
                    if work.state < S.DONE:
                        timeout = self._step(time.perf_counter(), work)
                        here = self._here.pop() if self._here else None
                    if here is None:  # the rest is the loop's: what waits, what runs after
                        if work.state < S.DONE:
                            work.arm()
                        later = timeout is not None or work.deadline is not None
                        later = later or self._leaves_work(work.model)
                        break
                worker, run = here
                try:  # the inline executor: the run on this thread, outside the lock
                    result = worker.execute(run)
                except BaseException as e:  # an interrupt outside the run's batches
                    interrupted = RequestCancelled(f"run of {run.model!r} interrupted")
                    result = failed_run(run, worker.name, interrupted, time.perf_counter())
                    result = result._replace(interrupt=e)
                here = None
        except BaseException:  # e.g. KeyboardInterrupt: nothing of the work is left hanging
            self._interrupted(work, result, here)
            raise
        if later:
            self._inbox.wake()
        return work.state >= S.DONE

    def _leaves_work(self, model: str) -> bool:
        """Under `_lock`, after a caller's last step: the loop has something to do (code to
        run after a step, rows the caller's run held up, works waiting for room)."""
        ready, waiting = self._models[model].batcher.num_ready, self._scheduler.num_waiting
        return bool(self.ledger.landed or self.ledger.listening or ready or waiting)

    def _interrupted(
        self, work: Work, result: RunResult | None, here: tuple[ModelWorker, Run] | None
    ) -> None:
        """The caller's thread was interrupted in `run_until`: settle its inline run (a
        failed one where it never came back), end the work's rows not yet run."""
        with self._lock:
            lost = [*self._here, *([here] if here is not None and result is None else [])]
            why = RequestCancelled(f"work {work.id} ({work.model}) was interrupted")
            now, self._here = time.perf_counter(), []
            results = [result] if result is not None else []
            results += [failed_run(run, worker.name, why, now) for worker, run in lost]
            for r in (r for r in results if r.run in self._inline):  # not yet settled
                self._on_result(r)
            self.ledger.drop_rows(work, why, S.CANCELLED)
        self._inbox.wake()

    def flush(self, *, if_stalled: bool = False) -> None:
        """Send the partial batches of `batching: fill` / `wait` models as they are (any
        thread); with `if_stalled`, only when nothing else is left to run (a caller that
        cannot submit more waits for them then)."""
        if if_stalled:
            self._flush_if_stalled = True
        else:
            self._flush = True
        self._inbox.wake()

    def cancel_all(self) -> int:
        """Cancel every request and work not yet running; returns how many requests."""
        with self._lock:
            works = list(self._inbox.submitted)
            works.extend(
                w for m in self._models.values() for g in m.batcher.groups.values() for w in g
            )
            works.extend(self._scheduler.waiting_works())
            works.extend(s.work for run in self._inline for s in run.slices)  # not yet run
        for work in works:
            if work.requests is None:
                work.cancel()
        return self._inbox.cancel_live()

    def wait_all(self, timeout: float | None = None) -> bool:
        """WaitForAllTaskDone: True once every submitted work has finished and no worker is
        re-initialising (within `timeout` seconds in all)."""
        return self._inbox.wait_all(timeout)

    # -- the loop -------------------------------------------------------------------------

    def _loop(self) -> None:
        timeout: float | None = None
        inbox = self._inbox
        while True:
            if timeout != 0.0:
                inbox.sleep(timeout)
            if inbox.stopping:
                return
            try:
                timeout = self._step_and_after(time.perf_counter())
            except Exception:  # a bug here must not strand every request: log and go on
                log_safely(log.exception, "engine_step_failed")
                timeout = 0.01

    def _step_and_after(self, now: float) -> float | None:
        """A step under the lock, then what it left for after it; the loop's sleep."""
        self._inbox.wake_pending = False  # before draining: a later append wakes it again
        with self._lock:
            timeout = self._step(now)
            landed, self.ledger.landed = self.ledger.landed, []
            listening, self.ledger.listening = self.ledger.listening, []
        if self._after_step(landed, listening):
            return 0.0
        return timeout

    def _step(self, now: float, caller: Work | None = None) -> float | None:
        """One step (under `_lock`); returns how long the loop may sleep (seconds; None =
        until woken). `caller`: the work of a caller stepping the engine (`run_until`),
        whose thread may run a run inline."""
        inbox = self._inbox
        flush, self._flush = self._flush, False
        if_stalled, self._flush_if_stalled = self._flush_if_stalled, False
        delivered = bool(inbox.posted)
        if delivered:
            self._take_results()
        if inbox.submitted or inbox.cancelled:
            self._take_submissions(now)
        next_due = _INF
        if self._sequences.batchers:  # phase 3: sequence steps whose window passed
            works, next_due = self._sequences.due(now)
            for work in works:  # taken in at once, by this step
                self._inbox.register(work)
                self._scheduler.add(work)
        plan = self._scheduler.schedule(now)
        while plan is not EMPTY_PLAN:  # ending rows may unblock, fail or make room for others
            self._apply(plan)
            plan = self._scheduler.schedule(now)
        if flush or (if_stalled and not delivered and self._stalled()):  # phase 5
            for batcher in (m.batcher for m in self._models.values()):  # partial batches go
                if (batcher.fill or batcher.wait) and batcher.num_ready:
                    batcher.flushing = True
        for model in self._models.values():
            if not model.batcher.num_ready:
                continue
            if self._halted:  # close() stopped the workers: these rows can never run
                for work in model.batcher.drain():
                    closed = Closed(f"work {work.id} ({work.model}): the engine closed first")
                    self.ledger.drop_rows(work, closed, S.CANCELLED)
            else:
                next_due = min(next_due, self._dispatch(model, now, caller))
        if caller is None:  # a caller's step leaves the deadlines to the loop (see run_until)
            next_due = min(next_due, self._scheduler.next_deadline, self._sequences.next_deadline)
        if next_due == _INF:
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
            self._inbox.submit(work, block=False, bounded=False, refuse=False, wake=False)
        return bool(works)

    # -- the phases of a step (under `_lock`) ---------------------------------------------

    def _take_results(self) -> None:
        """Phase 1: the executors' records (after a WorkerChanged, the dispatch of this step
        sees the worker as it is now)."""
        posted = self._inbox.posted
        while posted:
            record = posted.popleft()
            if type(record) is RunResult:
                self._on_result(record)
            else:  # healthy again after a re-load, or dead
                self._inbox.recovering_changed(-1)

    def _take_submissions(self, now: float) -> None:
        """Phase 2: new works into the Scheduler, then the cancels. Cancels are taken
        before the submissions: the work of any cancel taken here was submitted before it
        (a sequence step's work is submitted before its requests can tell the engine of a
        cancel), so it is in the Scheduler when its cancel is handled."""
        inbox, scheduler = self._inbox, self._scheduler
        cancels = []
        while inbox.cancelled:
            cancels.append(inbox.cancelled.popleft())
        submitted = inbox.submitted
        if len(submitted) == 1:  # alone: admitted at once where it fits
            work = submitted.popleft()
            if scheduler.admit(work, now):
                self._ready(work, now)
        while submitted:
            scheduler.add(submitted.popleft())
        for item in cancels:
            self.ledger.on_cancelled(item)

    def _ready(self, work: Work, now: float) -> None:
        """An admitted work joins its model's batcher."""
        self._models[work.model].batcher.add(work)
        if work.requests is not None:
            advance(work.requests, S.READY, work.lock, now)
        self._inbox.unqueue(work.rows)

    def _apply(self, plan: Plan) -> None:
        now = time.perf_counter()  # not the step's: a dependency may have ended within it
        for work in plan.admitted:
            self._ready(work, now)
        for work in plan.expired:
            late = f"work {work.id} ({work.model}) passed its deadline while {work.state.name}"
            self.ledger.drop_rows(work, RequestTimeout(late), S.TIMED_OUT)
        for work, error in plan.failed:
            self.ledger.drop_rows(work, error, S.ERROR)

    def _stalled(self) -> bool:
        """Nothing can run but partial batches of `batching: fill` / `wait` models."""
        if self._inbox.submitted or self._scheduler.num_waiting:
            return False
        seq = self._sequences
        return all(m.stalled and not seq.num_pending(m.name) for m in self._models.values())

    def _dispatch(self, model: WorkerSet, now: float, caller: Work | None) -> float:
        """Phase 6: send what is due to free (worker, stream) pairs, one run each; returns
        when a window ends. A caller's thread takes one run of its model inline, where a
        worker has nothing in flight."""
        room = model.open_room()  # healthy worker (index) -> the runs it may still take
        if not room:
            why = model.unusable()
            if why is not None:
                error = BackendError(f"every worker of model {model.name!r} is {why}")
                for work in model.batcher.drain():
                    self.ledger.drop_rows(work, error, S.ERROR)
            return _INF
        in_flight = model.in_flight
        all_idle = not any(in_flight)
        mine = caller is not None and caller.model == model.name and caller.state < S.DONE
        here = mine and model.inline
        batcher = model.batcher
        skip: Skip = set()
        while room and batcher.groups:
            key, partial, pin, due_at = batcher.due(now, all_idle, skip, caller)
            if key is None:
                return due_at
            if pin is None and len(room) == 1:
                (i,) = room
            else:
                found = self._route(model, key, pin, room, skip)
                if found is None:
                    continue
                i = found
            worker = model.workers[i]
            inline = here and in_flight[i] == 0
            slices, rows = batcher.take(key, model.batches[i], partial)
            if not slices:
                continue
            left = 0 if inline else room[i] - 1
            if left:
                room[i] = left
            else:
                del room[i]
            all_idle = False
            shape_key = slices[0].work.shape_key  # the same for every work of the group ...
            if model.longest:  # ... except where a batch takes the envelope of its rows
                shape_key = envelope([s.work.shape_key for s in slices])
            stream = model.take_stream(worker, inline)
            sent = time.perf_counter()  # not the step's `now`: a work may have come within it
            run = Run(model.name, i, stream, tuple(slices), rows, batcher.max_rows, shape_key,
                      sent)  # fmt: skip
            if inline:
                here = False
                self._inline.append(run)
                self._here.append((worker, run))
            else:
                worker.dispatch(run)
        return _INF

    def _route(
        self, model: WorkerSet, key: BatchKey, pin: int | None, room: dict[int, int], skip: Skip
    ) -> int | None:
        """The worker (index) group `key`'s next run goes to: the least loaded with room
        (fewest runs in flight, then the most room), or the instance its sequence steps
        are pinned to; None while that one has no room (the group waits: `skip`), or when
        it is dead (the group's rows fail: the state of their sequences went with it)."""
        if pin is None:
            return min(room, key=lambda k: (model.in_flight[k], -room[k]))
        if pin in room:
            return pin
        if model.workers[pin].dead:
            error = BackendError(
                f"model {model.name!r}: instance {pin}, which held these sequences' state, is dead"
            )
            for work in model.batcher.drop_group(key):
                self.ledger.drop_rows(work, error, S.ERROR)
        else:
            skip.add(key)
        return None

    # -- settling a run -------------------------------------------------------------------

    def _on_result(self, result: RunResult) -> None:
        """The one settle point of every run, whichever executor ran it."""
        run = result.run
        model = self._models[run.model]
        if model.held[run.worker]:
            self._inline.remove(run)
            if self._closing:
                self._inline_back.notify_all()
        if result.continues:  # its rest runs after the re-load, on the worker's thread
            model.held[run.worker] = False
        else:
            model.give_back_stream(run.worker, run.stream)
        if result.recovering:
            self._inbox.recovering_changed(+1)
        self._metrics.models[run.model].record_run(result.timing, run)
        if log.enabled(logging.INFO):  # the canonical line per run, where asked for
            log_safely(log.info, "run", **result.log_fields())
        self.ledger.end_run(result, model)
