"""The Scheduler against a simple model of it: priorities, slots, memory, dependencies."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from inferchain import DependencyFailed, QueueFull, Request, RequestState, RequestTimeout
from inferchain.config import ModelConfig, SchedulerConfig
from inferchain.scheduler import Scheduler

S = RequestState
SLOTS = {"a": 2, "b": 3}


class RecordingEngine:
    """Stands in for the ExecutionEngine: remembers what was handed over, in order."""

    def __init__(self) -> None:
        self.handed: list[Request] = []

    def add(self, model: str, requests: Iterable[Request]) -> None:
        self.handed.extend(requests)

    def step(self, now: float) -> float:
        return float("inf")


def create_scheduler(
    slots: dict[str, int] = SLOTS,
    *,
    aging_s: float | None = None,
    max_queue_size: int = 10_000,
    budget_mb: float | None = None,
) -> tuple[Scheduler, RecordingEngine]:
    engine = RecordingEngine()
    models = [
        ModelConfig(name=n, path="unused", slots=k, memory_budget_mb=budget_mb)
        for n, k in slots.items()
    ]
    config = SchedulerConfig(aging_s=aging_s, max_queue_size=max_queue_size)
    budgets = {n: None if budget_mb is None else int(budget_mb * 2**20) for n in slots}
    return Scheduler(config, models, engine, budgets), engine  # type: ignore[arg-type]


def create_request(
    scheduler: Scheduler,
    id: int,
    model: str = "a",
    *,
    priority: int = 0,
    depends_on: tuple[Request, ...] = (),
    deadline: float | None = None,
    nbytes: int = 4,
    finished: Counter[int] | None = None,
) -> Request:
    def hook(r: Request) -> None:
        if finished is not None:
            finished[r.id] += 1
        scheduler.notify_finished(r)

    inputs = (np.zeros(nbytes // 4, np.float32),)
    return Request(
        id,
        model,
        inputs,
        priority=priority,
        depends_on=depends_on,
        deadline=deadline,
        on_terminal=hook,
    )


class SchedulerMachine(RuleBasedStateMachine):
    """Random submits, completions, failures and cancels; invariants after every step."""

    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.scheduler, self.engine = create_scheduler()
        self.all: list[Request] = []
        self.finished: Counter[int] = Counter()
        self.next_id = 1
        self.step = 0
        self.admitted_at: dict[int, int] = {}  # request id -> step it was handed over
        self.eligible_at: dict[int, int] = {}  # request id -> step its dependencies were DONE

    def _run(self) -> None:
        self.step += 1
        self.scheduler.run_once()
        for r in self.engine.handed:
            self.admitted_at.setdefault(r.id, self.step)
        for r in self.all:
            if r.state is S.WAITING and all(d.state is S.DONE for d in r.depends_on):
                self.eligible_at.setdefault(r.id, self.step)

    @rule(
        target=requests,
        model=st.sampled_from(sorted(SLOTS)),
        priority=st.integers(-2, 2),
        deps=st.lists(st.integers(0, 1000), max_size=2),
    )
    def submit(self, model: str, priority: int, deps: list[int]) -> Request:
        depends_on = tuple(self.all[d % len(self.all)] for d in deps) if self.all else ()
        r = create_request(
            self.scheduler,
            self.next_id,
            model,
            priority=priority,
            depends_on=depends_on,
            finished=self.finished,
        )
        self.next_id += 1
        self.all.append(r)
        self.scheduler.submit([r])
        self._run()
        return r

    def _admitted(self) -> list[Request]:
        return [r for r in self.engine.handed if r.state in (S.READY, S.RUNNING)]

    @precondition(lambda self: any(r.state is S.READY for r in self.engine.handed))
    @rule(data=st.data(), ok=st.booleans())
    def complete(self, data: st.DataObject, ok: bool) -> None:
        ready = [r for r in self.engine.handed if r.state is S.READY]
        r = data.draw(st.sampled_from(ready))
        r.transition(S.RUNNING)
        if ok:
            r.transition(S.DONE, outputs={})
        else:
            r.transition(S.ERROR, error=RuntimeError("boom"))
        self._run()

    @rule(r=requests)
    def cancel(self, r: Request) -> None:
        r.cancel()
        self._run()

    @invariant()
    def slots_never_exceeded(self) -> None:
        held = Counter(r.model for r in self._admitted())
        for model, n in held.items():
            assert n <= SLOTS[model]

    @invariant()
    def admitted_only_with_dependencies_done(self) -> None:
        for r in self.engine.handed:
            assert all(d.state is S.DONE for d in r.depends_on)

    @invariant()
    def failed_dependency_fails_dependents(self) -> None:
        for r in self.all:
            if any(d.done and d.state is not S.DONE for d in r.depends_on):
                assert r.done, f"{r} waits on a failed dependency"
                if r.state is S.ERROR:
                    assert isinstance(r.error, DependencyFailed)

    @invariant()
    def priority_order_held(self) -> None:
        """A waiting, eligible request only waits while its model's slots are full, and
        nothing of lower priority (or equal and later) was admitted past it."""
        for r in self.all:
            if r.state is not S.WAITING or not all(d.state is S.DONE for d in r.depends_on):
                continue
            held = sum(1 for x in self._admitted() if x.model == r.model)
            assert held == SLOTS[r.model], f"{r} waits with a free slot"
            since = self.eligible_at[r.id]
            for x in self.engine.handed:
                if x.model != r.model or self.admitted_at[x.id] < since:
                    continue
                assert (x.priority, -x.id) > (r.priority, -r.id), f"{x} admitted before {r}"

    @invariant()
    def terminal_exactly_once(self) -> None:
        for r in self.all:
            assert self.finished[r.id] == (1 if r.done else 0)
        assert len(self.engine.handed) == len({r.id for r in self.engine.handed})


TestSchedulerMachine = SchedulerMachine.TestCase


def test_priority_then_fifo() -> None:
    scheduler, engine = create_scheduler({"a": 1})
    reqs = [create_request(scheduler, i, priority=p) for i, p in enumerate([0, 1, 0, 2, 1], 1)]
    scheduler.submit(reqs)
    order = []
    for _ in reqs:
        scheduler.run_once()
        (r,) = [x for x in engine.handed if x.state is S.READY]
        order.append(r.id)
        r.transition(S.RUNNING)
        r.transition(S.DONE, outputs={})
    assert order == [4, 2, 5, 1, 3]


def test_aging_lets_a_low_priority_request_through() -> None:
    scheduler, engine = create_scheduler({"a": 1}, aging_s=0.05)
    old = create_request(scheduler, 1, priority=0)
    scheduler.submit([old])
    time.sleep(0.2)  # four priority levels of age
    newer = [create_request(scheduler, i, priority=2) for i in range(2, 5)]
    scheduler.submit(newer)
    scheduler.run_once()
    assert [r.id for r in engine.handed] == [1]


def test_memory_budget_limits_admission() -> None:
    scheduler, engine = create_scheduler({"a": 10}, budget_mb=1)
    big = [create_request(scheduler, i, nbytes=400_000) for i in range(1, 5)]
    scheduler.submit(big)
    scheduler.run_once()
    assert [r.id for r in engine.handed] == [1, 2]  # 3 x 400 kB > 1 MiB


def test_deadline_times_out_a_waiting_request() -> None:
    scheduler, engine = create_scheduler({"a": 1})
    blocker = create_request(scheduler, 1)
    late = create_request(scheduler, 2, deadline=time.perf_counter() + 0.01)
    scheduler.submit([blocker, late])
    scheduler.run_once()
    time.sleep(0.02)
    scheduler.run_once()
    assert late.state is S.TIMED_OUT
    assert isinstance(late.error, RequestTimeout)
    assert engine.handed == [blocker]


def test_queue_full_without_blocking() -> None:
    scheduler, engine = create_scheduler({"a": 1}, max_queue_size=2)
    scheduler.submit([create_request(scheduler, 1), create_request(scheduler, 2)])
    assert [r.id for r in engine.handed] == [1]  # the submitting thread ran a pass (poke)
    scheduler.submit([create_request(scheduler, 3)])
    with pytest.raises(QueueFull, match="2/2"):
        scheduler.submit([create_request(scheduler, 4)], block=False)
