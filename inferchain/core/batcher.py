"""ModelBatcher: one model's READY works grouped by batch key, cut into runs of batches.

The batch key is the shape key, and for a model with unbatched inputs their values too:
only rows with equal keys share a batch.

A group is sent when it holds a full batch, when its oldest row has waited the batching
window (`max_queue_delay_ms`), at once when every worker of the model is idle (waiting
could only add latency then; not with `batching: wait`, which waits the window for a fuller
batch all the same, until the engine flushes it), or at once when its oldest work runs
alone (a cohort of sequence steps, `Work.alone`), which is a batch of its own. A model with
`batching: fill` sends full batches only, of rows in the order they came, until the engine
flushes it. Rows are taken in order, a run (`take`) at a time: up to a given number of
batches of consecutive rows, full ones unless the group may leave partial; a Work may span
several batches and a batch may hold rows of several Works. The batcher is the one writer of
a Work's `taken` and `held`.
"""

from __future__ import annotations

import time
from collections import deque

from inferchain.config import ModelConfig
from inferchain.core.records import BatchKey, Slice
from inferchain.core.request import RequestState, advance
from inferchain.core.work import Work

_RUNNING = RequestState.RUNNING


class ModelBatcher:
    """One model's READY works by batch key (the engine's loop is its only user)."""

    def __init__(self, model: ModelConfig) -> None:
        self.name = model.name
        self.max_rows = model.batch_rows
        self.delay = model.max_queue_delay_ms / 1000.0  # seconds
        self.fill = model.batching == "fill"  # only full batches, until `flushing`
        self.wait = model.batching == "wait"  # the window even when idle, until `flushing`
        self.flushing = False  # send every group now, until the batcher is empty
        self.groups: dict[BatchKey, deque[Work]] = {}
        self._rows: dict[BatchKey, int] = {}  # rows not yet taken, per group
        self.num_ready = 0  # rows not yet taken, all groups
        self.latest_run: dict[int, int] = {}  # anchored runs: driver -> latest run seen

    def add(self, work: Work) -> None:
        key = work.batch_key
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = deque()
            self._rows[key] = 0
        group.append(work)
        if work.run is not None:
            driver, index = work.run
            self.latest_run[driver] = max(self.latest_run.get(driver, index), index)
        work.held = True
        left = work.rows - work.taken
        self._rows[key] += left
        self.num_ready += left

    def due(
        self,
        now: float,
        all_idle: bool,
        skip: frozenset[BatchKey] | set[BatchKey] = frozenset(),
        caller: Work | None = None,
    ) -> tuple[BatchKey | None, bool, int | None, float]:
        """The group to send now (the one whose oldest work waited longest among those
        due, `skip` left out), whether its last batch may leave partial (else it waits for
        more rows), the instance it must run on (`pinned`), and when the next window
        expires. `caller`: the work of a caller that
        waits for it on its own thread (`run_until`): on an idle model it leaves at once,
        whatever the batching mode (no other row can come from that caller)."""
        if self.fill and not self.flushing:
            return self._due_full(all_idle, skip, caller)
        best: BatchKey | None = None
        best_t = next_due = float("inf")
        partial = False
        for key, group in self.groups.items():
            if key in skip:
                continue
            head = group[0].admitted
            if head is None:
                head = now
            may_part = (
                (all_idle and (not self.wait or group[0] is caller))
                or self.flushing
                or group[0].alone
                or head + self.delay <= now
            )
            if may_part or self._rows[key] >= self.max_rows:
                if head < best_t:
                    best, best_t, partial = key, head, may_part
            else:
                next_due = min(next_due, head + self.delay)
        if best is None:
            return None, False, None, next_due
        steps = self.groups[best][0].steps  # `pinned`, without a call
        return best, partial, None if steps is None else steps.worker, next_due

    def _due_full(
        self, all_idle: bool, skip: frozenset[BatchKey] | set[BatchKey], caller: Work | None
    ) -> tuple[BatchKey | None, bool, int | None, float]:
        """`due` of `batching: fill` (not flushing): a group of a full batch, or of an
        anchored run that is over, or the caller's on an idle model; no window."""
        for key, group in self.groups.items():
            if key in skip:
                continue
            if self._run_over(group[0]) or (all_idle and group[0] is caller):
                return key, True, self.pinned(key), float("inf")
            if self._rows[key] >= self.max_rows:
                return key, False, self.pinned(key), float("inf")
        return None, False, None, float("inf")

    def pinned(self, key: BatchKey) -> int | None:
        """The instance group `key` must run on (sequence steps whose state its session
        holds: a group never mixes two), or None."""
        steps = self.groups[key][0].steps
        return None if steps is None else steps.worker

    def drop_group(self, key: BatchKey) -> list[Work]:
        """Every work of group `key`, removed (their rows not yet taken are the engine's
        to end)."""
        works = list(self.groups.pop(key))
        self.num_ready -= self._rows.pop(key)
        for w in works:
            w.held = False
        return works

    def _run_over(self, work: Work) -> bool:
        """An anchored run's rows may leave as a partial batch: a later run of its driver
        has rows here (admission is FIFO, so every row of this run has arrived)."""
        if work.run is None:
            return False
        driver, index = work.run
        return self.latest_run[driver] > index

    def take(
        self, key: BatchKey, batches: int = 1, partial: bool = True
    ) -> tuple[list[Slice], int]:
        """Up to `batches` batches of rows from group `key`, as one run: the slices and
        their rows (full batches only, unless `partial`). Works whose rows are all taken (or
        were dropped by the engine) leave the group. Sequence steps run in a run of one
        batch (a cohort alone; steps whose state is on the device never split)."""
        group = self.groups[key]
        size = self.max_rows
        limit = size * batches
        if not partial:
            limit = min(limit, max(size, self._rows[key] // size * size))
        slices: list[Slice] = []
        rows = consumed = 0
        while group and rows < limit:
            work = group[0]
            if work.steps is not None and limit > size:
                if rows:  # the run ends before it: steps are a batch's
                    break
                limit = size
            if work.alone and rows:  # a cohort runs alone (it stays one)
                break
            before = work.taken
            if rows and work.state_rows is not None and rows + work.rows - before > size:
                break  # steps whose state is on the device stay in one batch (a reorder)
            if before < work.rows:
                if work.requests is None:  # a bulk work's rows: one slice
                    stop = min(work.rows, before + limit - rows)
                    slices.append(Slice(work, before, stop, rows))
                    work.taken = stop
                    rows += stop - before
                else:
                    rows = self._take_requests(work, slices, rows, limit)
                consumed += work.taken - before
                work.start()
            if work.taken >= work.rows:
                group.popleft()
                work.held = False
            if work.alone:
                break
        self.num_ready -= consumed
        if self.num_ready <= 0:
            self.flushing = False
        if group:
            self._rows[key] -= consumed
        else:
            del self.groups[key], self._rows[key]
        return slices, rows

    def forget(self, work: Work) -> int:
        """The engine drops the rows of `work` not yet taken (cancelled, timed out, or all
        its rows ended): none will be; returns how many there were."""
        untaken = work.rows - work.taken
        if untaken > 0:
            if work.held:
                self._rows[work.batch_key] -= untaken
                self.num_ready -= untaken
            work.taken = work.rows
        return untaken

    def _take_requests(self, work: Work, slices: list[Slice], rows: int, limit: int) -> int:
        """Rows of a work with per-item Requests, up to `limit` rows in all: each moves to
        RUNNING, or is skipped when it was cancelled or timed out meanwhile; runs of live
        rows become slices."""
        assert work.requests is not None
        start = work.taken
        stop = min(work.rows, start + limit - rows)
        now = time.perf_counter()
        run_start = start
        for i in advance(work.requests[start:stop], _RUNNING, work.lock, now):
            i += start
            if i > run_start:
                slices.append(Slice(work, run_start, i, rows))
                rows += i - run_start
            run_start = i + 1
        if stop > run_start:
            slices.append(Slice(work, run_start, stop, rows))
            rows += stop - run_start
        work.taken = stop
        return rows

    def drain(self) -> list[Work]:
        """Every work still held (rows not yet taken), removed from the batcher."""
        works = [w for group in self.groups.values() for w in group]
        for w in works:
            w.held = False
        self.groups.clear()
        self._rows.clear()
        self.num_ready = 0
        return works
