"""The Scheduler: waiting queue -> resource slots, on its own thread.

Requests enter WAITING. The loop moves a request to READY when `can_schedule` holds (a free
slot for its model, room in the model's memory budget, every dependency DONE) and hands it to
the ExecutionEngine, which from then on owns it. Priorities: higher first, FIFO within a
priority, and with `aging_s` a waiting request gains one priority level per `aging_s`
seconds, so a low priority is never starved forever.
"""

from __future__ import annotations

import contextlib
import heapq
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from inferchain.config import ModelConfig, SchedulerConfig
from inferchain.engine import BatchSink, ExecutionEngine
from inferchain.errors import Closed, DependencyFailed, QueueFull, RequestTimeout
from inferchain.logs import get_logger, log_safely
from inferchain.request import Request, RequestState

log = get_logger(__name__)

Sink = TypeVar("Sink", bound=BatchSink)


class ModelQueue:
    """One model's waiting heap and the resources its admitted requests hold."""

    def __init__(self, model: ModelConfig, budget_bytes: int | None) -> None:
        self.name = model.name
        self.num_slots = model.num_slots  # READY + RUNNING requests allowed at once
        self.budget_bytes = budget_bytes  # input bytes of admitted requests; None = no limit
        self.heap: list[tuple[float, int, Request]] = []  # (key, request id, request)
        self.num_admitted = 0  # requests holding a slot (READY or RUNNING)
        self.admitted_bytes = 0  # input bytes of those requests

    def can_schedule(self, request: Request) -> bool:
        """Free slot and room in the memory budget (dependencies are handled before the heap)."""
        if self.num_admitted >= self.num_slots:
            return False
        if self.budget_bytes is None or self.num_admitted == 0:
            return True
        return self.admitted_bytes + request.nbytes <= self.budget_bytes

    def allocate(self, request: Request) -> None:
        self.num_admitted += 1
        self.admitted_bytes += request.nbytes

    def deallocate(self, request: Request) -> None:
        self.num_admitted -= 1
        self.admitted_bytes -= request.nbytes


