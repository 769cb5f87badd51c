"""The ExecutionEngine: READY requests -> same-shape batches -> idle workers.

It runs on the Scheduler's wake-ups (no thread of its own, one less hop per request) and
imports no device runtime: workers are reached through `BatchSink`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import attrs

from inferchain.config import ModelConfig
from inferchain.errors import BackendError
from inferchain.request import Request, RequestState


@attrs.frozen(eq=False)
class Batch:
    """What the engine hands to one worker: RUNNING requests of one model and shape."""

    model: str
    requests: tuple[Request, ...]  # in batch-row order; row i's outputs go to requests[i]
    shape_key: tuple[tuple[int, ...], ...]  # item shape of each input, shared by all rows
    created: float  # time.perf_counter() when the batch was formed

    @property
    def size(self) -> int:
        return len(self.requests)


class BatchSink(Protocol):
    """A ModelWorker as the engine sees it."""

    busy: bool  # set by the engine when it dispatches, cleared by the worker when done
    healthy: bool  # False while the worker re-initialises, or for good once it died
    dead: bool  # the worker will never take a batch again

    def dispatch(self, batch: Batch) -> None: ...


class ModelBatcher:
    """One model's READY requests grouped by shape key, and its workers."""

    def __init__(self, model: ModelConfig, workers: Sequence[BatchSink]) -> None:
        self.name = model.name
        self.max_rows = model.batch_rows
        self.delay = model.max_queue_delay_ms / 1000.0  # seconds
        self.fail_fast = model.health.while_unhealthy == "fail"
        self.workers = workers
        self.groups: dict[tuple[tuple[int, ...], ...], deque[Request]] = {}
        self.num_ready = 0

    def add(self, requests: Iterable[Request]) -> None:
        groups = self.groups
        for r in requests:
            group = groups.get(r.shape_key)
            if group is None:
                group = groups[r.shape_key] = deque()
            group.append(r)
            self.num_ready += 1

    def step(self, now: float) -> float:
        """Dispatch what is due to idle workers; returns when a window next expires."""
        next_due = float("inf")
        if not self.num_ready:
            return next_due
        healthy = [w for w in self.workers if w.healthy]
        if not healthy and (self.fail_fast or all(w.dead for w in self.workers)):
            self._fail_all()
            return next_due
        idle = [w for w in healthy if not w.busy]
        if not idle:
            return next_due
        all_idle = len(idle) == len(healthy)
        while idle and self.groups:
            key, due_at = self._pick(now, all_idle)
            if key is None:
                next_due = min(next_due, due_at)
                break
            batch = self._take(key)
            if batch is None:
                continue
            worker = idle.pop()
            worker.busy = True
            all_idle = False
            worker.dispatch(batch)
        return next_due

    def _pick(self, now: float, all_idle: bool) -> tuple[tuple[tuple[int, ...], ...] | None, float]:
        """The group to send now: a full one, an expired window, or any when all are idle.

        Among candidates the one whose oldest request waited longest goes first.
        """
        best_key = None
        best_t = float("inf")
        oldest_due = float("inf")
        for key, group in self.groups.items():
            head = group[0].stamp(RequestState.READY) or now
            due = len(group) >= self.max_rows or all_idle or head + self.delay <= now
            if due and head < best_t:
                best_key, best_t = key, head
            elif not due:
                oldest_due = min(oldest_due, head + self.delay)
        return best_key, oldest_due

    def _fail_all(self) -> None:
        """No worker can take a batch: fail every READY request at once."""
        state = "dead" if all(w.dead for w in self.workers) else "unhealthy"
        error = BackendError(f"every worker of model {self.name!r} is {state}")
        for group in self.groups.values():
            for request in group:
                request.try_transition(RequestState.ERROR, error=error)
        self.groups.clear()
        self.num_ready = 0

    def _take(self, key: tuple[tuple[int, ...], ...]) -> Batch | None:
        group = self.groups[key]
        taken: list[Request] = []
        while group and len(taken) < self.max_rows:
            request = group.popleft()
            self.num_ready -= 1
            if request.try_transition(RequestState.RUNNING):
                taken.append(request)  # else cancelled or timed out while READY
        if not group:
            del self.groups[key]
        if not taken:
            return None
        return Batch(self.name, tuple(taken), key, time.perf_counter())


class ExecutionEngine:
    """Per-model batch builders and the dispatch of batches to idle workers."""

    def __init__(
        self, models: Iterable[ModelConfig], workers: Mapping[str, Sequence[BatchSink]]
    ) -> None:
        self._batchers = {m.name: ModelBatcher(m, workers[m.name]) for m in models}

    def add(self, model: str, requests: Iterable[Request]) -> None:
        """Take ownership of READY requests (scheduler thread)."""
        self._batchers[model].add(requests)

    def step(self, now: float) -> float:
        """Dispatch due batches (scheduler thread); returns the next window expiry.

        Times are `time.perf_counter()` seconds, like every stamp in inferchain.
        """
        next_due = float("inf")
        for batcher in self._batchers.values():
            if batcher.num_ready:
                next_due = min(next_due, batcher.step(now))
        return next_due

    def num_ready_of(self, model: str) -> int:
        return self._batchers[model].num_ready
