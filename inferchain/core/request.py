"""The Request: one item on its way through the layers, and its state machine.

A Request is the one deliberately mutable record. Every state change checks `TRANSITIONS`
under the request's lock and stamps the time: one request's through `Request._move`, many of
one Work's at once through `advance` and `conclude` (the engine's hot path). Reaching a
terminal state wakes its waiters and runs its done-listeners exactly once (the engine runs
them after its step, outside its lock). The
ExecutionEngine moves a request through READY, RUNNING and its end; a `cancel()` from any
other thread is reported to the engine through `on_cancel`, so the engine hears of every
request that ends.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from inferchain.core.guard import call_user
from inferchain.errors import InvalidTransition, RequestCancelled

if TYPE_CHECKING:
    from inferchain.core.work import Work

Outputs = dict[str, np.ndarray]
Callback = Callable[["Request"], object]


class RequestState(enum.IntEnum):
    """Where a request is. Ordered: everything from DONE on is terminal."""

    WAITING = 0  # submitted; in the Scheduler's waiting queue
    READY = 1  # admitted (slot, memory, dependencies); owned by the ExecutionEngine
    RUNNING = 2  # in a batch on a ModelWorker
    DONE = 3  # outputs are set
    ERROR = 4  # error is set (BackendError, DependencyFailed, a pipeline step's error)
    CANCELLED = 5  # cancel(), cancel_all() or close(); never ran
    TIMED_OUT = 6  # deadline passed while WAITING or READY; never ran

    @property
    def is_terminal(self) -> bool:
        return self >= RequestState.DONE


S = RequestState
#: The one transition table. A RUNNING request is never cancelled or timed out: its batch
#: completes as a whole.
TRANSITIONS: Mapping[RequestState, frozenset[RequestState]] = {
    S.WAITING: frozenset({S.READY, S.ERROR, S.CANCELLED, S.TIMED_OUT}),
    S.READY: frozenset({S.RUNNING, S.ERROR, S.CANCELLED, S.TIMED_OUT}),
    S.RUNNING: frozenset({S.DONE, S.ERROR}),
    S.DONE: frozenset(),
    S.ERROR: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMED_OUT: frozenset(),
}
_ALLOWED = tuple(TRANSITIONS[s] for s in RequestState)  # indexed by state, for the hot path


class Request:
    """One item for one model: its inputs, its state, and eventually outputs or an error.

    Created by `OfflineInference.submit()`; users read it and may `cancel()` it or wait on
    `result()`. The fields are read-only from outside: the layers move the state.

    A future by duck typing, not a `concurrent.futures.Future` subclass (`isinstance` is
    False, `asyncio.wrap_future` refuses it): it has Future's `result(timeout)`,
    `exception(timeout)`, `done()`, `running()`, `cancelled()`, `cancel()` and
    `add_done_callback(fn)`, works with `concurrent.futures.wait` and `as_completed`, and
    `await request` works in asyncio. It has no `set_result` / `set_exception`: only the
    layers end it.
    """

    __slots__ = (
        "__weakref__",
        "_created_at",
        "_ended_at",
        "_fwaiters",
        "_inputs",
        "_listeners",
        "_lock",
        "_on_cancel",
        "_phase",
        "_ready_at",
        "_running_at",
        "_waiter",
        "callback",
        "deadline",
        "depends_on",
        "error",
        "id",
        "model",
        "outputs",
        "priority",
        "row",
        "work",
    )

    def __init__(
        self,
        id: int,
        model: str,
        inputs: tuple[np.ndarray, ...] | None = None,
        *,
        priority: int = 0,
        deadline: float | None = None,
        depends_on: tuple[Request, ...] = (),
        callback: Callback | None = None,
        on_cancel: Callable[[Request], None] | None = None,
        work: Work | None = None,
        row: int = 0,
        lock: threading.RLock | None = None,
        created: float | None = None,
    ) -> None:
        """`inputs`: one array per model input; None = row `row` of `work`'s inputs. `lock`
        is shared by the requests of one Work (their transitions then batch under it)."""
        self.id = id  # unique and increasing per OfflineInference
        self.model = model  # name of the model in the recipe
        self._inputs = inputs
        self.priority = priority  # higher runs first
        self.deadline = deadline  # time.perf_counter() seconds; None = no deadline
        self.depends_on = depends_on  # requests that must be DONE before this one runs
        self.callback = callback  # called with the request once terminal (callback thread)
        self.outputs: Outputs | None = None  # name -> array, once DONE
        self.error: BaseException | None = None  # once ERROR / CANCELLED / TIMED_OUT
        self._lock = threading.RLock() if lock is None else lock
        self._phase = RequestState.WAITING
        # when it entered each state (each is entered once at most; no list: one object
        # fewer per request for the cyclic GC to walk)
        self._created_at = time.perf_counter() if created is None else created
        self._ready_at: float | None = None
        self._running_at: float | None = None
        self._ended_at: float | None = None  # entering its terminal state, `_phase`
        self._waiter: threading.Lock | None = None  # held until terminal; see wait()
        self._listeners: list[Callable[[Request], None]] | None = None
        self._fwaiters: list[Any] | None = None  # concurrent.futures.wait() waiters
        self._on_cancel = on_cancel  # tells the engine of a cancel() made on another thread
        self.work = work  # the Work that carries this item
        self.row = row  # this item's row in that Work

    def __repr__(self) -> str:
        return f"<Request {self.id} {self.model} {self._phase.name}>"

    @property
    def state(self) -> RequestState:
        return self._phase

    @property
    def inputs(self) -> tuple[np.ndarray, ...]:
        """One array per model input, in the model's input order; () once finished."""
        if self._inputs is not None:
            return self._inputs
        work = self.work
        if work is None or self._phase >= RequestState.DONE or not work.inputs:
            return ()
        return tuple(a[self.row] for a in work.inputs) if work.batched else work.inputs

    def done(self) -> bool:
        """True once the request is in a terminal state (as `Future.done()`)."""
        return self._phase >= RequestState.DONE

    def running(self) -> bool:
        """True while its batch runs (as `Future.running()`)."""
        return self._phase is RequestState.RUNNING

    def cancelled(self) -> bool:
        """True if it ended CANCELLED (as `Future.cancelled()`)."""
        return self._phase is RequestState.CANCELLED

    @property
    def timings(self) -> dict[str, float]:
        """`time.perf_counter()` of each state the request has entered, by state name."""
        return {s.name: t for s in RequestState if (t := self.stamp(s)) is not None}

    def stamp(self, state: RequestState) -> float | None:
        """When the request entered `state` (perf_counter seconds), or None."""
        if state is RequestState.WAITING:
            return self._created_at
        if state is RequestState.READY:
            return self._ready_at
        if state is RequestState.RUNNING:
            return self._running_at
        return self._ended_at if state is self._phase else None

    def _stamp(self, to: RequestState, now: float) -> None:
        """Stamp entering the non-terminal state `to`."""
        if to is RequestState.READY:
            self._ready_at = now
        else:
            self._running_at = now

    # -- transitions ---------------------------------------------------------------------

    def transition(
        self,
        to: RequestState,
        *,
        outputs: Outputs | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Move to `to`; raise `InvalidTransition` if the table forbids it."""
        if not self._move(to, outputs, error):
            raise InvalidTransition(
                f"request {self.id} ({self.model}): {self._phase.name} -> {to.name} is not allowed"
            )

    def try_transition(
        self,
        to: RequestState,
        *,
        outputs: Outputs | None = None,
        error: BaseException | None = None,
    ) -> bool:
        """Move to `to` if the table allows it now; False (and no change) otherwise."""
        return self._move(to, outputs, error)

    def _move(self, to: RequestState, outputs: Outputs | None, error: BaseException | None) -> bool:
        with self._lock:
            if to not in _ALLOWED[self._phase]:
                return False
            if to >= RequestState.DONE:
                self._end(to, time.perf_counter(), outputs, error)
            else:
                self._phase = to
                self._stamp(to, time.perf_counter())
                return True
        self._wake()
        return True

    def _end(
        self, to: RequestState, now: float, outputs: Outputs | None, error: BaseException | None
    ) -> None:
        """Enter the terminal state `to` (under the lock; the table allowed it)."""
        self._phase = to
        self._ended_at = now
        self.outputs = outputs
        self.error = error
        self._inputs = ()  # free the item's memory as soon as it is finished
        if self._fwaiters:
            self._notify_waiters()

    def _wake(self) -> None:
        """After `_end`, outside the lock: wake its waiters and run its listeners once (no
        waiter or listener is added once the request is terminal)."""
        if self._waiter is not None:
            self._waiter.release()
        if self._listeners:
            self.notify_listeners()

    def notify_listeners(self) -> None:
        """Run the done-listeners of a terminal request, once (the engine calls it after its
        step for the requests it ended: no user code runs under its lock). A listener that
        raises anything is logged (`done_listener_failed`) and the others still run; a
        `KeyboardInterrupt` on the caller's thread is raised again after them."""
        listeners, self._listeners = self._listeners, None
        if listeners:
            interrupt = None
            for fn in listeners:  # one listener's bug must not strand the others
                got = call_user(fn, self, "done_listener_failed", request_id=self.id)
                interrupt = interrupt or got
            if interrupt is not None:
                raise interrupt

    def add_done_listener(self, fn: Callable[[Request], None]) -> None:
        """Call `fn(request)` once it is terminal (at once if it already is).

        `fn` runs on the thread that finished the request and must not block.
        """
        with self._lock:
            if self._phase < RequestState.DONE:
                if self._listeners is None:
                    self._listeners = []
                self._listeners.append(fn)
                return
        fn(self)

    # -- user surface --------------------------------------------------------------------

    def cancel(self) -> bool:
        """Cancel the request unless it is already running or finished; True if cancelled."""
        if not self._move(
            RequestState.CANCELLED, None, RequestCancelled(f"request {self.id} was cancelled")
        ):
            return False
        if self._on_cancel is not None:
            self._on_cancel(self)
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request is terminal; False if `timeout` seconds passed first.

        Waiters block on a plain lock that the terminal transition releases (a C-level
        hand-off, much faster to wake than `threading.Event`); each waiter passes it on.
        """
        with self._lock:
            if self._phase >= RequestState.DONE:
                return True
            if self._waiter is None:
                self._waiter = threading.Lock()
                self._waiter.acquire()
            waiter = self._waiter
        if waiter.acquire(timeout=-1 if timeout is None else timeout):
            waiter.release()
            return True
        return False

    def result(self, timeout: float | None = None) -> Outputs:
        """The outputs once DONE; raises the request's error otherwise (like a future).

        Raises `TimeoutError` if the request is not finished within `timeout` seconds.
        """
        if not self.wait(timeout):
            raise TimeoutError(f"request {self.id} ({self.model}) not finished after {timeout}s")
        if self._phase is RequestState.DONE:
            assert self.outputs is not None
            return self.outputs
        assert self.error is not None
        raise self.error

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error it ended with, None once DONE (as `Future.exception()`): raises
        `TimeoutError` if not finished in time, and its `RequestCancelled` (a
        `concurrent.futures.CancelledError`) if it was cancelled."""
        if not self.wait(timeout):
            raise TimeoutError(f"request {self.id} ({self.model}) not finished after {timeout}s")
        if self._phase is RequestState.CANCELLED:
            assert self.error is not None
            raise self.error
        return self.error

    def add_done_callback(self, fn: Callable[[Request], object]) -> None:
        """Call `fn(request)` once it is terminal, at once if it already is (as
        `Future.add_done_callback`). `fn` runs on the thread that finished the request (the
        engine's, usually): keep it short, and use `callback=` at submit for real work.
        Whatever `fn` raises is logged and ignored (a `KeyboardInterrupt` on the caller's
        thread is raised again there)."""

        def call(request: Request) -> None:
            interrupt = call_user(fn, request, "done_callback_failed", request_id=request.id)
            if interrupt is not None:
                raise interrupt

        self.add_done_listener(call)

    def __await__(self) -> Generator[Any, None, Outputs]:
        """`await request`: its outputs, or raise its error (from any asyncio task; a
        cancelled task cancels the request where it has not started running)."""
        return self._awaited().__await__()

    async def _awaited(self) -> Outputs:
        import asyncio

        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outputs] = loop.create_future()

        def settle(request: Request) -> None:
            if future.done():
                return
            if request._phase is RequestState.DONE:
                assert request.outputs is not None
                future.set_result(request.outputs)
            else:
                assert request.error is not None
                future.set_exception(request.error)

        def wake(request: Request) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody waits
                loop.call_soon_threadsafe(settle, request)

        self.add_done_listener(wake)
        try:
            return await future
        except asyncio.CancelledError:
            self.cancel()
            raise

    # -- concurrent.futures.wait() / as_completed() ---------------------------------------
    # They read `_state` and `_waiters` under `_condition`, and expect every waiter to be
    # told when the future finishes, under that lock: the terminal transition does it.

    @property
    def _condition(self) -> threading.RLock:
        return self._lock

    @property
    def _state(self) -> str:
        phase = self._phase
        if phase is RequestState.CANCELLED:
            return "CANCELLED_AND_NOTIFIED"
        if phase >= RequestState.DONE:
            return "FINISHED"
        return "RUNNING" if phase is RequestState.RUNNING else "PENDING"

    @property
    def _waiters(self) -> list[Any]:
        if self._fwaiters is None:
            self._fwaiters = []
        return self._fwaiters

    def _notify_waiters(self) -> None:
        """Tell concurrent.futures waiters this request finished (under its lock)."""
        assert self._fwaiters is not None
        for waiter in self._fwaiters:
            if self._phase is RequestState.DONE:
                waiter.add_result(self)
            elif self._phase is RequestState.CANCELLED:
                waiter.add_cancelled(self)
            else:
                waiter.add_exception(self)


