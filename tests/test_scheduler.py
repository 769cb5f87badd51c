"""The Scheduler as a plain data structure: priorities, aging, slots, memory, dependencies,
deadlines; then the real Scheduler beside a tiny model of it, driven as the engine drives it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    precondition,
    rule,
)

from inferchain.core.records import EMPTY_PLAN
from inferchain.core.request import Request, RequestState
from inferchain.core.scheduler import Scheduler
from inferchain.core.work import Work
from inferchain.errors import DependencyFailed, RequestCancelled
from inferchain.testing import builders

S = RequestState
SLOTS = {"a": 2, "b": 3}


# -- builders ---------------------------------------------------------------------------------


def create_scheduler(
    slots: Mapping[str, int] = SLOTS,
    *,
    aging_s: float | None = None,
    budgets: Mapping[str, int | None] | None = None,
) -> Scheduler:
    """A Scheduler over models "a" and "b" by default."""
    return builders.create_scheduler(slots, aging_s=aging_s, budgets=budgets)


def create_request(id: int, model: str = "a") -> Request:
    return builders.create_request(id, model)


def create_work(id: int, model: str = "a", **keys: Any) -> Work:
    """`builders.create_work` for the models of these tests."""
    return builders.create_work(id, model, **keys)


def end_request(r: Request, state: RequestState) -> None:
    """Run a standalone request to `state` along the transitions the engine uses."""
    if state is S.DONE:
        r.transition(S.READY)
        r.transition(S.RUNNING)
        r.transition(S.DONE, outputs={})
    elif state is S.CANCELLED:
        assert r.cancel()
    else:
        r.transition(state, error=RuntimeError("boom"))


def ids(works: Sequence[Work]) -> list[int]:
    return [w.id for w in works]


def admit_in_turn(scheduler: Scheduler, count: int) -> list[int]:
    """Schedule, release what was admitted, again: the admission order of `count` works."""
    order: list[int] = []
    while len(order) < count:
        plan = scheduler.schedule(0.0)
        assert plan.admitted, f"nothing admitted after {order}"
        order.extend(ids(plan.admitted))
        for w in plan.admitted:
            scheduler.release(w)
    return order


# -- priorities and aging ---------------------------------------------------------------------


def test_higher_priority_first_then_fifo_within_a_priority() -> None:
    scheduler = create_scheduler({"a": 1})
    for i, p in enumerate([0, 1, 0, 2, 1], 1):
        scheduler.add(create_work(i, priority=p))
    assert admit_in_turn(scheduler, 5) == [4, 2, 5, 1, 3]


def test_equal_priorities_go_by_work_id_not_by_order_of_add() -> None:
    scheduler = create_scheduler({"a": 1})
    for i in (3, 1, 2):
        scheduler.add(create_work(i))
    assert admit_in_turn(scheduler, 3) == [1, 2, 3]


def test_without_aging_newer_higher_priorities_always_pass_an_old_work() -> None:
    scheduler = create_scheduler({"a": 1}, aging_s=None)
    scheduler.add(create_work(1, priority=0, submitted=0.0))
    for i in (2, 3, 4):
        scheduler.add(create_work(i, priority=2, submitted=1000.0))
    assert admit_in_turn(scheduler, 4) == [2, 3, 4, 1]


def test_aging_gains_one_priority_level_per_aging_s_so_low_priority_is_not_starved() -> None:
    """Submitted 5 s earlier with aging_s=1, priority 0 beats priority 2; 1 s earlier it
    does not (it has gained one level, not two)."""
    scheduler = create_scheduler({"a": 1}, aging_s=1.0)
    scheduler.add(create_work(1, priority=0, submitted=0.0))
    scheduler.add(create_work(2, priority=2, submitted=5.0))
    scheduler.add(create_work(3, priority=2, submitted=1.0))
    assert admit_in_turn(scheduler, 3) == [3, 1, 2]


# -- slots and memory -------------------------------------------------------------------------


def test_slots_count_rows_not_works() -> None:
    scheduler = create_scheduler({"a": 4})
    scheduler.add(create_work(1, rows=3))
    scheduler.add(create_work(2, rows=2))
    plan = scheduler.schedule(0.0)
    assert ids(plan.admitted) == [1]  # 3 + 2 rows > 4 slots
    scheduler.release(plan.admitted[0])
    assert ids(scheduler.schedule(0.0).admitted) == [2]


def test_works_that_fit_together_are_admitted_in_one_schedule() -> None:
    scheduler = create_scheduler({"a": 4})
    for i in (1, 2, 3):
        scheduler.add(create_work(i, rows=2))
    plan = scheduler.schedule(5.0)
    assert ids(plan.admitted) == [1, 2]
    assert all(w.state is S.READY and w.admitted == 5.0 for w in plan.admitted)


def test_a_work_bigger_than_the_slots_runs_alone_when_nothing_is_admitted() -> None:
    scheduler = create_scheduler({"a": 2})
    big, small = create_work(1, rows=5), create_work(2, rows=1)
    scheduler.add(big)
    scheduler.add(small)
    assert ids(scheduler.schedule(0.0).admitted) == [1]
    assert scheduler.schedule(0.0).admitted == ()  # nothing joins it
    scheduler.release(big)
    assert ids(scheduler.schedule(0.0).admitted) == [2]


def test_a_work_that_does_not_fit_holds_back_lower_priorities_of_its_model() -> None:
    """Strict priority order: a lower-priority work does not pass one that waits for room."""
    scheduler = create_scheduler({"a": 2})
    held = create_work(1, rows=1)
    scheduler.add(held)
    scheduler.schedule(0.0)
    scheduler.add(create_work(2, rows=2, priority=1))
    scheduler.add(create_work(3, rows=1, priority=0))
    assert scheduler.schedule(0.0).admitted == ()
    scheduler.release(held)
    assert admit_in_turn(scheduler, 2) == [2, 3]


def test_a_full_model_does_not_hold_back_another_model() -> None:
    scheduler = create_scheduler({"a": 1, "b": 1})
    scheduler.add(create_work(1, "a"))
    scheduler.add(create_work(2, "a"))
    scheduler.add(create_work(3, "b"))
    assert sorted(ids(scheduler.schedule(0.0).admitted)) == [1, 3]


def test_memory_budget_limits_the_bytes_admitted_at_once() -> None:
    scheduler = create_scheduler({"a": 10}, budgets={"a": 2**20})
    works = [create_work(i, width=100_000) for i in range(1, 5)]
    for w in works:
        scheduler.add(w)
    assert ids(scheduler.schedule(0.0).admitted) == [1, 2]  # 3 x 400 kB > 1 MiB
    scheduler.release(works[0])
    assert ids(scheduler.schedule(0.0).admitted) == [3]


def test_a_work_over_the_memory_budget_runs_alone_and_other_models_are_not_limited() -> None:
    scheduler = create_scheduler({"a": 10, "b": 10}, budgets={"a": 1000})
    scheduler.add(create_work(1, "a", width=1250))
    scheduler.add(create_work(2, "a", width=2))
    scheduler.add(create_work(3, "b", width=1250))
    scheduler.add(create_work(4, "b", width=1250))
    assert sorted(ids(scheduler.schedule(0.0).admitted)) == [1, 3, 4]


def test_release_lets_the_next_schedule_admit_what_now_fits() -> None:
    scheduler = create_scheduler({"a": 1})
    first, second = create_work(1), create_work(2)
    scheduler.add(first)
    scheduler.add(second)
    scheduler.schedule(0.0)
    assert scheduler.schedule(0.0) is EMPTY_PLAN
    scheduler.release(first)
    assert ids(scheduler.schedule(0.0).admitted) == [2]


# -- dependencies -----------------------------------------------------------------------------


def test_a_dependent_waits_until_its_dependency_is_done() -> None:
    scheduler = create_scheduler()
    dep = create_request(100)
    work = create_work(1, depends_on=[dep])
    scheduler.add(work)
    assert scheduler.watches(100)
    assert scheduler.schedule(0.0).admitted == ()
    assert ids(scheduler.waiting_works()) == [1]
    end_request(dep, S.DONE)
    scheduler.dependency_ended(dep)
    assert not scheduler.watches(100)
    assert ids(scheduler.schedule(0.0).admitted) == [1]


def test_a_dependent_waits_for_every_one_of_its_dependencies() -> None:
    scheduler = create_scheduler()
    first, second = create_request(100), create_request(101)
    scheduler.add(create_work(1, depends_on=[first, second]))
    end_request(first, S.DONE)
    scheduler.dependency_ended(first)
    assert scheduler.schedule(0.0).admitted == ()
    end_request(second, S.DONE)
    scheduler.dependency_ended(second)
    assert ids(scheduler.schedule(0.0).admitted) == [1]


def test_a_dependency_done_before_add_does_not_block() -> None:
    scheduler = create_scheduler()
    dep = create_request(100)
    end_request(dep, S.DONE)
    scheduler.add(create_work(1, depends_on=[dep]))
    assert not scheduler.watches(100)
    assert ids(scheduler.schedule(0.0).admitted) == [1]


@pytest.mark.parametrize("end", [S.ERROR, S.CANCELLED, S.TIMED_OUT])
def test_a_dependency_ending_without_outputs_fails_the_dependent(end: RequestState) -> None:
    scheduler = create_scheduler()
    dep = create_request(100)
    work = create_work(1, depends_on=[dep])
    scheduler.add(work)
    end_request(dep, end)
    scheduler.dependency_ended(dep)
    plan = scheduler.schedule(0.0)
    assert plan.admitted == ()
    ((failed, error),) = plan.failed
    assert failed is work
    assert isinstance(error, DependencyFailed)
    assert "request 100" in str(error) and end.name in str(error)


def test_a_dependency_failed_before_add_fails_the_dependent_at_the_next_schedule() -> None:
    scheduler = create_scheduler()
    dep = create_request(100)
    end_request(dep, S.ERROR)
    work = create_work(1, depends_on=[dep])
    scheduler.add(work)
    ((failed, error),) = scheduler.schedule(0.0).failed
    assert failed is work and isinstance(error, DependencyFailed)
    assert scheduler.schedule(0.0) is EMPTY_PLAN  # reported once


def test_a_failed_dependent_is_reported_once_even_when_two_dependencies_fail() -> None:
    scheduler = create_scheduler()
    first, second = create_request(100), create_request(101)
    work = create_work(1, depends_on=[first, second])
    scheduler.add(work)
    for dep in (first, second):
        end_request(dep, S.ERROR)
        scheduler.dependency_ended(dep)
    plan = scheduler.schedule(0.0)
    assert [w for w, _ in plan.failed] == [work]
    assert scheduler.schedule(0.0) is EMPTY_PLAN


def test_a_dependent_dropped_while_blocked_is_never_admitted() -> None:
    scheduler = create_scheduler()
    dep = create_request(100)
    work = create_work(1, rows=3, depends_on=[dep])
    scheduler.add(work)
    assert scheduler.num_waiting == 3
    scheduler.drop(work)
    work.finish()
    assert scheduler.num_waiting == 0
    end_request(dep, S.DONE)
    scheduler.dependency_ended(dep)
    assert scheduler.schedule(0.0) is EMPTY_PLAN


# -- deadlines --------------------------------------------------------------------------------


def test_a_waiting_work_past_its_deadline_is_expired_once() -> None:
    scheduler = create_scheduler({"a": 1})
    scheduler.add(create_work(1))
    late = create_work(2, deadline=1.0)
    scheduler.add(late)
    assert ids(scheduler.schedule(0.0).admitted) == [1]
    assert scheduler.next_deadline == 1.0
    assert scheduler.schedule(0.5) is EMPTY_PLAN
    plan = scheduler.schedule(1.0)
    assert plan.expired == (late,) and plan.admitted == ()
    assert scheduler.schedule(2.0) is EMPTY_PLAN


def test_next_deadline_is_the_earliest_of_works_not_settled() -> None:
    scheduler = create_scheduler()
    assert scheduler.next_deadline == float("inf")
    early, later = create_work(1, deadline=3.0), create_work(2, deadline=7.0)
    scheduler.add(later)
    scheduler.add(early)
    assert scheduler.next_deadline == 3.0
    scheduler.schedule(0.0)
    scheduler.release(early)
    early.finish()
    assert scheduler.next_deadline == 7.0


def test_an_admitted_work_expires_only_while_some_rows_are_not_yet_taken() -> None:
    scheduler = create_scheduler({"a": 10})
    untaken, running = create_work(1, rows=2, deadline=1.0), create_work(3, rows=2, deadline=1.0)
    scheduler.add(untaken)
    scheduler.add(running)
    scheduler.schedule(0.0)
    untaken.taken = 1
    running.taken = 2  # every row is in a batch: a running batch completes as a whole
    assert scheduler.schedule(1.0).expired == (untaken,)


def test_a_work_already_past_its_deadline_is_expired_not_admitted() -> None:
    scheduler = create_scheduler()
    late = create_work(1, deadline=1.0)
    scheduler.add(late)
    plan = scheduler.schedule(2.0)
    assert plan.expired == (late,)
    assert plan.admitted == ()


# -- ended while waiting ----------------------------------------------------------------------


def test_cancelled_and_ended_works_in_the_heap_are_skipped() -> None:
    scheduler = create_scheduler({"a": 1})
    blocker = create_work(1)
    cancelled, ended, next_ = create_work(2), create_work(3), create_work(4)
    for w in (blocker, cancelled, ended, next_):
        scheduler.add(w)
    scheduler.schedule(0.0)
    cancelled.cancel()  # flagged; the engine drops it later
    scheduler.drop(ended)
    ended.finish()
    scheduler.release(blocker)
    assert ids(scheduler.schedule(0.0).admitted) == [4]
    assert cancelled.state is S.WAITING


def test_dropping_the_work_that_held_back_others_lets_them_in_at_the_next_schedule() -> None:
    scheduler = create_scheduler({"a": 2})
    scheduler.add(create_work(1))
    scheduler.schedule(0.0)
    big, small = create_work(2, rows=2, priority=1), create_work(4)
    scheduler.add(big)
    scheduler.add(small)
    assert scheduler.schedule(0.0).admitted == ()
    big.cancel()
    scheduler.drop(big)
    big.finish()
    assert ids(scheduler.schedule(0.0).admitted) == [4]


def test_num_waiting_counts_rows_until_admitted_or_dropped() -> None:
    scheduler = create_scheduler({"a": 2})
    admitted, dropped = create_work(1, rows=2), create_work(3, rows=3)
    scheduler.add(admitted)
    scheduler.add(dropped)
    assert scheduler.num_waiting == 5
    scheduler.schedule(0.0)
    assert scheduler.num_waiting == 3
    assert scheduler.num_waiting_of("a") == 1
    scheduler.drop(dropped)
    assert scheduler.num_waiting == 0


def test_waiting_works_lists_both_queued_and_blocked_works() -> None:
    scheduler = create_scheduler({"a": 1, "b": 1})
    dep = create_request(100)
    for w in (create_work(1, "a"), create_work(2, "a"), create_work(3, "b", depends_on=[dep])):
        scheduler.add(w)
    scheduler.schedule(0.0)
    assert sorted(ids(scheduler.waiting_works())) == [2, 3]


def test_has_news_tells_whether_the_next_schedule_may_admit_or_fail_something() -> None:
    scheduler = create_scheduler({"a": 1})
    assert not scheduler.has_news
    first, second = create_work(1), create_work(2)
    scheduler.add(first)
    scheduler.add(second)
    assert scheduler.has_news
    scheduler.schedule(0.0)
    assert not scheduler.has_news  # work 2 waits for a slot
    scheduler.release(first)
    assert scheduler.has_news
    scheduler.schedule(0.0)
    dep = create_request(100)
    scheduler.add(create_work(3, "a", depends_on=[dep]))
    scheduler.schedule(0.0)
    assert not scheduler.has_news  # blocked on its dependency
    end_request(dep, S.ERROR)
    scheduler.dependency_ended(dep)
    assert scheduler.has_news  # the dependent fails at the next schedule


def test_schedule_with_nothing_to_do_returns_the_empty_plan() -> None:
    scheduler = create_scheduler()
    assert scheduler.schedule(0.0) is EMPTY_PLAN


# -- admit: a work that arrives alone -------------------------------------------------------


def test_admit_admits_at_once_when_the_model_has_nothing_waiting() -> None:
    scheduler = create_scheduler({"a": 2})
    work = create_work(1, rows=2)
    assert scheduler.admit(work, 0.0)
    assert work.state is S.READY
    scheduler.add(create_work(3))
    assert scheduler.schedule(0.0).admitted == ()  # its slots are held
    scheduler.release(work)
    assert ids(scheduler.schedule(0.0).admitted) == [3]


def test_admit_queues_what_would_jump_the_queue_or_does_not_fit() -> None:
    scheduler = create_scheduler({"a": 1, "b": 1})
    scheduler.add(create_work(1, "a"))
    scheduler.add(create_work(2, "a"))
    scheduler.schedule(0.0)
    behind = create_work(3, "a")  # work 2 is waiting
    assert not scheduler.admit(behind, 0.0)
    assert scheduler.admit(create_work(4, "b"), 0.0)
    no_room = create_work(5, "b")
    assert not scheduler.admit(no_room, 0.0)
    with_deps = create_work(6, "b", depends_on=[create_request(100)])
    assert not scheduler.admit(with_deps, 0.0)
    for w in (behind, no_room, with_deps):
        assert w.state is S.WAITING
    assert ids(scheduler.waiting_works()) == [2, 3, 5, 6]  # queued, as add() queues them
    assert scheduler.num_waiting == 4


# -- the real Scheduler beside a model of it --------------------------------------------------

MACHINE_SLOTS = {"a": 2, "b": 3}
MACHINE_BUDGETS: dict[str, int | None] = {"a": None, "b": 8}  # bytes; rows are 4 or 8 bytes
WAITING, ADMITTED, RELEASED, FAILED, DROPPED = (
    "waiting",
    "admitted",
    "released",
    "failed",
    "dropped",
)


def rank(w: Work) -> tuple[int, int]:
    """Admission order: higher priority first, then lower id (no aging)."""
    return (-w.priority, w.id)


class SchedulerMachine(RuleBasedStateMachine):
    """Plays the engine: adds works, schedules, settles admitted works, cancels waiting ones;
    the model is each work's fate and the rows and bytes each model holds."""

    works = Bundle("works")
    admitted = Bundle("admitted")

    def __init__(self) -> None:
        super().__init__()
        self.scheduler = create_scheduler(MACHINE_SLOTS, budgets=MACHINE_BUDGETS)
        self.next_id = 1
        self.requests: list[Request] = []  # every per-item request, for depends_on
        self.all: dict[int, Work] = {}
        self.fate: dict[int, str] = {}  # work id -> WAITING, ADMITTED, ...

    # -- the model ----------------------------------------------------------------------

    def _with(self, fate: str, model: str | None = None) -> list[Work]:
        return [
            w
            for w in self.all.values()
            if self.fate[w.id] == fate and (model is None or w.model == model)
        ]

    @staticmethod
    def _doomed(w: Work) -> bool:
        return any(d.done() and d.state is not S.DONE for d in w.depends_on)

    @staticmethod
    def _eligible(w: Work) -> bool:
        return all(d.state is S.DONE for d in w.depends_on) and not w.cancelled

    def _fits(self, model: str, w: Work) -> bool:
        held = self._with(ADMITTED, model)
        rows = sum(x.rows for x in held)
        nbytes = sum(x.nbytes for x in held)
        budget = MACHINE_BUDGETS[model]
        if not held:
            return True
        return rows + w.rows <= MACHINE_SLOTS[model] and (
            budget is None or nbytes + w.nbytes <= budget
        )

    def _ended(self, r: Request) -> None:
        """What the engine does for each request that ends."""
        if self.scheduler.watches(r.id):
            self.scheduler.dependency_ended(r)

    def _end_waiting(self, w: Work, state: RequestState, error: BaseException) -> None:
        """End every row of a waiting work, then `drop` it (the engine's _drop_rows)."""
        if w.requests is None:
            if state is S.CANCELLED:
                w.cancel()
            w.pieces.append((0, w.rows, error))
        else:
            for r in w.requests:
                if state is S.CANCELLED:
                    r.cancel()
                else:
                    r.try_transition(state, error=error)
                self._ended(r)
        self.scheduler.drop(w)
        w.finish()

    # -- rules --------------------------------------------------------------------------

    @rule(
        target=works,
        model=st.sampled_from(sorted(MACHINE_SLOTS)),
        rows=st.integers(1, 4),
        priority=st.integers(-2, 2),
        wide=st.booleans(),
        per_item=st.booleans(),
        deps=st.one_of(
            st.just([]), st.lists(st.integers(0, 10**6), min_size=1, max_size=2, unique=True)
        ),
    )
    def add(
        self, model: str, rows: int, priority: int, wide: bool, per_item: bool, deps: list[int]
    ) -> Work:
        depends_on: list[Request] = []
        if self.requests:
            for d in deps:
                r = self.requests[d % len(self.requests)]
                if r not in depends_on:
                    depends_on.append(r)
        w = create_work(
            self.next_id,
            model,
            rows=rows,
            priority=priority,
            depends_on=depends_on,
            width=2 if wide else 1,
            per_item=per_item,
        )
        self.next_id += rows
        self.requests.extend(w.requests or ())
        self.all[w.id] = w
        self.fate[w.id] = WAITING
        self.scheduler.add(w)
        return w

    @rule(target=admitted)
    def schedule(self) -> object:
        doomed = {w.id for w in self._with(WAITING) if self._doomed(w)}
        eligible = [w for w in self._with(WAITING) if self._eligible(w)]
        plan = self.scheduler.schedule(0.0)
        assert plan.expired == ()
        for w in plan.admitted:
            assert self.fate[w.id] == WAITING, f"{w} admitted while {self.fate[w.id]}"
            assert w.state is S.READY
            self.fate[w.id] = ADMITTED
            for r in w.requests or ():
                r.try_transition(S.READY)
        for model in MACHINE_SLOTS:
            now = [w for w in plan.admitted if w.model == model]
            assert now == sorted(now, key=rank), f"{model}: {now} not in priority order"
            passed = [w for w in eligible if w.model == model and self.fate[w.id] == WAITING]
            for x in now:
                for w in passed:
                    assert rank(x) < rank(w), f"{x} admitted past {w}"
        reported = set()
        for w, error in plan.failed:
            assert isinstance(error, DependencyFailed)
            assert self._doomed(w), f"{w} failed without a failed dependency"
            assert w.id not in reported
            reported.add(w.id)
            if self.fate[w.id] == DROPPED:
                # cancelled after its dependency failed: already ended, the engine skips it
                assert w.done
                continue
            assert self.fate[w.id] == WAITING, f"{w} failed while {self.fate[w.id]}"
            self._end_waiting(w, S.ERROR, error)
            self.fate[w.id] = FAILED
        assert doomed <= reported, f"dependents of failed requests not failed: {doomed - reported}"
        for model in MACHINE_SLOTS:  # nothing waits that fits (and holding nothing, all fit)
            eligible_now = sorted(
                (w for w in self._with(WAITING, model) if self._eligible(w)), key=rank
            )
            if eligible_now:
                head = eligible_now[0]
                assert not self._fits(model, head), f"{model}: {head} fits but still waits"
        return multiple(*plan.admitted)

    @rule(work=consumes(admitted), ok=st.booleans())
    def settle(self, work: Work, ok: bool) -> None:
        """Every row ran (ok: DONE, else ERROR); then the work's slots are released."""
        for r in work.requests or ():
            if r.try_transition(S.RUNNING):
                if ok:
                    r.try_transition(S.DONE, outputs={})
                else:
                    r.try_transition(S.ERROR, error=RuntimeError("boom"))
            self._ended(r)
        self.scheduler.release(work)
        work.finish()
        self.fate[work.id] = RELEASED

    @rule(work=consumes(works))
    def cancel(self, work: Work) -> None:
        """Cancel a work if it is still waiting (admitted and ended ones are left alone)."""
        if self.fate[work.id] == WAITING:
            self._end_waiting(work, S.CANCELLED, RequestCancelled("cancelled"))
            self.fate[work.id] = DROPPED

    def _cancellable_requests(self) -> list[Request]:
        return [
            r
            for w in self._with(WAITING)
            for r in w.requests or ()
            if r.state is S.WAITING and not self._doomed(w)
        ]

    @precondition(lambda self: self._cancellable_requests())
    @rule(data=st.data())
    def cancel_one_request(self, data: st.DataObject) -> None:
        """Cancel one row of a waiting work; the work drops once every row has ended."""
        r = data.draw(st.sampled_from(self._cancellable_requests()))
        assert r.cancel()
        self._ended(r)
        w = r.work
        assert isinstance(w, Work) and w.requests is not None
        if all(x.done() for x in w.requests):
            self.scheduler.drop(w)
            w.finish()
            self.fate[w.id] = DROPPED

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def slots_and_budget_hold_unless_one_work_runs_alone(self) -> None:
        for model, slots in MACHINE_SLOTS.items():
            held = self._with(ADMITTED, model)
            if len(held) <= 1:
                continue
            assert sum(w.rows for w in held) <= slots, f"{model}: {held} over {slots} slots"
            budget = MACHINE_BUDGETS[model]
            if budget is not None:
                assert sum(w.nbytes for w in held) <= budget, f"{model}: {held} over budget"

    @invariant()
    def admitted_only_with_every_dependency_done(self) -> None:
        for w in self._with(ADMITTED) + self._with(RELEASED):
            assert all(d.state is S.DONE for d in w.depends_on), f"{w} ran before a dependency"

    @invariant()
    def each_fate_matches_the_work_state(self) -> None:
        for w in self.all.values():
            fate = self.fate[w.id]
            if fate == WAITING:
                assert w.state is S.WAITING
            elif fate == ADMITTED:
                assert w.state is S.READY
            else:
                assert w.done

    @invariant()
    def num_waiting_counts_the_rows_of_waiting_works(self) -> None:
        assert self.scheduler.num_waiting == sum(w.rows for w in self._with(WAITING))

    @invariant()
    def waiting_works_lists_every_live_waiting_work(self) -> None:
        """What `cancel_all` relies on; doomed works end at the next schedule instead."""
        listed = {w.id for w in self.scheduler.waiting_works()}
        for w in self._with(WAITING):
            assert self._doomed(w) or w.id in listed, f"{w} missing from waiting_works()"


TestSchedulerMachine = SchedulerMachine.TestCase
