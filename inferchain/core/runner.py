"""Whole sequences run by a `Stepper`: the host logic of many sequences, one call per step.

`OfflineInference.run_sequence(model, stepper, item)` hands a sequence to the model's
`SequenceRunner` for that stepper. The runner keeps the live sequences in cohorts; when a
cohort's step batch lands (a Work's listener, on the engine's thread), the stepper updates
all of them at once, the ended ones leave and free their `StatePool` slots, and the next
batch leaves at once. See docs/sequences.md.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from inferchain.core.request import Request, RequestState
from inferchain.core.sequences import STEP_COHORTS, StatePool
from inferchain.core.work import Work
from inferchain.errors import InvalidInput, RequestError, RequestTimeout
from inferchain.inputs import InputSpec, shared_value
from inferchain.shapes import ShapePolicy

_CARRIED, _SHARED, _FED = "carried", "shared", "fed"  # where a step input comes from
_KEYS_KEPT = 64  # batch keys a runner remembers (shapes x unbatched values)


class Stepper:
    """The host logic of many sequences of one model at once (`oi.run_sequence`).

    Where a pipeline's generator steps one sequence, a stepper steps every sequence of a
    batch together, with numpy over all their rows: the framework calls it once per step
    batch, not once per sequence, so the host's cost per step is a few numpy calls shared by
    the batch. A sequence has `rows` rows of carried state (e.g. one per beam).

    - `start(item)`: one sequence's host state, when it is submitted (the caller's thread);
    - `initial(state)`: its initial carried state, or None for zeros;
    - `feed(states)`: the next step's inputs that are not carried, for the sequences
      `states` in order: name -> array of `len(states) * rows` rows (the rows of
      `states[0]` first); an unbatched input (`batched: false`) gets its one value;
    - `take(states, outputs)`: the step's outputs (name -> rows, carried ones included,
      except where the state stays in device memory: acl) for those sequences; update
      the states and return a bool per sequence, True where it has ended, and optionally
      `reorder`, ints [len(states), rows]: row j of a sequence goes on from the carried
      state its row `reorder[i, j]` had (a beam search);
    - `result(state)`: an ended sequence's result.

    `feed`, `take` and `result` run on the engine's thread, one call at a time: they must
    not block. An exception fails the sequences of that call only.

    `cohorts`: step batches of this stepper's sequences on their way at once. While one is
    on a worker, `take` and `feed` of another run on the host; take more where the host
    step is long next to the model's, or the model has more instances.

    `steps_per_batch` K > 1 (multi-step batches): where the inputs of a sequence's next
    steps do not depend on the outputs of the previous ones (a stream's next chunks), one
    batch runs K steps of its sequences on the worker, the state carried from one to the
    next there, and the host logic runs once per K steps. `feed` then gives each batched
    input as [len(states) * rows, K, *item] (the K steps of each row, at the shape the
    model runs them; a sequence with fewer steps left pads them with any values the model
    accepts and ends in this `take`),
    and `take` gets every output as [len(states) * rows, K, *item]. A cancel or a deadline
    takes effect between batches, so after at most K steps.
    """

    rows: int = 1
    cohorts: int = STEP_COHORTS
    steps_per_batch: int = 1

    def start(self, item: Any) -> Any:
        return item

    def initial(self, state: Any) -> Mapping[str, np.ndarray] | None:
        """The sequence's initial carried state (input name -> one item for every row, or
        `rows` items), when it gets its slots; None: the recipe's `state_init` (zeros)."""
        return None

    def feed(self, states: Sequence[Any]) -> Mapping[str, np.ndarray]:
        raise NotImplementedError

    def take(
        self, states: Sequence[Any], outputs: Mapping[str, np.ndarray]
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray | None]:
        raise NotImplementedError

    def result(self, state: Any) -> Any:
        return state


class _Live:
    """One sequence run by a `SequenceRunner`."""

    __slots__ = ("request", "slots", "state")

    def __init__(self, request: Request, state: Any) -> None:
        self.request = request
        self.state = state
        self.slots: np.ndarray | None = None


