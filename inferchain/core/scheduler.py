"""The Scheduler: waiting queues -> resource slots, as a plain data structure.

No thread, no lock, no worker state: the ExecutionEngine's loop calls it and is its only
user. A Work waits until `can_schedule` holds (room in its model's slots and memory budget,
every dependency DONE), then `schedule()` admits it (READY) and hands it over in a `Plan`.
Priorities: higher first, FIFO within a priority (by id), and with `aging_s` a waiting work
gains one priority level per `aging_s` seconds, so a low priority is never starved forever.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from inferchain.config import ModelConfig, SchedulerConfig
from inferchain.core.records import EMPTY_PLAN, Plan
from inferchain.core.request import Request, RequestState
from inferchain.core.work import Work
from inferchain.errors import DependencyFailed

_WAITING = RequestState.WAITING


class ModelQueue:
    """One model's waiting heap and the resources its admitted works hold."""

    def __init__(self, model: ModelConfig, budget_bytes: int | None) -> None:
        self.name = model.name
        self.num_slots = model.num_slots  # rows READY or RUNNING at once
        self.budget_bytes = budget_bytes  # input bytes of admitted rows; None = no limit
        self.heap: list[tuple[float, int, Work]] = []  # (key, work id, work)
        self.num_admitted = 0  # rows of admitted works not yet released
        self.admitted_bytes = 0  # their input bytes

    def can_schedule(self, work: Work) -> bool:
        """Room for the work's rows in the slots and the budget (always, when none is held:
        a work bigger than the model's slots still runs, alone)."""
        if self.num_admitted == 0:
            return True
        if self.num_admitted + work.rows > self.num_slots:
            return False
        return self.budget_bytes is None or self.admitted_bytes + work.nbytes <= self.budget_bytes

    def allocate(self, rows: int, nbytes: int) -> None:
        self.num_admitted += rows
        self.admitted_bytes += nbytes

    def deallocate(self, rows: int, nbytes: int) -> None:
        self.num_admitted -= rows
        self.admitted_bytes -= nbytes


