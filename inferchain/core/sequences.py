"""Sequences: the sequence layer's one object, for the engine below and for the callers above.

The sequence layer is the StatePool of each stateful model (`state_pool`), its StepBatcher
(`step_batcher`: the steps of `oi.sequence()`, until they make a batch) and the
SequenceRunners of its steppers (`sequence_runner`: `oi.run_sequence()`). It owns them:
callers (a `LiveSequence`, `OfflineInference.run_sequence`) step sequences through it, and
it submits the step batches they form to the engine's `Inbox`, a record each, as any caller
submits Works. The engine drives it as it drives the Scheduler: it calls down and gets
Works back; nothing here calls the engine.

Two kinds of engine call, by what they may run:
- under the engine's lock, no user code: `due` (step groups whose window passed, or whose
  every open row has stepped), `landing` (steps of a formed group end), `num_pending`,
  `next_deadline`;
- on the engine's loop thread *outside* its lock, where a Stepper's `feed`/`take`/`result`
  and `initial` run: `after` (the cohorts whose step batch finished, and sequences that
  waited for lanes or past their deadline).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from inferchain.core.inbox import Inbox
from inferchain.core.request import Callback, Request
from inferchain.core.sequence_runner import SequenceRunner, Stepping
from inferchain.core.state_pool import StatePool
from inferchain.core.step_batcher import StepBatcher
from inferchain.core.work import Work
from inferchain.inputs import InputSpec
from inferchain.shapes import ShapePolicy

TakeIds = Callable[[int], int]  # n -> the first of n new request ids (raises once closed)
_OPTIONS = frozenset({"priority", "timeout", "callback"})


@attrs.frozen(eq=False)
class StatefulModel:
    """What the sequence layer knows of one stateful model (built at `init()`)."""

    pool: StatePool  # its sequences' lanes of carried state
    batcher: StepBatcher  # the queued steps of its live sequences
    spec: InputSpec  # what one step must look like
    names: tuple[str, ...]  # the outputs a step gives
    shapes: ShapePolicy
    batch_rows: int
    priority: int  # the recipe's defaults for a step's options
    timeout_s: float | None
    record: Callable[[int], None] | None = None  # told the open rows as step batches form


class Sequences:
    """Every stateful model's StepBatcher and every SequenceRunner of this engine."""

    def __init__(
        self,
        inbox: Inbox | None = None,
        models: Mapping[str, StatefulModel] | None = None,
        take_ids: TakeIds | None = None,
    ) -> None:
        """`inbox`: where the step batches go (the engine's); `take_ids`: the facade's id
        source. Without them (an engine that runs no sequences) it only answers the
        engine."""
        self._inbox = inbox or Inbox()
        self.models: Mapping[str, StatefulModel] = dict(models or {})
        self.batchers = {name: m.batcher for name, m in self.models.items()}
        self._take_ids = take_ids or (lambda n: 0)
        self._runners: dict[tuple[str, int], SequenceRunner] = {}  # by (model, stepper id)
        self._runner_list: tuple[SequenceRunner, ...] = ()  # read by the loop without a lock
        self._lock = threading.Lock()  # guards _runners

    # -- the callers' side (any thread) ---------------------------------------------------

    def step(
        self,
        model: str,
        inputs: Mapping[str, Any],
        lanes: np.ndarray,
        options: Mapping[str, Any],
        many: bool,
        before: Callable[[], None] | None = None,
    ) -> list[Request]:
        """Submit one step of the sequence on `lanes`: `inputs` of its one row, or (`many`)
        one row per lane; `before` runs once the inputs are checked (a reorder of the
        sequence's state). Plain steps join the model's StepBatcher, which forms one Work
        per step batch; a step with a priority or a timeout is a Work of its own."""
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise TypeError(f"step() got unexpected options {unknown}")
        m = self.models[model]
        steps = m.batcher
        if many:
            items, keys = steps.rows(inputs, lanes)
        else:
            item, key = steps.item(inputs, int(lanes[0]))
            items, keys = [item], [key]
        if before is not None:
            before()
        first = self._take_ids(len(items))
        callback = options.get("callback")
        if options.keys() - {"callback"}:
            return self._step_alone(m, first, items, lanes, options)
        queued = self._cancel_step(steps)
        requests = [steps.request(first + j, it, callback, queued) for j, it in enumerate(items)]
        self._queue(steps, requests, lanes.tolist(), items, keys)
        return requests

    def _step_alone(
        self,
        m: StatefulModel,
        first: int,
        items: Sequence[tuple[np.ndarray, ...]],
        lanes: np.ndarray,
        options: Mapping[str, Any],
    ) -> list[Request]:
        """Steps with a priority or a timeout: a Work of their own, which the Scheduler
        admits like any other."""
        steps, callback = m.batcher, options.get("callback")
        priority = options.get("priority")
        prio = m.priority if priority is None else priority
        timeout = options.get("timeout", m.timeout_s)
        deadline = None if timeout is None else time.perf_counter() + timeout
        cancel = self._inbox.cancel
        requests = [
            steps.request(first + j, it, callback, cancel, priority=prio, deadline=deadline)
            for j, it in enumerate(items)
        ]
        work = steps.work_of(first, requests, lanes, items, priority=prio, deadline=deadline)
        self._inbox.submit(work, block=True, bounded=True)
        return requests

    def step_one(
        self, model: str, inputs: Mapping[str, Any], lane: int, callback: Callback | None
    ) -> Request:
        """A plain step of a one-row sequence (`step` without options but a callback)."""
        steps = self.models[model].batcher
        item, key = steps.item(inputs, lane)
        request = steps.request(self._take_ids(1), item, callback, self._cancel_step(steps))
        self._queue(steps, [request], [lane], [item], [key])
        return request

    def release(self, model: str, lanes: np.ndarray) -> None:
        """A closed sequence's lanes are free again: sequences that wait for lanes may
        start (the loop hears of it)."""
        self.models[model].pool.release(lanes)
        self._inbox.wake()

    def start(
        self, model: str, stepper: Stepping, item: Any, timeout: float | None = None
    ) -> Request:
        """A whole sequence of `model` for `item`, its host logic in `stepper` (its runner,
        made once per stepper); its Request ends with the stepper's result."""
        runner = self._runner(model, stepper)
        deadline = None if timeout is None else time.perf_counter() + timeout

        def cancel(request: Request) -> None:
            self._submit_cohorts(runner, runner.cancelled(request))

        request = Request(self._take_ids(1), model, deadline=deadline, on_cancel=cancel)
        self._submit_cohorts(runner, runner.submit(request, item))
        if deadline is not None:
            self._inbox.wake()  # the loop times the deadline while it waits
        return request

    def flush(self) -> None:
        """Every queued step as step batches now (possibly partial)."""
        for steps in self.batchers.values():
            if steps.num_pending:
                with steps.lock:
                    for work in steps.flush():
                        self._inbox.submit(work, block=False, bounded=False)

    @property
    def runners(self) -> tuple[SequenceRunner, ...]:
        return self._runner_list

    def _runner(self, model: str, stepper: Stepping) -> SequenceRunner:
        """The runner of `model` for `stepper`, made once (any thread)."""
        with self._lock:
            found = self._runners.get((model, id(stepper)))
            if found is None:
                m = self.models[model]
                found = SequenceRunner(
                    m.pool, m.spec, stepper, names=m.names, shapes=m.shapes,
                    batch_rows=m.batch_rows, cohorts=stepper.cohorts,
                    take_id=lambda: self._take_ids(1), record=m.record,
                )  # fmt: skip
                self._runners[(model, id(stepper))] = found
                self._runner_list = (*self._runner_list, found)
            return found

    def _queue(
        self,
        steps: StepBatcher,
        requests: Sequence[Request],
        lanes: Sequence[int],
        items: Sequence[tuple[np.ndarray, ...]],
        keys: Sequence[Hashable],
    ) -> None:
        """Queue steps in their StepBatcher and submit the batches they complete, under its
        lock: a cancel of one of their steps then reaches the engine after the batch."""
        with steps.lock:
            formed, new_group = steps.add(requests, lanes, items, keys)
            for work in formed:
                self._inbox.submit(work, block=False, bounded=False)
        if new_group:
            self._inbox.wake()  # the loop times the new group's window

    def _cancel_step(self, steps: StepBatcher) -> Callable[[Request], None]:
        """A step request's cancel: it leaves its StepBatcher, or the engine hears of it
        where it is in a batch already."""
        inbox = self._inbox

        def cancel(request: Request) -> None:
            if not steps.cancelled(request):
                inbox.cancel(request)

        return cancel

    def _submit_cohorts(self, runner: SequenceRunner, works: list[Work]) -> None:
        """A runner's step batches to the engine; one it refuses ends its sequences."""
        for work in works:
            try:
                self._inbox.submit(work, block=False, bounded=False)
            except Exception as e:  # e.g. Closed: the engine is stopping
                runner.refused(work, e)

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
