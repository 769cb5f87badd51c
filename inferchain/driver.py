"""Runs a pipeline's generators over many items, their host work on a pool beside the engine.

A pipeline's `process(item)` alternates host work (reading, pre-processing, post-processing)
with requests to the engine. The driver keeps up to `max_in_flight` items in flight and runs
each item's host steps (`process(item)`, then `gen.send(outputs)` after each yield) on a
bounded pool of host threads, so that while the models run, the next items are being
prepared, and the engine sees full batches. Results come out in input order.

Ownership: the caller's thread (the one iterating `run()`) owns every structure here; a host
thread runs one step of one item's generator and posts what it did (`_Posted`) to the
caller's queue; a request's done-listener (or a future's done-callback: host work a step
handed to the host processes, `Pipeline.in_process`) counts the item's waits down and posts
it ready when the last one ends. An item's generator runs on one thread at a time, never two. With
`host_workers=0` the host steps run on the caller's thread, one at a time (with an
`item_timeout`, on one host thread, so that a stuck step can be left behind).

Stopping (the input ended, the caller left, an error, an interrupt) never waits for an event
that may have been taken already: under `_posting` the driver marks itself stopped, and
from then on a host thread whose step returns cleans its item up itself (requests cancelled,
generator closed) instead of posting it; the caller drains what was posted before without
blocking, and joins the pool (until the items' deadlines, with an `item_timeout`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import CancelledError, Future
from typing import TYPE_CHECKING, Any, Literal

import attrs

from inferchain.anchors import current_run, new_driver
from inferchain.core.request import Request
from inferchain.errors import ConfigError, RequestTimeout
from inferchain.host_pool import HostPool, host_workers
from inferchain.in_flight import Window
from inferchain.logs import get_logger
from inferchain.utilisation import HostStep

if TYPE_CHECKING:
    from inferchain.offline import OfflineInference
    from inferchain.pipeline import Pipeline, Process, Step

log = get_logger(__name__)


class _Task:
    """One item in flight: its generator and the requests its last step waits for."""

    __slots__ = (
        "abandoned",
        "busy",
        "ended",
        "gen",
        "index",
        "lock",
        "on_host",
        "remaining",
        "step",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.gen: Process | None = None
        self.step: Step = []
        self.remaining = 0  # requests of `step` not yet ended (under `lock`)
        self.lock = threading.Lock()
        self.on_host = False  # a host step of it is dispatched (the caller's thread writes)
        self.busy = False  # ... and has not posted its outcome yet (under the `_posting` lock)
        self.ended = False  # its result is in: a timed-out item's later events are stale
        self.abandoned = False  # timed out while its step ran: its thread was left to it


@attrs.frozen
class _Posted:
    """A host step ended: the item waits for requests (`finished` False), or it is done
    with `value` (its result, or the exception it raised when `ok` is False)."""

    task: _Task
    finished: bool
    ok: bool = True
    value: Any = None


_Event = _Posted | _Task  # a host step's outcome, or a task whose requests all ended


class PipelineDriver:
    """Runs `pipeline.process` over many items with at most `max_in_flight` at once (by
    default the pipeline's own `max_in_flight`) and their host steps on `host_workers`
    threads (default: `host_workers(pipeline)`; 0: the caller's thread)."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        max_in_flight: int | None = None,
        on_error: Literal["raise", "return"] = "raise",
        on_idle: Callable[[bool, bool], None] | None = None,
        workers: int | None = None,
        item_timeout: float | None = None,
    ) -> None:
        """`on_idle(ended, full)` is called each time every item in flight waits for the
        engine, just before the driver blocks: `ended` once the input has ended, `full` while
        `max_in_flight` items are in flight. By default the pipeline's `oi.flush` of the
        partial batches of `batching: fill` / `wait` models (`idle_flush`).

        `item_timeout` (seconds): an item not finished that long after it started ends
        with `RequestTimeout("timed out after S s")` in its place (its requests not yet
        running are cancelled, its generator closed) and the others go on.

        The batches of `batching: fill` models are cut at every multiple of the pipeline's
        `anchor` item positions (where `max_in_flight` holds a whole run of them; else they
        leave when no more items can start): `inferchain.anchors`."""
        if max_in_flight is None:
            max_in_flight = pipeline.max_in_flight
        if max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if item_timeout is not None and not item_timeout > 0:
            raise ConfigError(f"item_timeout must be > 0 seconds, got {item_timeout}")
        self._timeout = item_timeout
        self._deadlines: deque[tuple[float, _Task]] = deque()  # in start order = by deadline
        self._pipeline = pipeline
        # items started and not yet yielded (running, or ended and waiting for their turn)
        self._window = Window(max_in_flight)
        self._on_error = on_error
        anchor = pipeline.anchor
        if anchor is not None and max_in_flight < anchor:
            # a run of positions never fits: batches leave when no more items can start
            log.info("not_anchored", anchor=anchor, max_in_flight=max_in_flight)
            anchor = None
        self._anchor = anchor
        self._driver = new_driver()
        self._on_idle = on_idle if on_idle is not None else idle_flush(pipeline.oi, anchor)
        self.workers = host_workers(pipeline) if workers is None else workers
        if self.workers < 0:
            raise ConfigError(f"host_workers must be >= 0, got {self.workers}")
        self._events: queue.SimpleQueue[_Event] = queue.SimpleQueue()
        self._results: dict[int, tuple[bool, Any]] = {}  # index -> (ok, result or error)
        self._active: dict[int, _Task] = {}
        self._on_host = 0  # host steps dispatched whose outcome is not yet taken
        self._pool: HostPool | None = None
        self._posting = threading.Lock()  # guards _stopped and every task's `busy`
        self._stopped = False  # from then on a host thread cleans up what its step left
        metrics = pipeline.oi.metrics
        self._activity = metrics.activity  # an item in flight counts as activity ...
        self._host = metrics.host  # ... and its host steps as the host pool's busy time

    def run(self, items: Iterable[Any]) -> Iterator[Any]:
        """The results of `items`, in input order (see the class)."""
        threads = self.workers or (1 if self._timeout is not None else 0)
        self._host.started(threads)
        if threads:
            self._pool = HostPool(threads)
        source = enumerate(items)
        next_out = 0
        exhausted = False
        try:
            while True:
                while next_out in self._results:
                    ok, value = self._results.pop(next_out)
                    self._window.leave()
                    next_out += 1
                    if not ok and self._on_error == "raise":
                        raise value
                    yield value
                while not exhausted and self._window.fits():
                    nxt = next(source, None)
                    if nxt is None:
                        exhausted = True
                    else:
                        self._start(*nxt)
                        self._take_ready()
                if next_out in self._results:
                    continue
                if exhausted and not self._active and not self._results:
                    return
                if self._events.empty() and self._on_host == 0:
                    self._on_idle(exhausted, self._window.full())
                event = self._next_event()
                if event is not None:
                    self._take(event)
        except (KeyboardInterrupt, SystemExit):
            self._stop(wait=False)  # the user wants out now: running steps end on their own
            raise
        finally:
            self._stop()

    # -- the caller's thread --------------------------------------------------------------

    def _start(self, index: int, item: Any) -> None:
        task = _Task(index)
        self._active[index] = task
        self._window.enter()
        self._activity.enter()
        if self._timeout is not None:
            self._deadlines.append((time.monotonic() + self._timeout, task))
        self._dispatch(task, lambda: self._begin(task, item))

    def _next_event(self) -> _Event | None:
        """The next event; None once an item's time is up (it has then ended with its
        timeout error). Blocks until one or the other."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][1].ended:
            deadlines.popleft()
        if not deadlines:
            return self._events.get()
        due, task = deadlines[0]
        try:
            return self._events.get(timeout=max(due - time.monotonic(), 0.0))
        except queue.Empty:
            deadlines.popleft()
            self._time_out(task)
            return None

    def _time_out(self, task: _Task) -> None:
        """End `task` with its timeout error; its generator is closed now, or, while a host
        step of it runs, once that step is back (`_take`): a step that runs is left to its
        thread, which the pool replaces, so that a step that never returns holds nothing."""
        for r in _requests(task.step):
            r.cancel()  # those not yet running; a running one ends on its own, unheard
        if not task.on_host:
            self._close(task)
        elif self._pool is not None and self._pool.abandon(task):
            task.abandoned = True  # its outcome, if it ever comes, is not counted
            self._on_host -= 1
        error = RequestTimeout(f"timed out after {self._timeout:g} s")
        self._end(task, False, error)

    def _close(self, task: _Task) -> None:
        if task.gen is None:
            return
        try:
            task.gen.close()
        except Exception as e:  # the item's own clean-up failed: it has ended anyway
            log.warning("item_close_failed", index=task.index, error=repr(e))

    def _end(self, task: _Task, ok: bool, value: Any) -> None:
        task.ended = True
        del self._active[task.index]
        self._results[task.index] = (ok, value)
        self._activity.leave()

    def _dispatch(self, task: _Task, step: Callable[[], _Posted]) -> None:
        """Run one host step of `task`: on the pool, or here (its outcome queued either way)."""
        self._on_host += 1
        task.on_host = True
        if self._pool is None:
            try:
                event = self._timed(task, step)
            except BaseException:  # e.g. KeyboardInterrupt: nothing is on the host now
                self._on_host -= 1
                task.on_host = False
                raise
            self._events.put(event)
            return
        with self._posting:
            task.busy = True
        self._pool.submit(task, lambda: self._on_pool(task, step))

    def _on_pool(self, task: _Task, step: Callable[[], _Posted]) -> None:
        """A host thread: the step (skipped for an item whose time is up), its outcome
        posted to the caller, or, once the driver has stopped, its leftovers cleaned up."""
        if task.ended:
            event = _Posted(task, False)  # timed out before it started: nothing to run
        else:
            try:
                event = self._timed(task, step)
            except BaseException as e:  # the item's outcome whatever it is
                event = _Posted(task, True, False, e)
        with self._posting:
            task.busy = False
            if not self._stopped:
                self._events.put(event)
                return
        if not event.finished:  # nobody takes it now: what the step started ends here
            self._abort(task)

    def _timed(self, task: _Task, step: Callable[[], _Posted]) -> _Posted:
        """`step()` with the task's anchored run current, its time recorded as the host
        pool's (any thread)."""
        start = time.perf_counter()
        token = None
        if self._anchor is not None:
            token = current_run.set((self._driver, task.index // self._anchor))
        try:
            return step()
        finally:
            if token is not None:
                current_run.reset(token)
            thread = threading.current_thread().name
            self._host.record(HostStep(thread, start, time.perf_counter(), task.index))

    def _take_ready(self) -> None:
        """Take the events already queued, without blocking (keeps the caller's queue short
        while it starts items)."""
        while not self._events.empty():
            self._take(self._events.get())

    def _take(self, event: _Event) -> None:
        if isinstance(event, _Task):  # its requests ended: the next host step
            if not event.ended:
                self._dispatch(event, lambda: self._resume(event))
            return
        task = event.task
        if not task.abandoned:
            self._on_host -= 1
        task.on_host = False
        if task.ended:  # timed out while this step ran: what it started is dropped
            if not event.finished:
                self._abort(task)
            return
        if event.finished:
            self._end(task, event.ok, event.value)

    def abort(self) -> None:
        """Stop at once, as after an interrupt (the caller's own, e.g. between two results):
        the steps running are not waited for; they clean up after themselves."""
        self._stop(wait=False)

    def _stop(self, wait: bool = True) -> None:
        """End what is in flight: cancel the requests items wait for, stop the pool (the
        steps not started are dropped, those running may end until the items' deadlines,
        or the recipe's `drain_timeout_s` without an `item_timeout`, not at all without
        `wait`, and clean up after themselves), take what was posted without waiting, close
        every generator no thread runs. Nothing here waits for an event. Once is enough (a
        second call does nothing)."""
        with self._posting:
            if self._stopped:
                return
            self._stopped = True
        for task in self._active.values():
            for r in _requests(task.step):
                r.cancel()
        dropped: list[Any] = []
        try:
            if self._pool is not None:
                bound = self._timeout or self._pipeline.recipe.scheduler.drain_timeout_s
                deadline = time.monotonic() + bound
                dropped = self._pool.stop(deadline if wait else time.monotonic())
        finally:
            self._pool = None
            self._clean_up(dropped)

    def _clean_up(self, dropped: list[Any]) -> None:
        """After `_stop`: the tasks whose steps were `dropped` never ran them; every task
        that no thread runs now is aborted (a running one aborts itself)."""
        with self._posting:
            for task in dropped:
                task.busy = False
        while not self._events.empty():  # posted before the stop: its items end here
            event = self._events.get()
            if isinstance(event, _Posted) and not event.finished:
                self._abort(event.task)
        for task in self._active.values():
            with self._posting:
                busy = task.busy
            if not busy:
                self._abort(task)
            self._activity.leave()
        self._active.clear()
        self._deadlines.clear()

    def _abort(self, task: _Task) -> None:
        """Cancel what `task`'s last step waits for and close its generator (no step of it
        runs now)."""
        for r in _requests(task.step):
            r.cancel()
        self._close(task)

    # -- a host thread (or the caller's, without a pool) -----------------------------------

    def _begin(self, task: _Task, item: Any) -> _Posted:
        try:
            gen = self._pipeline.process(item)
        except Exception as e:
            return _Posted(task, True, False, e)
        if not isinstance(gen, Generator):
            return _Posted(task, True, True, gen)
        task.gen = gen
        return self._advance(task, lambda: gen.send(None))

    def _resume(self, task: _Task) -> _Posted:
        step = task.step
        errors = [e for e in map(_error, _requests(step)) if e is not None]
        gen = task.gen
        assert gen is not None
        if errors:
            error = errors[0]
            return self._advance(task, lambda: gen.throw(error))
        if isinstance(step, list):
            values = [_value(r) for r in step]
            return self._advance(task, lambda: gen.send(values))
        value = _value(step)
        return self._advance(task, lambda: gen.send(value))

    def _advance(self, task: _Task, step: Callable[[], Step]) -> _Posted:
        try:
            yielded = step()
        except StopIteration as stop:
            return _Posted(task, True, True, stop.value)
        except Exception as e:
            return _Posted(task, True, False, e)
        requests = _requests(yielded)
        task.step = yielded
        task.remaining = len(requests) + 1  # + 1: this thread's own hold, let go below
        for r in requests:
            if isinstance(r, Request):
                r.add_done_listener(lambda _r: self._count_down(task))
            else:  # a Future: host work in a process (`Pipeline.in_process`)
                r.add_done_callback(lambda _f: self._count_down(task))
        self._count_down(task)
        return _Posted(task, False)

    def _count_down(self, task: _Task) -> None:
        """One request of `task`'s step ended (any thread): the last one queues the task."""
        with task.lock:
            task.remaining -= 1
            ready = task.remaining == 0
        if ready:
            self._events.put(task)


def idle_flush(oi: OfflineInference, anchor: int | None = None) -> Callable[[bool, bool], None]:
    """Flush the partial batches that wait for others (`batching: fill` / `wait`) once no
    more items can come to them: the input ended, or `max_in_flight` are in flight (`wait`
    ones then at once, `fill` ones only where nothing else is left to run, and never while
    anchored: a partial batch then leaves at its run's end or the input's, not by timing)."""
    kinds = {m.batching for m in oi.recipe.models}
    if not kinds & {"fill", "wait"}:
        return lambda ended, full: None  # no partial batches that wait for a flush
    partial: bool | Literal["if_stalled"] = "if_stalled" if "fill" in kinds else True
    if_full = anchor is None or "fill" not in kinds

    def on_idle(ended: bool, full: bool) -> None:
        if ended or (full and if_full):
            oi.flush(steps=False, batches=True if ended else partial)

    return on_idle


def _requests(step: Step) -> list[Request | Future[Any]]:
    """What a step waits for: requests, and futures of host work in processes."""
    return list(step) if isinstance(step, list) else [step]


def _error(waited: Request | Future[Any]) -> BaseException | None:
    if isinstance(waited, Request):
        return waited.error if waited.outputs is None else None
    if waited.cancelled():
        return CancelledError("the host work was cancelled")
    return waited.exception()


def _value(waited: Request | Future[Any]) -> Any:
    return waited.outputs if isinstance(waited, Request) else waited.result()