class SequenceRunner:
    """Runs whole sequences of a model with one `Stepper`: after each step batch lands, the
    stepper updates all its sequences at once and the next batch leaves at once, from the
    engine's thread; ended sequences free their slots for waiting ones.

    The live sequences step in `cohorts` batches (two: one is on a worker while the other's
    host step runs and it queues behind). A cohort holds at most half the live rows (and a
    batch); new sequences join the next cohort that leaves.
    """

    def __init__(
        self,
        pool: StatePool,
        spec: InputSpec,
        stepper: Stepper,
        *,
        names: tuple[str, ...],
        shapes: ShapePolicy,
        batch_rows: int,
        submit: Callable[[Work], None],
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
        self.steps = max(1, int(stepper.steps_per_batch))  # steps one batch runs
        self.batch_rows = max(batch_rows, self.rows)
        self.cohorts = max(1, cohorts)
        self._submit = submit
        self._take_id = take_id
        self._record = record  # told the live rows each time a step batch leaves
        self._lock = threading.RLock()
        self._waiting: deque[_Live] = deque()  # submitted, no slot yet
        self._joining: list[_Live] = []  # with a slot, for the next cohort
        self._in_flight = 0  # cohorts on their way
        self._live = 0  # sequences with a slot
        self._freed: list[np.ndarray] = []  # slots to give back once the lock is left
        self._open: set[_Live] = set()  # every sequence submitted and not ended
        # (deadline, id, sequence) of those submitted with a deadline, soonest first (some
        # started or ended since)
        self._timed: list[tuple[float, int, _Live]] = []
        pool.on_release.append(self._slots_freed)
        carried = {i for _, i, _ in pool.carried}
        self._fed = [n for i, n in enumerate(spec.names) if i not in carried]
        # how `_work` builds each input: from the pool's slots, as the one value of an
        # unbatched input, or from the rows feed() gave
        self._plan = tuple(
            (i, name, _CARRIED if i in carried else _SHARED if i in spec.shared else _FED)
            for i, name in enumerate(spec.names)
        )
        # per unbatched input: the last value feed() gave, that value as rows of a whole
        # batch (a view) and its part of the batch key
        self._shared: dict[int, tuple[Any, bytes | None, np.ndarray, Hashable]] = {}
        self._keys: dict[Hashable, tuple[Any, Hashable]] = {}  # -> (shape key, batch key)

    def submit(self, request: Request, item: Any) -> None:
        """A new sequence for `item` (the caller's thread); `request` ends with its result."""
        state = self.stepper.start(item)
        live = _Live(request, state)
        with self._lock:
            self._open.add(live)
            self._waiting.append(live)
            if request.deadline is not None:
                heapq.heappush(self._timed, (request.deadline, request.id, live))
            self._admit()
            self._launch_ready()
        self._give_back()

    def cancelled(self, request: Request) -> None:
        """A sequence's request was cancelled: it leaves at its cohort's next landing."""
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
                        self._launch_ready()
                        break
        self._give_back()

    def _slots_freed(self) -> None:
        """Slots of the pool were freed (by any user of it): waiting sequences may start."""
        with self._lock:
            if not self._waiting:
                return
            self._admit()
            self._launch_ready()
        self._give_back()

    def _give_back(self) -> None:
        """Return the slots freed under the lock to the pool (outside it: the pool tells
        every runner, which each take their own lock)."""
        while True:
            with self._lock:
                if not self._freed:
                    return
                slots, self._freed = self._freed, []
            for s in slots:
                self.pool.release(s)

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

    # -- under _lock ----------------------------------------------------------------------

    def _admit(self) -> None:
        """Waiting sequences that get slots join the next cohort."""
        now = time.perf_counter()
        timed = self._timed
        while timed and timed[0][0] <= now:  # anywhere in the line (they leave it at its head)
            _, _, live = heapq.heappop(timed)
            if live.slots is None:
                _expire(live.request, now)
        while self._waiting:
            live = self._waiting[0]
            if live.request.done():
                self._waiting.popleft()
                self._open.discard(live)
                continue
            try:
                slots = self.pool.try_acquire(self.stepper.initial(live.state), self.rows)
            except Exception as e:  # a wrong initial state: that sequence fails alone
                self._waiting.popleft()
                self._open.discard(live)
                live.request.try_transition(RequestState.ERROR, error=e)
                continue
            if slots is None:
                return
            self._waiting.popleft()
            live.slots = slots
            self._live += 1
            live.request.try_transition(RequestState.READY)
            self._joining.append(live)

    def _cohort_cap(self) -> int:
        """Sequences in one cohort at most."""
        per_batch = max(1, self.batch_rows // self.rows)
        return max(1, min(per_batch, -(-self._live // self.cohorts)))

    def _launch_ready(self) -> None:
        """Send the joining sequences while fewer than `cohorts` batches are on their way."""
        while self._joining and self._in_flight < self.cohorts:
            cap = self._cohort_cap()
            cohort, self._joining = self._joining[:cap], self._joining[cap:]
            self._launch(cohort)

    def _launch(self, cohort: list[_Live]) -> None:
        pool = self.pool
        if pool.on_device:  # a re-loaded model lost the state of those that had stepped
            lost = [live for live in cohort if live.slots is not None and pool.lost(live.slots)]
            if lost:
                self._end(lost, None, pool.lost_error())
                cohort = [live for live in cohort if live not in lost]
                if not cohort:
                    return
        states = [live.state for live in cohort]
        try:
            fed = self.stepper.feed(states)
            work = self._work(cohort, fed)
        except Exception as e:
            self._end(cohort, None, e)
            return
        try:
            self._submit(work)
        except Exception as e:  # e.g. Closed: the engine is stopping
            self._end(cohort, None, e)
            return
        self._in_flight += 1
        if self._record is not None:
            self._record(self._live * self.rows)

    def _work(self, cohort: list[_Live], fed: Mapping[str, np.ndarray]) -> Work:
        spec, pool = self.spec, self.pool
        n = len(cohort) * self.rows
        if len(fed) != len(self._fed) or any(name not in fed for name in self._fed):
            raise InvalidInput(
                f"model {pool.model!r}: the stepper's feed() gave {sorted(fed)}; the model's "
                f"inputs not carried are {self._fed}"
            )
        slots = np.concatenate([live.slots for live in cohort if live.slots is not None])
        inputs: list[np.ndarray] = []
        shared_key: list[Hashable] = []
        ahead: dict[int, np.ndarray] = {}  # a multi-step batch's fed inputs, every step
        for i, name, kind in self._plan:
            if kind is _CARRIED:
                inputs.append(pool.arrays[i][slots])
            elif kind is _SHARED:  # its one value, seen in every row
                rows, key = self._shared_rows(i, fed[name])
                inputs.append(rows[:n])
                shared_key.append(key)
            elif self.steps > 1:
                ahead[i] = self._steps_of(i, name, np.asarray(fed[name]), n)
                inputs.append(ahead[i][:, 0])
            else:
                block = spec.block(i, np.asarray(fed[name]))
                if len(block) != n:
                    raise InvalidInput(
                        f"model {pool.model!r} input {name!r}: the stepper's feed() gave "
                        f"{len(block)} rows for {len(cohort)} sequences of {self.rows} rows"
                    )
                inputs.append(block)
        exact = tuple(a.shape[1:] for a in inputs)
        shape_key, key = self._keys_of(exact, tuple(shared_key))
        if self.steps > 1 and shape_key != exact:
            raise InvalidInput(
                f"model {pool.model!r}: a multi-step batch (steps_per_batch {self.steps}) "
                f"runs its rows at their own shapes, and rows of shapes {list(exact)} would "
                f"be padded to {list(shape_key)} (the model's shapes policy); feed them at "
                "that shape"
            )
        work = Work(
            self._take_id(),
            pool.model,
            tuple(inputs),
            shape_key=shape_key,
            batch_key=key,
            exact=exact,
            names=self.names,
            submitted=time.perf_counter(),
            listener=lambda w: self._landed(cohort, w),
        )
        pool.bind(work, slots)
        work.formed = True
        if self.steps > 1:
            work.steps, work.ahead = self.steps, ahead
            work.nbytes += sum(a.nbytes - inputs[i].nbytes for i, a in ahead.items())
        return work

    def _steps_of(self, i: int, name: str, block: np.ndarray, n: int) -> np.ndarray:
        """Input `i` of a multi-step batch as feed() gave it, [n, K, *item], checked."""
        k = self.steps
        if block.ndim < 2 or block.shape[:2] != (n, k):
            raise InvalidInput(
                f"model {self.pool.model!r} input {name!r}: the stepper's feed() gave an "
                f"array of shape {block.shape}; a batch of {n} rows and {k} steps "
                f"(steps_per_batch) takes ({n}, {k}, ...)"
            )
        flat = self.spec.block(i, block.reshape(n * k, *block.shape[2:]))
        return flat.reshape(n, k, *flat.shape[1:])

    def _shared_rows(self, i: int, value: Any) -> tuple[np.ndarray, Hashable]:
        """An unbatched input's one value as the rows of a whole batch (a read-only view),
        and its part of the batch key; checked once for as long as feed() gives the same
        array with the same contents (or the same number)."""
        raw = value.tobytes() if isinstance(value, np.ndarray) else None
        known = self._shared.get(i)
        if known is not None and known[0] is value and known[1] == raw:
            return known[2], known[3]
        checked = self.spec.check(i, value)
        rows = np.broadcast_to(checked, (self.batch_rows, *checked.shape))
        key = shared_value(checked)
        if raw is not None or isinstance(value, int | float | bool | np.generic):
            self._shared[i] = (value, raw, rows, key)
        return rows, key

    def _keys_of(self, exact: tuple[tuple[int, ...], ...], shared: tuple[Hashable, ...]) -> Any:
        """The shape key and batch key of a step batch of item shapes `exact` (the
        unbatched inputs' values `shared`), remembered once the shape policy is settled."""
        found = self._keys.get((exact, shared))
        if found is not None:
            return found
        shapes = self.shapes
        found = shapes.keys(exact, shared if self.spec.shared else None)
        if shapes.settled and len(self._keys) < _KEYS_KEPT:
            self._keys[(exact, shared)] = found
        return found

    def _landed(self, cohort: list[_Live], work: Work) -> None:
        """A cohort's step batch has settled (the engine's thread)."""
        with self._lock:
            self._in_flight -= 1
            outputs, error = _outputs_of(work)
            if error is not None:
                self._end(cohort, None, error)
            else:
                self._take(cohort, outputs)
            self._admit()
            self._launch_ready()
        self._give_back()

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
                slots = np.stack([live.slots for live in going if live.slots is not None])
                rows = np.arange(len(going))[:, None]
                self.pool.move(slots.reshape(-1), slots[rows, order].reshape(-1))
        except Exception as e:
            self._end(going, None, e)
            return
        done = [live for live, e in zip(going, ended.tolist(), strict=True) if e]
        self._end(done, True, None)
        self._joining = [live for live, e in zip(going, ended.tolist(), strict=True) if not e] + (
            self._joining
        )

    def _end(self, lives: list[_Live], ok: bool | None, error: BaseException | None) -> None:
        """End these sequences: with their results (ok) or `error`; free their slots."""
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
        if live.slots is not None:
            self._freed.append(live.slots)
            live.slots = None
            self._live -= 1


def _expire(request: Request, now: float) -> bool:
    """End a sequence's request TIMED_OUT if its deadline has passed; True if it did."""
    deadline = request.deadline
    if deadline is None or now < deadline:
        return False
    error = RequestTimeout(f"sequence {request.id} ({request.model}) passed its deadline")
    return request.try_transition(RequestState.TIMED_OUT, error=error)


def _outputs_of(work: Work) -> tuple[dict[str, np.ndarray], BaseException | None]:
    """A settled bulk Work's outputs by name (its rows in order), or its first error."""
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