class Scheduler:
    """Owns the waiting queues, slots, dependencies and deadlines; drives the engine.

    Thread-safe entry points: `submit`, `notify_finished` (the Request terminal hook),
    `wake` and `poke`. The scheduling state is touched only inside a pass (`run_once`), which
    holds `_pass_lock`: usually on the scheduler thread, or on the thread that just submitted
    or finished work when no pass is running (`poke`).
    """

    def __init__(
        self,
        config: SchedulerConfig,
        models: Iterable[ModelConfig],
        engine: ExecutionEngine,
        request_budgets: Mapping[str, int | None] | None = None,
    ) -> None:
        """`request_budgets`: per model, input bytes its admitted requests may hold at once
        (what `memory_budget_mb` leaves after the model and its buffers); default no limit."""
        self._config = config
        self._engine = engine
        budgets = request_budgets or {}
        self._queues = {m.name: ModelQueue(m, budgets.get(m.name)) for m in models}
        self._space = threading.Condition()  # guards _num_waiting; full queues wait here
        self._inbox: deque[Request] = deque()  # submitted, not yet seen by the loop
        self._finished: deque[Request] = deque()  # terminal, resources not yet released
        # Wake-ups are tokens in a C-level queue: much cheaper to wake than a Condition.
        self._wakeups: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._wake_pending = False
        self._pass_lock = threading.Lock()  # one scheduling pass at a time, on any thread
        self._num_waiting = 0  # submitted and not yet admitted nor finished
        self._blocked: dict[int, list[Request]] = {}  # dependency id -> dependents
        self._num_deps: dict[int, int] = {}  # dependent id -> dependencies not yet DONE
        self._deadlines: list[tuple[float, int, Request]] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="inferchain-scheduler", daemon=True)

    # -- thread-safe surface --------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(
        self, requests: list[Request], block: bool = True, timeout: float | None = None
    ) -> None:
        """Queue WAITING requests; blocks (or raises `QueueFull`) at `max_queue_size`."""
        limit = self._config.max_queue_size
        n = len(requests)
        with self._space:
            if self._stopping:
                raise Closed("the scheduler is stopped")
            if self._num_waiting + n > limit and self._num_waiting > 0:
                if not block:
                    raise QueueFull(f"waiting queue is full ({self._num_waiting}/{limit} requests)")
                ok = self._space.wait_for(
                    lambda: self._stopping or not self._num_waiting + n - limit > 0,
                    timeout,
                )
                if self._stopping:
                    raise Closed("the scheduler is stopped")
                if not ok:
                    raise QueueFull(f"waiting queue still full after {timeout}s")
            self._num_waiting += n
        self._inbox.extend(requests)
        self.poke()

    def notify_finished(self, request: Request, wake: bool = True) -> None:
        """Terminal hook of every Request: release what it held (any thread).

        `wake=False` when the caller runs or pokes a pass right after (a worker finishing a
        batch), so a batch of completions costs one pass and no extra wake-up.
        """
        self._finished.append(request)
        if wake:
            self.wake()

    def wake(self) -> None:
        """Make the loop run once more soon (any thread; cheap when one is pending)."""
        if not self._wake_pending:
            self._wake_pending = True
            self._wakeups.put(None)

    def claim_idle(self, model: str, request: Request, workers: Sequence[Sink]) -> Sink | None:
        """Admit `request` straight to a free worker when `model` is idle: nothing of it is
        waiting or ready, a slot is free and a healthy worker is not busy. Returns that
        worker, now busy with the request RUNNING; None (and no change) otherwise."""
        q = self._queues[model]
        with self._pass_lock:
            if q.heap or self._engine.num_ready_of(model) or not q.can_schedule(request):
                return None
            worker = next((w for w in workers if w.healthy and not w.busy), None)
            if worker is None or not request.try_transition(RequestState.READY):
                return None
            q.allocate(request)
            worker.busy = True
            request.try_transition(RequestState.RUNNING)
            return worker

    def stop(self) -> None:
        """Stop the loop and join its thread; waiting requests must be finished first."""
        with self._space:
            self._stopping = True
            self._space.notify_all()
        self._wakeups.put(None)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    # -- the loop ----------------------------------------------------------------------

    def _loop(self) -> None:
        timeout = self._config.interval_ms / 1000.0
        while not self._stopping:
            with contextlib.suppress(queue.Empty):
                self._wakeups.get(timeout=timeout)
            if self._stopping:
                break
            try:
                timeout = self.run_once()
            except Exception:  # a bug here must not strand every request: log and go on
                log_safely(log.exception, "scheduler_step_failed")
                timeout = self._config.interval_ms / 1000.0

    def run_once(self) -> float:
        """One pass: take new and finished requests, expire, admit, dispatch.

        The scheduler thread runs it on every wake-up; `poke()` lets the thread that just
        submitted or finished work run it instead, one thread hop less. Passes never overlap
        (`_pass_lock`). Returns how long the loop may sleep before the next pass (seconds).
        """
        with self._pass_lock:
            return self._pass()

    def poke(self) -> None:
        """Run a pass on this thread if none is running, else wake the scheduler thread."""
        if self._pass_lock.acquire(blocking=False):
            try:
                self._pass()
            finally:
                self._pass_lock.release()
            if self._inbox or self._finished:
                self.wake()  # arrived while the pass ran
        else:
            self.wake()

    def _pass(self) -> float:
        self._wake_pending = False  # before draining: a later append wakes the loop again
        inbox = self._inbox
        taken = [inbox.popleft() for _ in range(len(inbox))]
        return self._step(taken, self._config.interval_ms / 1000.0)

    def _step(self, inbox: list[Request], interval: float) -> float:
        now = time.perf_counter()
        for request in inbox:
            self._enqueue(request)
        self._release_finished()
        next_deadline = self._expire(now)
        for q in self._queues.values():
            if q.heap:
                self._admit(q)
        next_batch = self._engine.step(time.perf_counter())
        wait = min(interval, next_deadline - now, next_batch - time.perf_counter())
        return max(wait, 0.0)

    def _enqueue(self, request: Request) -> None:
        if request.state is not RequestState.WAITING:
            return  # cancelled before the loop saw it; accounted when its finish arrives
        if request.deadline is not None:
            heapq.heappush(self._deadlines, (request.deadline, request.id, request))
        pending = 0
        for dep in request.depends_on:
            if not dep.done:
                self._blocked.setdefault(dep.id, []).append(request)
                pending += 1
            elif dep.state is not RequestState.DONE:
                self._fail_dependent(request, dep)
                return
        if pending:
            self._num_deps[request.id] = pending
        else:
            self._push(request)

    def _push(self, request: Request) -> None:
        aging = self._config.aging_s
        key = -float(request.priority)
        if aging is not None:
            key += request.stamp(RequestState.WAITING) / aging  # type: ignore[operator]
        # ties go by id: FIFO in submission order, also for a dependent pushed late
        heapq.heappush(self._queues[request.model].heap, (key, request.id, request))

    def _fail_dependent(self, request: Request, dep: Request) -> None:
        request.try_transition(
            RequestState.ERROR,
            error=DependencyFailed(
                f"request {request.id} depends on request {dep.id} ({dep.model}), "
                f"which ended {dep.state.name}: {dep.error}"
            ),
        )

    def _release_finished(self) -> None:
        finished = self._finished
        released = 0
        while finished:
            request = finished.popleft()
            if request.stamp(RequestState.READY) is None:
                released += 1
            else:
                self._queues[request.model].deallocate(request)
            for dependent in self._blocked.pop(request.id, ()):
                if dependent.state is not RequestState.WAITING:
                    continue
                if request.state is not RequestState.DONE:
                    self._num_deps.pop(dependent.id, None)
                    self._fail_dependent(dependent, request)
                    continue
                left = self._num_deps[dependent.id] - 1
                if left:
                    self._num_deps[dependent.id] = left
                else:
                    del self._num_deps[dependent.id]
                    self._push(dependent)
        if released:
            self._release_waiting(released)

    def _expire(self, now: float) -> float:
        """Time out WAITING/READY requests past their deadline; returns the next deadline."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, _, request = heapq.heappop(deadlines)
            request.try_transition(
                RequestState.TIMED_OUT,
                error=RequestTimeout(
                    f"request {request.id} ({request.model}) passed its deadline while "
                    f"{request.state.name}"
                ),
            )
        while deadlines and deadlines[0][2].done:
            heapq.heappop(deadlines)
        return deadlines[0][0] if deadlines else float("inf")

    def _admit(self, q: ModelQueue) -> None:
        heap = q.heap
        admitted: list[Request] = []
        while heap:
            request = heap[0][2]
            if request.state is not RequestState.WAITING:
                heapq.heappop(heap)  # cancelled or timed out while waiting
                continue
            if not q.can_schedule(request):
                break
            heapq.heappop(heap)
            if request.try_transition(RequestState.READY):
                q.allocate(request)
                admitted.append(request)
        if admitted:
            self._release_waiting(len(admitted))
            self._engine.add(q.name, admitted)

    def _release_waiting(self, n: int) -> None:
        with self._space:
            self._num_waiting -= n
            self._space.notify_all()

    def queue_depths(self) -> Mapping[str, int]:
        """Per model, requests waiting in its heap (approximate, any thread)."""
        return {name: len(q.heap) for name, q in self._queues.items()}
