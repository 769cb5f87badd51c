"""SequenceRunner: whole sequences run by a Stepper, the host logic of many sequences at once.

`OfflineInference.run_sequence(model, stepper, item)` hands a sequence to the model's runner
for that stepper. The runner keeps the open sequences in cohorts; when a cohort's step batch
lands, the stepper updates all of them at once, the ended ones leave and free their lanes,
and the next batch leaves at once. See docs/sequences.md.

It calls nobody: every method returns the Works to run next, and its caller hands them to
the engine (the facade for `submit` and `cancelled`; the engine's loop, outside its lock,
for `landed` and `poll`). The stepper's code runs in those calls, under the runner's own
lock, one call at a time, never under the engine's.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from inferchain.core.request import Request, RequestState
from inferchain.core.state_pool import StatePool
from inferchain.core.step_batcher import STEP_COHORTS, cohort_size
from inferchain.core.work import StepRows, Work
from inferchain.errors import InvalidInput, RequestError, RequestTimeout
from inferchain.inputs import InputSpec, unbatched_value
from inferchain.shapes import ShapePolicy

_CARRIED, _UNBATCHED, _FED = "carried", "unbatched", "fed"  # where a step input comes from


class Stepping(Protocol):
    """What a runner calls of a stepper (`inferchain.Stepper` is the documented base)."""

    rows: int
    cohorts: int
    steps_per_batch: int

    def start(self, item: Any) -> Any: ...
    def group(self, state: Any) -> Hashable: ...
    def initial(self, state: Any) -> Mapping[str, np.ndarray] | None: ...
    def feed(self, states: Sequence[Any]) -> Mapping[str, np.ndarray]: ...
    def take(
        self, states: Sequence[Any], outputs: Mapping[str, np.ndarray]
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray | None]: ...
    def result(self, state: Any) -> Any: ...


class _Live:
    """One sequence run by a `SequenceRunner`."""

    __slots__ = ("group", "lanes", "request", "state")

    def __init__(self, request: Request, state: Any, group: Hashable) -> None:
        self.request = request
        self.state = state
        self.group = group  # the stepper's: only sequences of one group share a step batch
        self.lanes: np.ndarray | None = None


class Cohort:
    """The sequences of one step batch on its way (`StepRows.cohort` of its Work)."""

    __slots__ = ("lives", "runner")

    def __init__(self, runner: SequenceRunner, lives: list[_Live]) -> None:
        self.runner = runner
        self.lives = lives


class SequenceRunner:
    """Runs whole sequences of a model with one stepper (see the module docstring).

    The open sequences step in `cohorts` batches (two: one is on a worker while the other's
    host step runs and it queues behind). A cohort holds at most its share of the open
    rows (and a batch), all of one group (`Stepper.group`, and one instance's lanes where
    the pool is partitioned); new sequences join the next cohort of their group that leaves.
    """

    def __init__(
        self,
        pool: StatePool,
        spec: InputSpec,
        stepper: Stepping,
        *,
        names: tuple[str, ...],
        shapes: ShapePolicy,
        batch_rows: int,
        take_id: Callable[[], int],
        cohorts: int = STEP_COHORTS,
        record: Callable[[int], None] | None = None,
    ) -> None:
        self.pool = pool
        self.spec = spec
        self.stepper = stepper
        self.names = names
        self.shapes = shapes
        self.rows = max(1, int(stepper.rows))
        self.steps_per_batch = max(1, int(stepper.steps_per_batch))  # steps one batch runs
        self.batch_rows = max(batch_rows, self.rows)
        self.cohorts = max(1, cohorts)
        self._take_id = take_id
        self._record = record  # told the open rows each time a step batch leaves
        self._lock = threading.RLock()
        self._waiting: deque[_Live] = deque()  # submitted, no lanes yet
        self._joining: list[_Live] = []  # with lanes, for the next cohort
        self._in_flight = 0  # cohorts on their way
        self._live = 0  # sequences with lanes
        self._freed: list[np.ndarray] = []  # lanes to give back once the lock is left
        self._open: set[_Live] = set()  # every sequence submitted and not ended
        self._grouped = pool.partitions > 1  # some cohort must leave sequences out
        # (deadline, id, sequence) of those submitted with a deadline, soonest first (some
        # started or ended since)
        self._timed: list[tuple[float, int, _Live]] = []
        # the soonest deadline of a sequence waiting for lanes (or inf): read by the
        # engine's loop without the lock, to wake then
        self.next_deadline = float("inf")
        carried = {i for _, i, _ in pool.carried}
        self._fed = [n for i, n in enumerate(spec.names) if i not in carried]
        # how `_work` builds each input: from the pool's lanes, as the one value of an
        # unbatched input, or from the rows feed() gave
        self._plan = tuple(
            (i, name, _CARRIED if i in carried else _UNBATCHED if i in spec.unbatched else _FED)
            for i, name in enumerate(spec.names)
        )
        # per unbatched input: the last value feed() gave, that value as rows of a whole
        # batch (a view) and its part of the batch key
        self._unbatched: dict[int, tuple[Any, bytes | None, np.ndarray, Hashable]] = {}

    # -- the facade's calls ---------------------------------------------------------------

    def submit(self, request: Request, item: Any) -> list[Work]:
        """A new sequence for `item` (the caller's thread); `request` ends with its result.
        Returns the step batches that can leave now."""
        stepper = self.stepper
        state = stepper.start(item)
        group = stepper.group(state)
        live = _Live(request, state, group)
        with self._lock:
            self._grouped = self._grouped or group is not None
            self._open.add(live)
            self._waiting.append(live)
            if request.deadline is not None:
                heapq.heappush(self._timed, (request.deadline, request.id, live))
            works = self._admit_and_launch(time.perf_counter())
        self._give_back()
        return works

    def cancelled(self, request: Request) -> list[Work]:
        """A sequence's request was cancelled: it leaves now where it waits, else at its
        cohort's next landing."""
        works: list[Work] = []
        with self._lock:
            for live in list(self._waiting):
                if live.request is request:
                    self._waiting.remove(live)
                    self._open.discard(live)
                    break
            else:
                for live in list(self._joining):
                    if live.request is request:
                        self._joining.remove(live)
                        self._free(live)
                        self._open.discard(live)
                        works = self._admit_and_launch(time.perf_counter())
                        break
        self._give_back()
        return works

    def refused(self, work: Work, error: BaseException) -> None:
        """The engine would not take `work` (e.g. `Closed`): its sequences end with `error`."""
        cohort = work.steps.cohort if work.steps is not None else None
        assert isinstance(cohort, Cohort)
        with self._lock:
            self._in_flight -= 1
            self._end(cohort.lives, None, error)
        self._give_back()

    def abort(self, error: BaseException) -> None:
        """End every sequence not yet ended (after the engine stopped)."""
        with self._lock:
            lives = list(self._open)
            self._open.clear()
            self._waiting.clear()
            self._joining.clear()
            for live in lives:
                self._free(live)
        for live in lives:
            live.request.try_transition(RequestState.CANCELLED, error=error)
        self._give_back()

    # -- the engine's calls (its loop thread, outside the engine's lock) ------------------

    def landed(self, work: Work) -> list[Work]:
        """A cohort's step batch has finished: the stepper takes its outputs; returns the
        step batches that can leave now."""
        cohort = work.steps.cohort if work.steps is not None else None
        assert isinstance(cohort, Cohort) and cohort.runner is self
        with self._lock:
            self._in_flight -= 1
            outputs, error = _outputs_of(work)
            if error is not None:
                self._end(cohort.lives, None, error)
            else:
                self._take(cohort.lives, outputs)
            works = self._admit_and_launch(time.perf_counter())
        self._give_back()
        return works

    def poll(self, now: float) -> list[Work]:
        """Sequences waiting for lanes: those past their deadline end, those that find
        free lanes start; returns the step batches that can leave now."""
        if not self._waiting:
            return []
        with self._lock:
            if self.pool.num_free < self.rows and self.next_deadline > now:
                return []
            works = self._admit_and_launch(now)
        self._give_back()
        return works

    # -- under _lock ----------------------------------------------------------------------

    def _admit_and_launch(self, now: float) -> list[Work]:
        self._admit(now)
        works = self._launch_ready()
        timed = self._timed
        while timed and (timed[0][2].lanes is not None or timed[0][2].request.done()):
            heapq.heappop(timed)
        self.next_deadline = timed[0][0] if timed else float("inf")
        return works

    def _admit(self, now: float) -> None:
        """Waiting sequences past their deadline end; those that get lanes join the next
        cohort."""
        timed = self._timed
        while timed and timed[0][0] <= now:  # anywhere in the line (they leave it at its head)
            _, _, live = heapq.heappop(timed)
            if live.lanes is None:
                _expire(live.request, now)
        while self._waiting:
            live = self._waiting[0]
            if live.request.done():
                self._waiting.popleft()
                self._open.discard(live)
                continue
            try:
                lanes = self.pool.try_acquire(self.stepper.initial(live.state), self.rows)
            except Exception as e:  # a wrong initial state: that sequence fails alone
                self._waiting.popleft()
                self._open.discard(live)
                live.request.try_transition(RequestState.ERROR, error=e)
                continue
            if lanes is None:
                return
            self._waiting.popleft()
            live.lanes = lanes
            self._live += 1
            live.request.try_transition(RequestState.READY)
            self._joining.append(live)

    def _launch_ready(self) -> list[Work]:
        """The joining sequences' step batches, while fewer than `cohorts` are on their way."""
        works = []
        while self._joining and self._in_flight < self.cohorts:
            cap = cohort_size(self._live, self.cohorts, max(1, self.batch_rows // self.rows))
            work = self._launch(self._cohort(cap))
            if work is not None:
                works.append(work)
        return works

    def _cohort(self, cap: int) -> list[_Live]:
        """The next cohort, taken out of the joining sequences: the first `cap` of them that
        share the first one's group and instance (their order kept)."""
        joining = self._joining
        if not self._grouped:
            self._joining = joining[cap:]
            return joining[:cap]
        key = self._key(joining[0])
        lives: list[_Live] = []
        rest: list[_Live] = []
        for live in joining:
            (lives if len(lives) < cap and self._key(live) == key else rest).append(live)
        self._joining = rest
        return lives

    def _key(self, live: _Live) -> tuple[int, Hashable]:
        """What a sequence must share with the others of its cohort: the instance of its
        lanes (a partitioned pool) and its stepper's group."""
        assert live.lanes is not None
        pool = self.pool
        part = pool.partition_of(int(live.lanes[0])) if pool.partitions > 1 else 0
        return part, live.group

    def _launch(self, lives: list[_Live]) -> Work | None:
        pool = self.pool
        if pool.on_device:  # a re-loaded model lost the state of those that had stepped
            lost = [live for live in lives if live.lanes is not None and pool.lost(live.lanes)]
            if lost:
                self._end(lost, None, pool.lost_error())
                lives = [live for live in lives if live not in lost]
                if not lives:
                    return None
        try:
            fed = self.stepper.feed([live.state for live in lives])
            work = self._work(lives, fed)
        except Exception as e:
            self._end(lives, None, e)
            return None
        self._in_flight += 1
        if self._record is not None:
            self._record(self._live * self.rows)
        return work

    def _work(self, lives: list[_Live], fed: Mapping[str, np.ndarray]) -> Work:
        spec, pool = self.spec, self.pool
        n = len(lives) * self.rows
        if len(fed) != len(self._fed) or any(name not in fed for name in self._fed):
            raise InvalidInput(
                f"model {pool.model!r}: the stepper's feed() gave {sorted(fed)}; the model's "
                f"inputs not carried are {self._fed}"
            )
        lanes = np.concatenate([live.lanes for live in lives if live.lanes is not None])
        inputs: list[np.ndarray] = []
        unbatched: list[Hashable] = []
        ahead: dict[int, np.ndarray] = {}  # a multi-step batch's fed inputs, every step
        for i, name, kind in self._plan:
            if kind is _CARRIED:
                inputs.append(pool.gather(i, lanes))
            elif kind is _UNBATCHED:  # its one value, seen in every row
                rows, key = self._unbatched_rows(i, fed[name])
                inputs.append(rows[:n])
                unbatched.append(key)
            elif self.steps_per_batch > 1:
                ahead[i] = self._steps_of(i, name, np.asarray(fed[name]), n)
                inputs.append(ahead[i][:, 0])
            else:
                block = spec.block(i, np.asarray(fed[name]))
                if len(block) != n:
                    raise InvalidInput(
                        f"model {pool.model!r} input {name!r}: the stepper's feed() gave "
                        f"{len(block)} rows for {len(lives)} sequences of {self.rows} rows"
                    )
                inputs.append(block)
        exact = tuple(a.shape[1:] for a in inputs)
        shape_key, key = self.shapes.keys(exact, tuple(unbatched) if spec.unbatched else None)
        k = self.steps_per_batch
        if k > 1 and shape_key != exact:
            raise InvalidInput(
                f"model {pool.model!r}: a multi-step batch (steps_per_batch {k}) runs"
                f" its rows at their own shapes, and rows of shapes {list(exact)} would "
                f"be padded to {list(shape_key)} (the model's shapes policy); feed them at "
                "that shape"
            )
        steps = StepRows(
            lanes,
            pool.state_rows(lanes),
            count=self.steps_per_batch,
            ahead=ahead or None,
            cohort=Cohort(self, lives),
            worker=pool.worker_of(lanes),
        )
        return Work.for_steps(
            self._take_id(),
            pool.model,
            tuple(inputs),
            steps,
            shape_key=shape_key,
            batch_key=key,
            exact=exact,
            names=self.names,
            submitted=time.perf_counter(),
        )

    def _steps_of(self, i: int, name: str, block: np.ndarray, n: int) -> np.ndarray:
        """Input `i` of a multi-step batch as feed() gave it, [n, K, *item], checked."""
        k = self.steps_per_batch
        if block.ndim < 2 or block.shape[:2] != (n, k):
            raise InvalidInput(
                f"model {self.pool.model!r} input {name!r}: the stepper's feed() gave an "
                f"array of shape {block.shape}; a batch of {n} rows and {k} steps "
                f"(steps_per_batch) takes ({n}, {k}, ...)"
            )
        flat = self.spec.block(i, block.reshape(n * k, *block.shape[2:]))
        return flat.reshape(n, k, *flat.shape[1:])

    def _unbatched_rows(self, i: int, value: Any) -> tuple[np.ndarray, Hashable]:
        """An unbatched input's one value as the rows of a whole batch (a read-only view),
        and its part of the batch key; checked once for as long as feed() gives the same
        array with the same contents (or the same number)."""
        raw = value.tobytes() if isinstance(value, np.ndarray) else None
        known = self._unbatched.get(i)
        if known is not None and known[0] is value and known[1] == raw:
            return known[2], known[3]
        checked = self.spec.check(i, value)
        rows = np.broadcast_to(checked, (self.batch_rows, *checked.shape))
        key = unbatched_value(checked)
        if raw is not None or isinstance(value, int | float | bool | np.generic):
            self._unbatched[i] = (value, raw, rows, key)
        return rows, key

    def _take(self, cohort: list[_Live], outputs: dict[str, np.ndarray]) -> None:
        now = time.perf_counter()
        for live in cohort:
            _expire(live.request, now)
        going = [live for live in cohort if not live.request.done()]  # cancelled, timed out
        for live in cohort:
            if live.request.done():
                self._free(live)
                self._open.discard(live)
        if not going:
            return
        if len(going) < len(cohort):
            keep = np.concatenate(
                [np.arange(j * self.rows, (j + 1) * self.rows) for j, live in enumerate(cohort)
                 if not live.request.done()]
            )  # fmt: skip
            outputs = {k: v[keep] for k, v in outputs.items()}
        try:
            taken = self.stepper.take([live.state for live in going], outputs)
            ended, reorder = taken if isinstance(taken, tuple) else (taken, None)
            ended = np.asarray(ended, dtype=bool).reshape(-1)
            if len(ended) != len(going):
                raise InvalidInput(
                    f"model {self.pool.model!r}: the stepper's take() gave {len(ended)} "
                    f"flags for {len(going)} sequences"
                )
            if reorder is not None:
                order = np.asarray(reorder).reshape(len(going), self.rows)
                lanes = np.stack([live.lanes for live in going if live.lanes is not None])
                rows = np.arange(len(going))[:, None]
                self.pool.move(lanes.reshape(-1), lanes[rows, order].reshape(-1))
        except Exception as e:
            self._end(going, None, e)
            return
        done = [live for live, e in zip(going, ended.tolist(), strict=True) if e]
        self._end(done, True, None)
        self._joining = [live for live, e in zip(going, ended.tolist(), strict=True) if not e] + (
            self._joining
        )

    def _end(self, lives: list[_Live], ok: bool | None, error: BaseException | None) -> None:
        """End these sequences: with their results (ok) or `error`; free their lanes."""
        for live in lives:
            request = live.request
            if ok:
                try:
                    value = self.stepper.result(live.state)
                except Exception as e:
                    request.try_transition(RequestState.RUNNING)
                    request.try_transition(RequestState.ERROR, error=e)
                else:
                    request.try_transition(RequestState.RUNNING)
                    request.try_transition(RequestState.DONE, outputs=value)  # the result
            else:
                request.try_transition(RequestState.RUNNING)
                request.try_transition(RequestState.ERROR, error=error)
            self._free(live)
            self._open.discard(live)

    def _free(self, live: _Live) -> None:
        if live.lanes is not None:
            self._freed.append(live.lanes)
            live.lanes = None
            self._live -= 1

    def _give_back(self) -> None:
        """Return the lanes freed under the lock to the pool (outside it)."""
        with self._lock:
            lanes, self._freed = self._freed, []
        for s in lanes:
            self.pool.release(s)


def _expire(request: Request, now: float) -> bool:
    """End a sequence's request TIMED_OUT if its deadline has passed; True if it did."""
    deadline = request.deadline
    if deadline is None or now < deadline:
        return False
    error = RequestTimeout(f"sequence {request.id} ({request.model}) passed its deadline")
    return request.try_transition(RequestState.TIMED_OUT, error=error)


def _outputs_of(work: Work) -> tuple[dict[str, np.ndarray], BaseException | None]:
    """A finished bulk Work's outputs by name (its rows in order), or its first error."""
    parts = work.arrays()
    for _, _, value in parts:
        if isinstance(value, BaseException):
            return {}, value
    if not parts:
        return {}, RequestError(f"work {work.id} ({work.model}) ended without outputs")
    arrays = [value for _, _, value in parts if not isinstance(value, BaseException)]
    if len(arrays) == 1:
        return dict(arrays[0]), None
    return {name: np.concatenate([a[name] for a in arrays]) for name in work.names}, None