# -- many requests of one Work at once (the engine's hot path) --------------------------


def advance(
    requests: Iterable[Request], to: RequestState, lock: threading.RLock, now: float
) -> list[int]:
    """Move each of `requests` to the non-terminal state `to` where the table allows it,
    all under `lock` (the one their Work's requests share), stamped `now`. Returns the
    positions of those that could not move (e.g. cancelled meanwhile)."""
    assert to < RequestState.DONE
    stuck: list[int] = []
    ready = to is RequestState.READY
    with lock:
        for i, r in enumerate(requests):
            if to in _ALLOWED[r._phase]:
                r._phase = to
                if ready:
                    r._ready_at = now
                else:
                    r._running_at = now
            else:
                stuck.append(i)
    return stuck


def conclude(
    requests: Sequence[Request],
    to: RequestState,
    lock: threading.RLock,
    outputs: Iterable[Outputs] | None = None,
    error: BaseException | None = None,
    later: list[Request] | None = None,
) -> list[Request]:
    """End each of `requests` in the terminal state `to` (with its row of `outputs`, or
    `error`) where the table allows it, under their shared `lock`; then wake their
    waiters and run their listeners, or with `later` leave those that have listeners there
    (`notify_listeners` runs them). Returns the requests that ended here."""
    assert to >= RequestState.DONE
    now = time.perf_counter()
    ended: list[Request] = []
    rows: Iterable[Outputs | None] = outputs if outputs is not None else (None for _ in requests)
    with lock:
        for r, out in zip(requests, rows, strict=True):
            if to in _ALLOWED[r._phase]:
                r._end(to, now, out, error)
                ended.append(r)
    if later is None:
        for r in ended:
            r._wake()
        return ended
    for r in ended:
        if r._waiter is not None:
            r._waiter.release()
        if r._listeners:
            later.append(r)
    return ended
