"""FakeAcl's live objects, as its ledger (`_core.State`) holds them by handle.

Contexts, streams with their own threads, event records, landings (async copies into host
memory), loaded models, descs, datasets, finished executions, and the report queues of
callback threads. The calls that make and use them are in `_rt`, `_mdl` and `_report`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from inferchain.testing.fake_acl._calls import INTERNAL_ERROR, Fail
from inferchain.testing.fake_acl._model import CompiledModel, Gear
from inferchain.testing.fake_acl._order import Accesses, Clock, merge


@attrs.define(eq=False)
class Context:
    handle: int
    device: int
    implicit: bool = False  # the device's default context, made by set_device
    alive: bool = True


Task = Callable[[], None]  # raises Fail to report an asynchronous error


class Stream:
    """A device queue: its own thread runs the tasks in order.

    Tasks are numbered from 1 in submission order (`seq` is the last number given); `after`
    is the clock of other streams' work this stream is ordered after (`stream_wait_event`).
    """

    def __init__(self, handle: int, context: Context) -> None:
        self.handle = handle
        self.context = context
        self.seq = 0  # tasks submitted so far
        self.after: Clock = {}
        self.pending = 0  # tasks enqueued and not finished
        self.callbacks = 0  # callbacks launched and not yet run by the report thread
        self._tasks: deque[Task] = deque()
        self._cond = threading.Condition()
        self._error: Fail | None = None
        self._stopping = False
        self._thread = threading.Thread(
            target=self._loop, name=f"fake-acl-stream-{handle:#x}", daemon=True
        )
        self._thread.start()

    def submit(self, task: Task) -> int:
        """Enqueue `task`; its number. Call with the state lock held (numbers and clocks
        must agree)."""
        with self._cond:
            self._tasks.append(task)
            self.pending += 1
            self.seq += 1
            self._cond.notify_all()
            return self.seq

    def clock(self, host: Clock) -> Clock:
        """What a task submitted now is ordered after: the host's clock and `after`."""
        clock = dict(host)
        merge(clock, self.after)
        return clock

    def synchronize(self) -> Fail | None:
        """Wait for every queued task; the first asynchronous error since the last call."""
        with self._cond:
            self._cond.wait_for(lambda: self.pending == 0)
            error, self._error = self._error, None
            return error

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._tasks or self._stopping)
                if not self._tasks:
                    return
                task = self._tasks.popleft()
            error: Fail | None = None
            try:
                task()
            except Fail as e:
                error = e
            except Exception as e:  # a bug in a task must not kill the stream thread
                error = Fail(INTERNAL_ERROR, f"{type(e).__name__}: {e}")
            with self._cond:
                if error is not None and self._error is None:
                    self._error = error
                self.pending -= 1
                self._cond.notify_all()


@attrs.define(eq=False)
class Record:
    """One `record_event`: reached when the stream gets there; what it orders after."""

    stream: int
    seq: int  # the record's own task number on `stream`
    clock: Clock  # the stream's work up to the record, and what that was ordered after
    reached: threading.Event = attrs.Factory(threading.Event)
    stamp: float = 0.0  # perf_counter() when reached


class Event:
    def __init__(self, handle: int, context: Context) -> None:
        self.handle = handle
        self.context = context
        self.record: Record | None = None  # the last record_event; None = never recorded


@attrs.define(eq=False)
class Landing:
    """An async copy into host memory: it lands when the host synchronizes past it, so a
    host that reads before synchronizing reads the 0xFF poison, on every run."""

    stream: int
    seq: int
    dst: int  # host address
    data: bytes | None = None  # the bytes, once the copy ran on the stream


@attrs.frozen
class Execution:
    """One finished model execution, as `FakeAcl.executions` lists them."""

    model_id: int
    batch: int  # rows the model ran (the compiled batch or the gear)
    hw: tuple[int, int] | None  # (height, width) for a dynamic-HW model


@attrs.define(eq=False)
class LoadedModel:
    model_id: int
    compiled: CompiledModel
    context: Context
    gear: Gear  # the gear last set (the largest until set_dynamic_* is called)
    accesses: Accesses = attrs.Factory(Accesses)  # its executions, as writes per stream


@attrs.define(eq=False)
class Desc:
    handle: int
    model: LoadedModel | None = None  # filled by get_desc


@attrs.define(eq=False)
class Dataset:
    handle: int
    buffers: list[int] = attrs.Factory(list)
    gear: Gear | None = None  # put here by set_dynamic_* / set_input_dynamic_dims


@attrs.define(eq=False)
class Report:
    """One callback the stream has reached: what to call, and what it is ordered after."""

    fn: Callable[[Any], Any]
    user_data: Any
    stream: Stream
    clock: dict[int, int]  # the stream's work up to the callback task (and what that waited for)
    done: threading.Event = attrs.Factory(threading.Event)


class Reports:
    """The queue of one report thread: callbacks reached by its streams, not yet processed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[Report] = deque()
        self.launched = 0  # callbacks launched on its streams and not yet run

    def post(self, report: Report) -> None:
        with self._cond:
            self._queue.append(report)
            self._cond.notify_all()

    def take(self, timeout_s: float | None) -> list[Report]:
        """Every report queued now, waiting up to `timeout_s` (None = for ever) for one."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._queue), timeout=timeout_s)
            taken = list(self._queue)
            self._queue.clear()
            return taken
