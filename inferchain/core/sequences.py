"""Sequences: the engine's one seam into the sequence layer.

The sequence layer is the StatePool of each stateful model (`state_pool`), its StepBatcher
(`step_batcher`: the steps of `oi.sequence()`, until they make a batch) and the
SequenceRunners of its steppers (`sequence_runner`: `oi.run_sequence()`). The engine drives
them through this one object, as it drives the Scheduler: it calls down and gets Works back.
Nothing here calls the engine or holds one of its callbacks.

Two kinds of call, by what they may run:
- under the engine's lock, no user code: `due` (step groups whose window passed, or whose
  every open row has stepped), `landing` (steps of a formed group end), `num_pending`,
  `next_deadline`;
- on the engine's loop thread *outside* its lock, where a Stepper's `feed`/`take`/`result`
  and `initial` run: `after` (the cohorts whose step batch finished, and sequences that
  waited for lanes or past their deadline).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from inferchain.core.sequence_runner import SequenceRunner
from inferchain.core.step_batcher import StepBatcher
from inferchain.core.work import Work


class Sequences:
    """Every stateful model's StepBatcher and every SequenceRunner of this engine."""

    def __init__(self) -> None:
        self.batchers: dict[str, StepBatcher] = {}  # by model; set at init, then read-only
        self._runners: dict[tuple[str, int], SequenceRunner] = {}  # by (model, stepper id)
        self._runner_list: tuple[SequenceRunner, ...] = ()  # read by the loop without a lock
        self._lock = threading.Lock()  # guards _runners

    def runner(self, model: str, key: int, make: Callable[[], SequenceRunner]) -> SequenceRunner:
        """The runner of `model` for the stepper `key` (its id), made once (any thread)."""
        with self._lock:
            found = self._runners.get((model, key))
            if found is None:
                found = self._runners[(model, key)] = make()
                self._runner_list = (*self._runner_list, found)
            return found

    @property
    def runners(self) -> tuple[SequenceRunner, ...]:
        return self._runner_list

    # -- under the engine's lock ----------------------------------------------------------

    def due(self, now: float) -> tuple[list[Work], float]:
        """The step batches of the StepBatchers that leave now, and when the next window
        ends."""
        works: list[Work] = []
        next_due = float("inf")
        for batcher in self.batchers.values():
            if batcher.num_pending:
                formed, due = batcher.due(now)
                works += formed
                next_due = min(next_due, due)
        return works, next_due

    def landing(self, work: Work, rows: int) -> None:
        """`rows` steps of `work` end now: a StepBatcher that formed it hears of it first
        (a step that follows them sees them gone)."""
        steps = work.steps
        if steps is not None and steps.queued:
            self.batchers[work.model].landed(rows)

    def num_pending(self, model: str) -> int:
        """Steps of `model` queued and not yet in a Work."""
        batcher = self.batchers.get(model)
        return 0 if batcher is None else batcher.num_pending

    @property
    def next_deadline(self) -> float:
        """The soonest deadline of a sequence waiting for lanes (perf_counter s), or inf."""
        return min((r.next_deadline for r in self._runner_list), default=float("inf"))

    # -- on the loop thread, outside the engine's lock ------------------------------------

    def after(self, landed: list[Work], now: float) -> list[Work]:
        """The runners' cohorts in `landed` finished: their steppers take the outputs; then
        waiting sequences start where lanes are free, or end past their deadline. Returns
        the step batches to submit."""
        works: list[Work] = []
        for work in landed:
            steps = work.steps
            assert steps is not None and steps.cohort is not None
            works += steps.cohort.runner.landed(work)
        for runner in self._runner_list:
            works += runner.poll(now)
        return works

    def abort(self, error: BaseException) -> None:
        """End every sequence still open (the engine has stopped)."""
        for runner in self._runner_list:
            runner.abort(error)
