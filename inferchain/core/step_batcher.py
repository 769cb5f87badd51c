"""StepBatcher: the next steps of one stateful model's live sequences, until they make a batch.

`oi.sequence(model).step(...)` checks a step and queues it here, grouped by batch key; a
group leaves as one Work of sequence steps (its requests, its rows' lanes, every input
gathered at once: a carried input is one fancy-index of the StatePool, the others one
`np.stack`) when
- every open row has its next step queued or running (none can join it);
- it holds a cohort: `cohort_size(open rows, cohorts, batch)` steps (several cohorts keep
  the host's step code of one running while the model runs another's batch);
- its oldest step has waited the model's batching window (`due()`, the engine's loop);
- `flush()` is called (`OfflineInference.flush`, `wait_all`, `close`).

It calls nobody: `add`, `due` and `flush` return the Works formed, and whoever called them
hands them to the engine (the facade under `lock`, so that a cancel of one of their steps
reaches the engine after the Work; the engine's loop itself for `due`). Every step request
and step Work of the model share `lock`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from inferchain.core.request import Callback, Request
from inferchain.core.state_pool import StatePool
from inferchain.core.work import StepRows, Work
from inferchain.errors import InvalidInput
from inferchain.inputs import InputSpec, unbatched_values
from inferchain.shapes import ShapePolicy

STEP_COHORTS = 2  # a stateful model's open sequences step in this many batches at least


def cohort_size(rows: int, cohorts: int, cap: int) -> int:
    """How many of `rows` open rows (or sequences) one cohort holds: an equal share of
    `cohorts`, at most `cap` (a batch), at least one."""
    return max(1, min(cap, -(-rows // cohorts)))


class StepBatcher:
    """The queued steps of one stateful model (see the module docstring)."""

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
        record: Callable[[int], None] | None = None,
    ) -> None:
        self.pool = pool
        self.spec = spec
        self.names = names  # the outputs a step gives
        self.shapes = shapes  # the model's: exact item shapes -> shape key and group
        self.batch_rows = batch_rows
        self.delay_s = delay_s
        self.cohorts = max(1, cohorts)
        self.lock = threading.RLock()
        self._record = record  # told the open rows each time a batch forms (metrics)
        self._groups: dict[Hashable, _Group] = {}
        self._pending = 0  # steps in the groups
        self._running = 0  # steps in Works formed, not yet ended
        self._carried = frozenset(i for _, i, _ in pool.carried)
        self._fixed_shapes = None not in (d for s in spec.shapes for d in s)

    @property
    def num_pending(self) -> int:
        """Steps queued here."""
        return self._pending

    def _all_in(self) -> bool:
        """Every open row has its next step queued or running: none can join (under `lock`)."""
        return self._pending + self._running >= self.pool.num_open

    # -- a step's request and inputs ------------------------------------------------------

    def request(
        self,
        request_id: int,
        item: tuple[np.ndarray, ...],
        callback: Callback | None,
        on_cancel: Callable[[Request], None],
        *,
        priority: int = 0,
        deadline: float | None = None,
    ) -> Request:
        """The WAITING Request of one step (sharing `lock`); `on_cancel`: the facade's,
        which asks `cancelled()` first and tells the engine otherwise."""
        return Request(
            request_id,
            self.pool.model,
            item,
            priority=priority,
            deadline=deadline,
            callback=callback,
            on_cancel=on_cancel,
            lock=self.lock,
        )

    def item(self, inputs: Mapping[str, Any], lane: int) -> tuple[tuple[np.ndarray, ...], Hashable]:
        """One step's arrays in the model's input order (the carried ones: views of the
        lane) and its batch key; raises `InvalidInput` naming what is wrong."""
        arrays = self.pool.arrays
        item = self.spec.step_item(inputs, {i: arrays[i][lane] for i in self._carried})
        return item, self._key(item)

    def rows(
        self, inputs: Mapping[str, Any], lanes: np.ndarray
    ) -> tuple[list[tuple[np.ndarray, ...]], list[Hashable]]:
        """The steps of a sequence's rows (`inputs`: name -> one row per lane, each input
        checked once): each row's arrays and batch key, as `item` gives them."""
        spec, pool = self.spec, self.pool
        columns = spec.step_columns(inputs, dict.fromkeys(self._carried))
        k = len(lanes)
        for name, c in zip(spec.names, columns, strict=True):
            if c is not None and len(c) != k:
                raise InvalidInput(
                    f"model {pool.model!r} input {name!r}: a step of a sequence of {k} rows "
                    f"takes {k} rows, got {len(c)}"
                )
        arrays = pool.arrays
        items = [
            tuple(arrays[i][lane] if c is None else c[j] for i, c in enumerate(columns))
            for j, lane in enumerate(lanes.tolist())
        ]
        return items, [self._key(it) for it in items]

    def _key(self, item: tuple[np.ndarray, ...]) -> Hashable:
        shapes: Hashable = None if self._fixed_shapes else tuple(a.shape for a in item)
        unbatched = self.spec.unbatched
        return (shapes, unbatched_values(item, unbatched)) if unbatched else shapes

    # -- queueing and forming -------------------------------------------------------------

    def add(
        self,
        requests: Sequence[Request],
        lanes: Sequence[int],
        items: Sequence[tuple[np.ndarray, ...]],
        keys: Sequence[Hashable],
    ) -> tuple[list[Work], bool]:
        """Queue the steps of one sequence's rows. Returns the Works formed (a group that
        is a whole cohort now, or all of them when every open row has stepped) and whether
        a new group began (the engine then times its window). The rows of one sequence stay
        in one batch where they fit one (a reorder reads its other rows' state)."""
        formed: list[Work] = []
        new_group, n, pool = False, len(requests), self.pool
        if pool.partitions > 1:  # steps of one instance's lanes batch together
            keys = [(pool.partition_of(lane), key) for lane, key in zip(lanes, keys, strict=True)]
        with self.lock:
            for j, (request, lane, item, key) in enumerate(
                zip(requests, lanes, items, keys, strict=True)
            ):
                group = self._groups.get(key)
                if j == 0 and group is not None and len(group.requests) + n > self.batch_rows:
                    formed += self._form(key)  # full without these rows
                    group = None
                if group is None:
                    group = self._groups[key] = _Group(time.perf_counter())
                    new_group = True
                group.requests.append(request)
                group.lanes.append(lane)
                group.items.append(item)
                self._pending += 1
            cohort = cohort_size(self.pool.num_open, self.cohorts, self.batch_rows)
            for key in set(keys):
                group = self._groups.get(key)
                if group is not None and len(group.requests) >= cohort:
                    formed += self._form(key)
            if self._pending and self._all_in():
                formed += self.flush()
        return formed, new_group and not formed

    def work_of(
        self,
        first_id: int,
        requests: Sequence[Request],
        lanes: np.ndarray,
        items: Sequence[tuple[np.ndarray, ...]],
        *,
        priority: int,
        deadline: float | None,
    ) -> Work:
        """The steps of one sequence's rows with a priority or a deadline of their own: one
        WAITING Work that the Scheduler admits like any other and that may share a batch
        with other items (on the host) or other steps (state on the device)."""
        with self.lock:
            return self._work(
                first_id, requests, lanes, items, time.perf_counter(), False, priority, deadline
            )

    def due(self, now: float) -> tuple[list[Work], float]:
        """The groups whose window has passed (all of them when every open row has
        stepped), as Works, and when the next window passes (the engine's loop)."""
        works: list[Work] = []
        next_due = float("inf")
        with self.lock:
            if self._pending and self._all_in():
                return self.flush(), next_due
            for key, group in list(self._groups.items()):
                at = group.since + self.delay_s
                if at <= now:
                    works += self._form(key)
                else:
                    next_due = min(next_due, at)
        return works, next_due

    def flush(self) -> list[Work]:
        """Every group as a Work now (possibly partial batches)."""
        works: list[Work] = []
        with self.lock:
            for key in list(self._groups):
                works += self._form(key)
        return works

    def cancelled(self, request: Request) -> bool:
        """A step request was cancelled (any thread): True when it was still queued here
        (it leaves its group); False when it is in a Work (the engine must hear of it)."""
        with self.lock:
            if request.work is not None:
                return False
            for key, group in self._groups.items():
                if group.drop(request):
                    self._pending -= 1
                    if not group.requests:
                        del self._groups[key]
                    break
            return True

    def landed(self, rows: int) -> None:
        """`rows` steps of formed Works have ended, or are about to (the engine, before it
        ends their requests: a step that follows them sees them gone)."""
        with self.lock:
            self._running -= rows

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
            group = group.part(keep)
        parts = [group]
        if self.pool.lost(np.array(group.lanes, dtype=np.intp)):
            lost = self.pool.lost_mask(group.lanes)
            parts = [group.part([j for j, x in enumerate(lost) if x == gone]) for gone in (1, 0)]
        works = []
        for g in parts:
            if g.requests:
                lanes = np.array(g.lanes, dtype=np.intp)
                works.append(self._work(g.requests[0].id, g.requests, lanes, g.items, g.since))
                self._running += len(g.requests)
                if self._record is not None:
                    self._record(self.pool.num_open)
        return works

    def _work(
        self,
        id: int,
        requests: Sequence[Request],
        lanes: np.ndarray,
        items: Sequence[tuple[np.ndarray, ...]],
        since: float,
        queued: bool = True,
        priority: int = 0,
        deadline: float | None = None,
    ) -> Work:
        """The Work of these steps (under `lock`): formed here (`queued`, a batch of its
        own) or with options of its own."""
        pool = self.pool
        inputs = tuple(self._column(i, items, lanes) for i in range(len(self.spec.names)))
        exact, shape_key, joins = self.shapes.keys_of_rows(inputs, self.spec)
        state_rows = pool.state_rows(lanes)
        worker = pool.worker_of(lanes)
        if not queued and state_rows is not None:  # batches only with steps of its instance
            joins = ("steps", worker, joins)
        steps = StepRows(lanes, state_rows, alone=queued, queued=queued, worker=worker)
        return Work.for_steps(
            id,
            pool.model,
            inputs,
            steps,
            requests=requests,
            shape_key=shape_key,
            batch_key=joins,
            exact=exact,
            names=self.names,
            submitted=since,
            priority=priority,
            deadline=deadline,
            lock=self.lock,
        )

    def _column(
        self, i: int, items: Sequence[tuple[np.ndarray, ...]], lanes: np.ndarray
    ) -> np.ndarray:
        """Input `i` of a step batch, rows first: the lanes' state of a carried input, the
        one value of an unbatched input seen in every row, or the steps' rows stacked."""
        if i in self._carried:
            return self.pool.gather(i, lanes)
        first = items[0][i]
        if i in self.spec.unbatched:
            return np.broadcast_to(first, (len(items), *first.shape))
        return first[None] if len(items) == 1 else np.stack([it[i] for it in items])


class _Group:
    """Steps of one batch key, in arrival order."""

    __slots__ = ("items", "lanes", "requests", "since")

    def __init__(self, since: float) -> None:
        self.since = since  # when its first step arrived
        self.requests: list[Request] = []
        self.lanes: list[int] = []
        self.items: list[tuple[np.ndarray, ...]] = []

    def drop(self, request: Request) -> bool:
        """Remove `request`; False when it is not in this group."""
        for j, r in enumerate(self.requests):
            if r is request:
                del self.requests[j], self.lanes[j], self.items[j]
                return True
        return False

    def part(self, positions: list[int]) -> _Group:
        """A group of the steps at `positions`, from the same time."""
        part = _Group(self.since)
        part.requests = [self.requests[j] for j in positions]
        part.lanes = [self.lanes[j] for j in positions]
        part.items = [self.items[j] for j in positions]
        return part