class Scheduler:
    """Waiting queues, slots, memory budgets, dependencies and deadlines (see module doc)."""

    def __init__(
        self,
        config: SchedulerConfig,
        models: Iterable[ModelConfig],
        request_budgets: Mapping[str, int | None] | None = None,
    ) -> None:
        """`request_budgets`: per model, input bytes its admitted rows may hold at once
        (what `memory_budget_mb` leaves after the model and its buffers); default no limit."""
        self._aging = config.aging_s
        budgets = request_budgets or {}
        self._queues = {m.name: ModelQueue(m, budgets.get(m.name)) for m in models}
        self._blocked: dict[int, list[Work]] = {}  # dependency request id -> dependents
        self._num_deps: dict[int, int] = {}  # dependent work id -> dependencies not DONE
        self._deadlines: list[tuple[float, int, Work]] = []  # (deadline, work id, work)
        self._failed: list[tuple[Work, BaseException]] = []  # for the next plan
        self._dirty: set[str] = set()  # models whose heap may admit something now
        self.num_waiting = 0  # rows submitted and not yet admitted or dropped

    # -- input ----------------------------------------------------------------------------

    def add(self, work: Work) -> None:
        """A new WAITING work: queued until `schedule()` admits it (or it expires or
        fails)."""
        self.num_waiting += work.rows
        if work.deadline is not None:
            heapq.heappush(self._deadlines, (work.deadline, work.id, work))
        pending = 0
        for dep in work.depends_on:
            if not dep.done():
                self._blocked.setdefault(dep.id, []).append(work)
                pending += 1
            elif dep.state is not RequestState.DONE:
                self._fail_dependent(work, dep)
                return
        if pending:
            self._num_deps[work.id] = pending
        else:
            self._push(work)

    def admit(self, work: Work, now: float) -> bool:
        """A new WAITING work that arrives alone: admitted at once (READY, True) where
        nothing of its model waits, it depends on nothing and it fits, as `schedule()`
        would admit it; else `add`ed."""
        q = self._queues[work.model]
        if (
            q.heap
            or work.depends_on
            or work.cancelled
            or (q.num_admitted and not q.can_schedule(work))  # room, without a call when idle
        ):
            self.add(work)
            return False
        if work.deadline is not None:
            heapq.heappush(self._deadlines, (work.deadline, work.id, work))
        q.num_admitted += work.rows
        q.admitted_bytes += work.nbytes
        work.admit(now)
        return True

    def release(self, work: Work) -> None:
        """An admitted work has finished: free its slots and budget."""
        q = self._queues[work.model]
        q.num_admitted -= work.rows
        q.admitted_bytes -= work.nbytes
        if q.heap:
            self._dirty.add(q.name)

    def drop(self, work: Work) -> None:
        """A waiting work ended before admission (cancelled, timed out, failed)."""
        self.num_waiting -= work.rows
        self._num_deps.pop(work.id, None)
        q = self._queues[work.model]
        if q.heap:
            self._dirty.add(q.name)  # it may have held back the works behind it

    def watches(self, request_id: int) -> bool:
        """True when some waiting work depends on this request."""
        return request_id in self._blocked

    def dependency_ended(self, request: Request) -> None:
        """`request` ended: unblock (or fail) the works that depend on it."""
        for dependent in self._blocked.pop(request.id, ()):
            if dependent.state is not _WAITING or dependent.id not in self._num_deps:
                continue
            if request.state is not RequestState.DONE:
                del self._num_deps[dependent.id]
                self._fail_dependent(dependent, request)
                continue
            left = self._num_deps[dependent.id] - 1
            if left:
                self._num_deps[dependent.id] = left
            else:
                del self._num_deps[dependent.id]
                self._push(dependent)

    # -- the plan -------------------------------------------------------------------------

    def schedule(self, now: float) -> Plan:
        """Expire what passed its deadline, then admit what fits, highest priority first."""
        expired = self._expire(now) if self._deadlines and self._deadlines[0][0] <= now else ()
        admitted: list[Work] = []
        if self._dirty:
            for name in self._dirty:
                self._admit(self._queues[name], now, admitted)
            self._dirty.clear()
        if not (admitted or expired or self._failed):
            return EMPTY_PLAN
        failed, self._failed = tuple(self._failed), []
        return Plan(tuple(admitted), expired, failed)

    @property
    def next_deadline(self) -> float:
        """The earliest deadline of a work not yet finished (perf_counter s), or inf."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][2].done:
            heapq.heappop(deadlines)
        return deadlines[0][0] if deadlines else float("inf")

    @property
    def has_news(self) -> bool:
        """True when the next `schedule()` may admit or fail something."""
        return bool(self._dirty or self._failed)

    def waiting_works(self) -> list[Work]:
        """Every work not yet admitted: in the heaps or blocked on a dependency."""
        works = [entry[2] for q in self._queues.values() for entry in q.heap]
        works.extend(w for blocked in self._blocked.values() for w in blocked)
        return works

    def num_waiting_of(self, model: str) -> int:
        """Works in `model`'s waiting heap (cancelled ones included until admitted)."""
        return len(self._queues[model].heap)

    # -- inside ---------------------------------------------------------------------------

    def _push(self, work: Work) -> None:
        key = -float(work.priority)
        if self._aging is not None:
            key += work.submitted / self._aging
        q = self._queues[work.model]
        heapq.heappush(q.heap, (key, work.id, work))
        self._dirty.add(q.name)

    def _fail_dependent(self, work: Work, dep: Request) -> None:
        error = DependencyFailed(
            f"work {work.id} ({work.model}) depends on request {dep.id} ({dep.model}), "
            f"which ended {dep.state.name}: {dep.error}"
        )
        self._failed.append((work, error))

    def _expire(self, now: float) -> tuple[Work, ...]:
        deadlines = self._deadlines
        expired = []
        while deadlines and deadlines[0][0] <= now:
            work = heapq.heappop(deadlines)[2]
            if not work.done and work.taken < work.rows:
                expired.append(work)
        return tuple(expired)

    def _admit(self, q: ModelQueue, now: float, admitted: list[Work]) -> None:
        heap = q.heap
        while heap:
            work = heap[0][2]
            if work.state is not _WAITING or work.cancelled:
                heapq.heappop(heap)  # ended while waiting: the engine dropped it
                continue
            if work.deadline is not None and work.deadline <= now:
                heapq.heappop(heap)  # expired in this plan: the engine ends it
                continue
            if not q.can_schedule(work):
                break
            heapq.heappop(heap)
            q.allocate(work.rows, work.nbytes)
            self.num_waiting -= work.rows
            work.admit(now)
            admitted.append(work)
