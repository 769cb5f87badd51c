"""The Request state machine: the transition table, atomicity under threads, the future API."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from inferchain import InvalidTransition, Request, RequestCancelled, RequestState
from inferchain.core.request import TRANSITIONS, advance, conclude

S = RequestState
LEGAL = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}


def make(on_terminal=None) -> Request:  # type: ignore[no-untyped-def]
    r = Request(1, "m", (np.zeros(3, np.float32),))
    if on_terminal is not None:
        r.add_done_listener(on_terminal)
    return r


def drive_to(request: Request, state: RequestState) -> None:
    path = {
        S.WAITING: [],
        S.READY: [S.READY],
        S.RUNNING: [S.READY, S.RUNNING],
        S.DONE: [S.READY, S.RUNNING, S.DONE],
        S.ERROR: [S.ERROR],
        S.CANCELLED: [S.CANCELLED],
        S.TIMED_OUT: [S.TIMED_OUT],
    }[state]
    for s in path:
        request.transition(s, outputs={} if s is S.DONE else None, error=None)


def test_table_is_the_documented_chain() -> None:
    assert TRANSITIONS[S.WAITING] == {S.READY, S.ERROR, S.CANCELLED, S.TIMED_OUT}
    assert TRANSITIONS[S.READY] == {S.RUNNING, S.ERROR, S.CANCELLED, S.TIMED_OUT}
    assert TRANSITIONS[S.RUNNING] == {S.DONE, S.ERROR}  # a running batch is never torn apart
    assert all(not TRANSITIONS[s] for s in S if s.is_terminal)


@pytest.mark.parametrize("start", list(S))
@pytest.mark.parametrize("target", list(S))
def test_every_pair_is_legal_or_rejected(start: RequestState, target: RequestState) -> None:
    r = make()
    drive_to(r, start)
    if (start, target) in LEGAL:
        r.transition(target, outputs={} if target is S.DONE else None)
        assert r.state is target
        assert r.stamp(target) is not None
    else:
        with pytest.raises(InvalidTransition, match=f"{start.name} -> {target.name}"):
            r.transition(target)
        assert r.state is start
        assert not r.try_transition(target)


class RequestMachine(RuleBasedStateMachine):
    """Random transitions against the table; a done-listener fires exactly once."""

    def __init__(self) -> None:
        super().__init__()
        self.hook_calls = 0
        self.request = make(on_terminal=self._hook)
        self.model_state = S.WAITING

    def _hook(self, _: Request) -> None:
        self.hook_calls += 1

    @rule(to=st.sampled_from(list(S)))
    def move(self, to: RequestState) -> None:
        ok = self.request.try_transition(to, outputs={} if to is S.DONE else None)
        assert ok == ((self.model_state, to) in LEGAL)
        if ok:
            self.model_state = to

    @rule()
    def cancel(self) -> None:
        ok = self.request.cancel()
        assert ok == ((self.model_state, S.CANCELLED) in LEGAL)
        if ok:
            self.model_state = S.CANCELLED

    @invariant()
    def agrees_with_model(self) -> None:
        assert self.request.state is self.model_state
        assert self.hook_calls == (1 if self.model_state.is_terminal else 0)
        assert self.request.done() == self.model_state.is_terminal


TestRequestMachine = RequestMachine.TestCase


@given(st.lists(st.sampled_from([S.DONE, S.ERROR]), min_size=2, max_size=8))
def test_racing_threads_finish_a_request_exactly_once(targets: list[RequestState]) -> None:
    calls: list[int] = []
    r = make(on_terminal=lambda req: calls.append(req.id))
    drive_to(r, S.RUNNING)
    barrier = threading.Barrier(len(targets))
    wins: list[RequestState] = []

    def race(target: RequestState) -> None:
        barrier.wait()
        if r.try_transition(target, outputs={} if target is S.DONE else None):
            wins.append(target)

    threads = [threading.Thread(target=race, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert calls == [1]
    assert r.state is wins[0]


def race_admission_and_cancel() -> tuple[Request, bool, bool]:
    r = make()
    barrier = threading.Barrier(2)
    results: dict[str, bool] = {}

    def admit() -> None:
        barrier.wait()
        results["ready"] = r.try_transition(S.READY)

    def cancel() -> None:
        barrier.wait()
        results["cancel"] = r.cancel()

    threads = [threading.Thread(target=admit), threading.Thread(target=cancel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return r, results["ready"], results["cancel"]


def test_cancel_races_admission_one_wins() -> None:
    for _ in range(200):
        r, admitted, cancelled = race_admission_and_cancel()
        assert cancelled  # WAITING and READY can both be cancelled
        assert r.state is S.CANCELLED
        if admitted:  # admission won the race first, then the cancel
            assert r.stamp(S.READY) is not None


def test_result_is_a_future() -> None:
    r = make()
    with pytest.raises(TimeoutError):
        r.result(timeout=0.01)
    drive_to(r, S.RUNNING)
    t = threading.Timer(0.02, lambda: r.transition(S.DONE, outputs={"y": np.ones(2)}))
    t.start()
    assert r.result(timeout=5)["y"].tolist() == [1.0, 1.0]
    t.join()


def test_result_raises_the_error() -> None:
    r = make()
    assert r.cancel()
    with pytest.raises(RequestCancelled, match="request 1 was cancelled"):
        r.result()
    assert r.inputs == ()  # a finished request frees its inputs


def test_done_listener_runs_once_even_if_added_late() -> None:
    r = make()
    seen: list[RequestState] = []
    r.add_done_listener(lambda req: seen.append(req.state))
    drive_to(r, S.DONE)
    r.add_done_listener(lambda req: seen.append(req.state))
    assert seen == [S.DONE, S.DONE]
    assert set(r.timings) == {"WAITING", "READY", "RUNNING", "DONE"}


# -- many requests of one Work at once ---------------------------------------------------


def siblings(n: int) -> tuple[threading.Lock, list[Request]]:
    lock = threading.Lock()
    return lock, [Request(i, "m", (np.zeros(1, np.float32),), lock=lock) for i in range(n)]


@given(
    starts=st.lists(st.sampled_from(list(S)), min_size=1, max_size=8),
    to=st.sampled_from(list(S)),
)
def test_bulk_transitions_agree_with_the_table(
    starts: list[RequestState], to: RequestState
) -> None:
    lock, reqs = siblings(len(starts))
    seen: list[int] = []
    for r, start in zip(reqs, starts, strict=True):
        drive_to(r, start)
        r.add_done_listener(lambda q: seen.append(q.id))
    seen.clear()  # listeners of requests already terminal ran at once
    movable = [(s, to) in LEGAL for s in starts]
    if to.is_terminal:
        outs = [{"y": np.full(1, i, np.float32)} for i in range(len(reqs))]
        ended = conclude(reqs, to, lock, outs if to is S.DONE else None, RuntimeError("x"))
        assert [r.id for r in ended] == [r.id for r, ok in zip(reqs, movable, strict=True) if ok]
        assert seen == [r.id for r in ended]  # each listener ran once, after the move
        for r in ended:
            assert r.state is to and r.inputs == ()
            if to is S.DONE:
                assert r.outputs is not None and r.outputs["y"][0] == r.id
    else:
        stuck = advance(reqs, to, lock, 12.5)
        assert stuck == [i for i, ok in enumerate(movable) if not ok]
        for r, start, ok in zip(reqs, starts, movable, strict=True):
            assert r.state is (to if ok else start)
            if ok:
                assert r.stamp(to) == 12.5


def race_bulk_admission_and_cancel() -> tuple[list[Request], list[int], bool]:
    lock, reqs = siblings(16)
    barrier = threading.Barrier(2)
    out: dict[str, Any] = {}

    def admit() -> None:
        barrier.wait()
        out["stuck"] = advance(reqs, S.READY, lock, 1.0)

    def cancel() -> None:
        barrier.wait()
        out["cancelled"] = reqs[7].cancel()

    threads = [threading.Thread(target=admit), threading.Thread(target=cancel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return reqs, out["stuck"], out["cancelled"]


def test_a_cancel_racing_a_bulk_advance_is_seen_by_it_or_comes_after() -> None:
    for _ in range(100):
        reqs, stuck, cancelled = race_bulk_admission_and_cancel()
        assert cancelled and reqs[7].state is S.CANCELLED
        assert stuck in ([], [7])  # moved to READY first, or skipped as cancelled
        assert all(r.state is S.READY for i, r in enumerate(reqs) if i != 7)


def test_a_request_of_a_work_reads_its_row_lazily() -> None:
    from inferchain.core.work import Work

    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    work = Work(1, "m", (x,), shape_key=((2,),), exact=((2,),), names=("y",), submitted=0.0)
    r = Request(2, "m", work=work, row=1, lock=work.lock)
    assert [a.tolist() for a in r.inputs] == [[2.0, 3.0]]
    assert r.cancel()
    assert r.inputs == ()
