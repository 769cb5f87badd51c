"""Sequences: a stateful model's recurrent state, kept in pre-allocated slots.

A model whose recipe names `state: {stateN: state}` carries an output of one step into an
input of the next. Each live sequence holds one slot of the model's `StatePool` (one row per
carried input, rows first like every row inside the framework), opened with the initial state
(zeros, or values the caller gives). The next steps of the live sequences wait in the
model's `PendingSteps` until they make a batch: one Work whose carried inputs are gathered
from their slots with one fancy-index per carried input. After the batch has run, the worker
writes the carried outputs back into the slots of its rows the same way. Steps of one
sequence run one after the other (the next is submitted once the previous has
ended), so a slot is never read and written at once, and a step never sees another
sequence's state.

Where the model's session keeps the state in device slots (`Session.open_state`: acl),
`on_device` is set and the host arrays hold only the initial values: each step Work then
carries `StateRows` (the slot each row reads, the slot it writes, whether it is a first
step), the session gathers and scatters on the device, and nothing is written back here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from inferchain.backends.base import StateRows
from inferchain.core.records import Batch
from inferchain.core.request import Request
from inferchain.core.work import Work
from inferchain.errors import InvalidInput, QueueFull, StateLost
from inferchain.inputs import InputSpec, rows_shared_values, shared_values
from inferchain.shapes import ShapePolicy

STEP_COHORTS = 2  # a stateful model's live sequences step in this many batches at least


class StatePool:
    """`size` slots of carried state for one model (thread-safe: any caller opens and closes
    sequences; a worker thread writes the slots of the rows it ran)."""

    def __init__(
        self,
        model: str,
        carried: Sequence[tuple[int, int, str]],
        shapes: Sequence[tuple[int, ...]],
        dtypes: Sequence[np.dtype],
        size: int,
        constant: Sequence[int] = (),
    ) -> None:
        """`carried`: (output index, input index, input name) per state pair; `shapes`,
        `dtypes`: the item shape and dtype of each carried input, in the same order;
        `constant`: the inputs (indices) that keep one value over a sequence (recipe
        `constant:`), which a session may keep in device slots (`StateRows.home`)."""
        self.model = model
        self.size = size
        self.carried = tuple(carried)
        self.constant = tuple(constant)
        self.inputs = {name: i for _, i, name in self.carried}  # carried input name -> index
        self.arrays = {
            i: np.zeros((size, *shape), dtype)
            for (_, i, _), shape, dtype in zip(self.carried, shapes, dtypes, strict=True)
        }
        self._free = list(range(size - 1, -1, -1))
        self._cond = threading.Condition()
        self.on_release: list[Callable[[], None]] = []  # told after slots are freed
        # the state lives in the session's device slots (set once at load); then, per
        # slot: still its initial value (here), the slot its next step reads (a reorder),
        # lost with a re-loaded session
        self.on_device = False
        self.max_rows = size  # rows of one sequence (on the device: of one batch) at most
        self._fresh = np.zeros(size, bool)
        self._read = np.arange(size, dtype=np.intp)
        self._lost = np.zeros(size, bool)
        self._home = np.arange(size, dtype=np.intp)  # the first slot of the slot's sequence

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_live(self) -> int:
        """Slots in use: rows of the sequences open now (each may have a step on its way)."""
        return self.size - len(self._free)

    def acquire(
        self, initial: Mapping[str, np.ndarray], timeout: float | None = None, rows: int = 1
    ) -> np.ndarray:
        """`rows` free slots (one sequence's rows), set to `initial` (carried input name ->
        one item for every row, or `rows` items) and zeros for the rest; waits up to
        `timeout` seconds for them (`QueueFull` after that)."""
        if rows > self.size:
            raise InvalidInput(
                f"model {self.model!r}: a sequence of {rows} rows needs more slots than the "
                f"{self.size} there are (max_sequences)"
            )
        if rows > self.max_rows:  # its steps would be split over batches
            raise InvalidInput(
                f"model {self.model!r}: a sequence of {rows} rows does not fit one batch of "
                f"{self.max_rows} (max_batch_size), as its state on the device needs"
            )
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._free) >= rows, timeout):
                raise QueueFull(
                    f"model {self.model!r}: all {self.size} sequence slots are in use "
                    f"(max_sequences) after {timeout}s"
                )
            slots = np.array([self._free.pop() for _ in range(rows)], dtype=np.intp)
        try:
            for name, i in self.inputs.items():
                value = initial.get(name)
                self.arrays[i][slots] = 0 if value is None else self._checked(name, i, value, rows)
        except BaseException:
            self.release(slots)
            raise
        if self.on_device:
            self._fresh[slots] = True
            self._read[slots] = slots
            self._lost[slots] = False
            self._home[slots] = slots[0]
        return slots

    def try_acquire(
        self, initial: Mapping[str, np.ndarray] | None, rows: int = 1
    ) -> np.ndarray | None:
        """`acquire` without waiting: None when fewer than `rows` slots are free."""
        with self._cond:
            if len(self._free) < rows:
                return None
        try:
            return self.acquire(initial or {}, 0, rows)
        except QueueFull:  # taken by another thread meanwhile
            return None

    def move(self, to: np.ndarray, source: np.ndarray) -> None:
        """Slots `to` take the carried state slots `source` hold (one gather per carried
        input; `source` may repeat and overlap `to`). On the device, their next step reads
        the slots `source` reads instead."""
        for array in self.arrays.values():
            array[to] = array[source]
        if self.on_device:
            self._fresh[to] = self._fresh[source]
            self._read[to] = self._read[source]
            self._lost[to] = self._lost[source]

    def bind(self, work: Work, slots: np.ndarray) -> None:
        """Make `work` the next step of the sequence rows in `slots` (one per row). On the
        device it carries where they read and write their state (`StateRows`); after
        this, those slots are no longer first steps."""
        work.slots = slots
        if self.on_device:
            home = self._home[slots] if self.constant else None
            work.state_rows = StateRows(self._read[slots], slots, self._fresh[slots], home)
            self._fresh[slots] = False
            self._read[slots] = slots

    def lose(self) -> None:
        """The device slots were made anew (a re-loaded session, on the worker's thread):
        every slot past its first step has lost its state."""
        self._lost |= ~self._fresh

    def lost(self, slots: np.ndarray) -> bool:
        """Some of `slots` lost their state (their next step cannot run)."""
        return self.on_device and bool(self._lost[slots].any())

    def lost_mask(self, slots: Sequence[int]) -> list[bool]:
        """Per slot: it lost its state."""
        return [bool(x) for x in self._lost[np.asarray(slots, dtype=np.intp)]]

    def lost_error(self) -> StateLost:
        return StateLost(
            f"model {self.model!r}: the carried state of a sequence was lost when the model "
            "was re-loaded after failures (it lived in the old session's device memory); "
            "the sequence cannot go on"
        )

    def launching(self, rows: StateRows) -> bool:
        """The worker launches `rows` (its thread, so after any `lose`): True when a row
        reads state the session never wrote (the step was formed before the re-load);
        otherwise their slots hold this session's state from now on."""
        if (self._lost[rows.read] & ~rows.fresh).any():
            return True
        self._lost[rows.write] = False
        return False

    def release(self, slots: np.ndarray) -> None:
        with self._cond:
            self._free.extend(int(s) for s in slots)
            self._cond.notify_all()
        for listener in self.on_release:
            listener()

    def write_back(self, batch: Batch, outputs: Sequence[np.ndarray]) -> None:
        """Store the carried outputs of the batch's sequence rows into their slots (worker
        thread, after the run): one fancy-index assignment per carried input. Rows of
        works that are not steps are left alone."""
        slices = batch.slices
        first = slices[0].work.slots if len(slices) == 1 else None
        if first is not None:  # one work: its rows in order, a slice of the outputs
            s = slices[0]
            to = first[s.start : s.stop]
            for out, i, _ in self.carried:
                self.arrays[i][to] = outputs[out][s.offset : s.offset + s.rows]
            return
        rows: list[np.ndarray] = []  # positions in the batch
        slots: list[np.ndarray] = []  # their slots
        for s in slices:
            work_slots = s.work.slots
            if work_slots is not None:
                rows.append(np.arange(s.offset, s.offset + s.rows))
                slots.append(work_slots[s.start : s.stop])
        if not rows:
            return
        at = rows[0] if len(rows) == 1 else np.concatenate(rows)
        to = slots[0] if len(slots) == 1 else np.concatenate(slots)
        for out, i, _ in self.carried:
            self.arrays[i][to] = outputs[out][at]

    def _checked(self, name: str, i: int, value: np.ndarray, rows: int) -> np.ndarray:
        expected = self.arrays[i].shape[1:]
        array = np.asarray(value)
        if array.shape != expected and array.shape != (rows, *expected):
            each = f" or {(rows, *expected)} (one per row)" if rows > 1 else ""
            raise InvalidInput(
                f"model {self.model!r} state {name!r}: expected an initial value of shape "
                f"{expected}{each}, got {array.shape}"
            )
        return array


class PendingSteps:
    """The next steps of one stateful model's live sequences, until they form a batch.

    A step is checked and queued here, grouped by batch key; a group leaves as one Work (its
    requests, its rows' slots, every input gathered at once: a carried input is one
    fancy-index of the pool, the others one `np.stack`) when
    - every live row has its next step queued or running (none can join it);
    - it holds a cohort: `ceil(live / cohorts)` steps, at most a batch (several cohorts
      keep the host's step code of one running while the model runs another's batch);
    - its oldest step has waited the model's batching window (`due()`, the engine's loop);
    - `flush()` is called (`OfflineInference.flush`, `wait_all`, `close`).
    Every step request and step Work of the model share `lock`, so a cancel and the forming
    of a batch never race.
    """

    def __init__(
        self,
        pool: StatePool,
        spec: InputSpec,
        *,
        names: tuple[str, ...],
        shapes: ShapePolicy,
        batch_rows: int,
        delay_s: float,
        cohorts: int,
        on_cancel: Callable[[Request | Work], None],
        submit: Callable[[Work], None],
        wake: Callable[[], None],
        record: Callable[[int], None] | None = None,
    ) -> None:
        self.pool = pool
        self.spec = spec
        self.names = names  # the model's output names
        self.shapes = shapes  # the model's: exact item shapes -> shape key and group
        self.batch_rows = batch_rows
        self.delay_s = delay_s
        self.cohorts = max(1, cohorts)
        self.lock = threading.RLock()
        self._on_cancel = on_cancel  # the engine's: a cancel of a step already in a Work
        self._submit = submit  # the engine's, for a formed Work (called under `lock`)
        self._wake = wake
        self._record = record  # told the live sequences each time a batch forms
        self._groups: dict[Hashable, _Group] = {}
        self._pending = 0  # steps in the groups
        self._running = 0  # steps in Works sent, not yet ended
        pool.on_release.append(self.released)
        self._carried = frozenset(i for _, i, _ in pool.carried)
        # `step`'s plan: per input, its index, name and (dtype, shape) for the one-compare
        # check (None for a carried input); inputs of dynamic shape go through spec.check
        self._plan = tuple(
            (i, name, None if i in self._carried else (dtype, shape))
            for i, (name, dtype, shape) in enumerate(
                zip(spec.names, spec.dtypes, spec.shapes, strict=True)
            )
        )
        self._given = len(spec.names) - len(self._carried)  # inputs a step passes
        self._strict = spec.reject_nonfinite  # every value checked in full
        self._fixed_shapes = None not in (d for s in spec.shapes for d in s)

    @property
    def num_pending(self) -> int:
        """Steps queued here."""
        return self._pending

    def _all_in(self) -> bool:
        """Every live row has its next step queued or running: none can join (under `lock`)."""
        return self._pending + self._running >= self.pool.num_live

    def step(
        self, request_id: int, inputs: Mapping[str, Any], slot: int, callback: Any = None
    ) -> Request:
        """Check and queue the next step of the one-row sequence in `slot` (the hot path
        of `LiveSequence.step`): its Request, WAITING. Raises `InvalidInput` naming what is
        wrong, and then nothing is queued."""
        arrays = self.pool.arrays
        item: list[np.ndarray] = []
        if len(inputs) == self._given and not self._strict:
            try:
                for i, name, exact in self._plan:
                    if exact is None:  # a carried input: a view of the slot
                        item.append(arrays[i][slot])
                        continue
                    v = inputs[name]
                    if type(v) is np.ndarray and v.dtype == exact[0] and v.shape == exact[1]:
                        item.append(v)
                    else:
                        item.append(self.spec.check(i, v))
            except KeyError:
                item = []
        if len(item) != len(self._plan):
            item = list(self.item(inputs, slot)[0])  # the checks in full: raises, or is fine
        row = tuple(item)
        request = self.request(request_id, row, callback)
        self.add((request,), (slot,), (row,), (self._key(row),))
        return request

    def request(
        self, request_id: int, item: tuple[np.ndarray, ...], callback: Any = None
    ) -> Request:
        """The WAITING Request of one step (its cancel comes here; it shares `lock`)."""
        return Request(
            request_id,
            self.pool.model,
            item,
            callback=callback,
            on_cancel=self.cancelled,
            lock=self.lock,
        )

    def item(self, inputs: Mapping[str, Any], slot: int) -> tuple[tuple[np.ndarray, ...], Hashable]:
        """One step's arrays in the model's input order (the carried ones: views of the
        slot) and its batch key; raises `InvalidInput` naming what is wrong."""
        spec, pool = self.spec, self.pool
        item = spec.step_item(inputs, {i: pool.arrays[i][slot] for i in pool.inputs.values()})
        return item, self._key(item)

    def rows(
        self, inputs: Mapping[str, Any], slots: np.ndarray
    ) -> tuple[list[tuple[np.ndarray, ...]], list[Hashable]]:
        """The steps of a sequence's rows (`inputs`: name -> one row per slot, each input
        checked once): each row's arrays and batch key, as `item` gives them."""
        spec, pool = self.spec, self.pool
        columns = spec.step_columns(inputs, dict.fromkeys(pool.inputs.values()))
        k = len(slots)
        for name, c in zip(spec.names, columns, strict=True):
            if c is not None and len(c) != k:
                raise InvalidInput(
                    f"model {pool.model!r} input {name!r}: a step of a sequence of {k} rows "
                    f"takes {k} rows, got {len(c)}"
                )
        arrays = pool.arrays
        items = [
            tuple(arrays[i][slot] if c is None else c[j] for i, c in enumerate(columns))
            for j, slot in enumerate(slots.tolist())
        ]
        return items, [self._key(it) for it in items]

    def _key(self, item: tuple[np.ndarray, ...]) -> Hashable:
        shapes: Hashable = None if self._fixed_shapes else tuple(a.shape for a in item)
        return (shapes, shared_values(item, self.spec.shared)) if self.spec.shared else shapes

    def add(
        self,
        requests: Sequence[Request],
        slots: Sequence[int],
        items: Sequence[tuple[np.ndarray, ...]],
        keys: Sequence[Hashable],
    ) -> None:
        """Queue the steps of one sequence's rows; a group goes to the engine once it is a
        whole cohort, or when every live row has stepped. The rows of one sequence stay in
        one batch (where they fit one): a reorder reads the state of its other rows, which
        a batch before it must not have written yet."""
        new_group = False
        n = len(requests)
        with self.lock:
            for j, (request, slot, item, key) in enumerate(
                zip(requests, slots, items, keys, strict=True)
            ):
                group = self._groups.get(key)
                if j == 0 and group is not None and len(group.requests) + n > self.batch_rows:
                    self._send(key)  # full without these rows
                    group = None
                if group is None:
                    group = self._groups[key] = _Group(time.perf_counter())
                    new_group = True
                group.requests.append(request)
                group.slots.append(slot)
                group.items.append(item)
                self._pending += 1
            for key in set(keys):
                group = self._groups.get(key)
                if group is not None and len(group.requests) >= self._cohort():
                    self._send(key)
            if self._pending and self._all_in():
                self.flush()
            waiting = self._pending > 0
        if new_group and waiting:
            self._wake()  # the loop times the new groups' window

    def released(self) -> None:
        """Slots were freed (any thread): the steps queued may be all there is to wait for."""
        with self.lock:
            if self._pending and self._all_in():
                self.flush()

    def landed(self, rows: int) -> None:
        """`rows` steps sent in Works have ended, or are about to (the engine, before it
        ends their requests: a step that follows them sees them gone)."""
        with self.lock:
            self._running -= rows

    def flush(self) -> None:
        """Send every group to the engine now (possibly partial batches)."""
        with self.lock:
            for key in list(self._groups):
                self._send(key)

    def _send(self, key: Hashable) -> None:
        """Group `key` to the engine, under `lock`: a cancel of one of its steps reaches the
        engine only after the Work has."""
        for work in self._form(key):
            self._submit(work)

    def due(self, now: float) -> tuple[list[Work], float]:
        """The groups whose window has passed, as Works, and when the next one's passes
        (the engine's loop, which queues them itself)."""
        works: list[Work] = []
        next_due = float("inf")
        with self.lock:
            for key, group in list(self._groups.items()):
                at = group.since + self.delay_s
                if at <= now:
                    works += self._form(key)
                else:
                    next_due = min(next_due, at)
        return works, next_due

    def cancelled(self, request: Request) -> None:
        """A step request was cancelled (any thread): a step still queued here leaves its
        group; the engine hears of one already in a Work."""
        with self.lock:
            if request.work is None:
                for key, group in self._groups.items():
                    if group.drop(request):
                        self._pending -= 1
                        if not group.requests:
                            del self._groups[key]
                        return
                return
        self._on_cancel(request)

    def _cohort(self) -> int:
        live = self.pool.num_live
        return max(1, min(self.batch_rows, -(-live // self.cohorts)))

    def _column(self, i: int, items: list[tuple[np.ndarray, ...]], slots: np.ndarray) -> np.ndarray:
        """Input `i` of a step batch, rows first: the slots' state of a carried input, the
        one value of an unbatched input seen in every row, or the steps' rows stacked."""
        if i in self._carried:
            column: np.ndarray = self.pool.arrays[i][slots]
            return column
        first = items[0][i]
        if i in self.spec.shared:
            return np.broadcast_to(first, (len(items), *first.shape))
        return first[None] if len(items) == 1 else np.stack([it[i] for it in items])

    def _form(self, key: Hashable) -> list[Work]:
        """Group `key` as one WAITING Work (under `lock`), none when all its steps ended.
        On the device, steps whose state was lost meanwhile (a re-load) form a Work of
        their own, which fails alone (`StateLost`)."""
        group = self._groups.pop(key)
        self._pending -= len(group.requests)
        keep = [j for j, r in enumerate(group.requests) if not r.done()]
        if not keep:
            return []
        if len(keep) < len(group.requests):
            group.keep(keep)
        if self.pool.lost(np.array(group.slots, dtype=np.intp)):
            lost = self.pool.lost_mask(group.slots)
            parts = [group.part([j for j, x in enumerate(lost) if x == gone]) for gone in (1, 0)]
            return [self._work(g) for g in parts if g.requests]
        return [self._work(group)]

    def _work(self, group: _Group) -> Work:
        """The Work of a group's steps (under `lock`)."""
        requests = tuple(group.requests)
        slots = np.array(group.slots, dtype=np.intp)
        items = group.items
        pool = self.pool
        inputs = tuple(self._column(i, items, slots) for i in range(len(self.spec.names)))
        exact = tuple(a.shape[1:] for a in inputs)
        shape_key, joins = self.shapes.keys(exact, rows_shared_values(inputs, self.spec.shared))
        work = Work(
            requests[0].id,
            pool.model,
            inputs,
            shape_key=shape_key,
            batch_key=joins,
            exact=exact,
            names=self.names,
            submitted=group.since,
            requests=requests,
            on_cancel=self._on_cancel,
            lock=self.lock,
        )
        pool.bind(work, slots)
        work.formed = True
        self._running += len(requests)
        if self._record is not None:
            self._record(pool.num_live)
        for j, r in enumerate(requests):
            r.work = work
            r.row = j
        return work


class _Group:
    """Steps of one batch key, in arrival order."""

    __slots__ = ("items", "requests", "since", "slots")

    def __init__(self, since: float) -> None:
        self.since = since  # when its first step arrived
        self.requests: list[Request] = []
        self.slots: list[int] = []
        self.items: list[tuple[np.ndarray, ...]] = []

    def drop(self, request: Request) -> bool:
        """Remove `request`; False when it is not in this group."""
        for j, r in enumerate(self.requests):
            if r is request:
                del self.requests[j], self.slots[j], self.items[j]
                return True
        return False

    def keep(self, positions: list[int]) -> None:
        kept = self.part(positions)
        self.requests, self.slots, self.items = kept.requests, kept.slots, kept.items

    def part(self, positions: list[int]) -> _Group:
        """A group of the steps at `positions`, from the same time."""
        part = _Group(self.since)
        part.requests = [self.requests[j] for j in positions]
        part.slots = [self.slots[j] for j in positions]
        part.items = [self.items[j] for j in positions]
        return part
