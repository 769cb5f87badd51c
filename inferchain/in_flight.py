"""The bounded window of what is in flight: `Window`, the one rule both streams follow
(`oi.map` / `oi.map_batches` count rows of Works; `PipelineDriver.run` counts items), and
`in_flight`, the window of Works behind `oi.map` and `oi.map_batches`.

Items are cut into chunks, each chunk becomes one or more Works (one per run of same-shape
items), and at most `limit` rows are unfinished at any time. Results are yielded in input
order, or as works finish with `ordered=False`; whatever is still in flight is cancelled
when the caller stops early or an error is raised.
"""

from __future__ import annotations

import itertools
import queue
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from inferchain.core.work import Work


def chunks(inputs: Iterable[Any] | np.ndarray, size: int) -> Iterator[list[Any] | np.ndarray]:
    """`inputs` in pieces of `size` items; an ndarray is cut into views of its rows."""
    if isinstance(inputs, np.ndarray):
        for start in range(0, len(inputs), size):
            yield inputs[start : start + size]
        return
    source = iter(inputs)
    while items := list(itertools.islice(source, size)):
        yield items


class Window:
    """What is in flight against a limit: units of some cost enter and leave (rows of
    Works, or items of a pipeline, started and not yet handed to the caller). A unit
    enters while its cost fits, and into an empty window always (a Work of more rows than
    the limit runs alone). Its owner cancels what is still inside when the caller stops
    early: `in_flight` the Works, `PipelineDriver` the items' requests and generators."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.used = 0

    def fits(self, cost: int = 1) -> bool:
        return self.used == 0 or self.used + cost <= self.limit

    def full(self, cost: int = 1) -> bool:
        """No unit of `cost` may enter now (one must leave first)."""
        return not self.fits(cost)

    def enter(self, cost: int = 1) -> None:
        self.used += cost

    def leave(self, cost: int = 1) -> None:
        self.used -= cost


def in_flight(
    submit: Callable[[list[Any] | np.ndarray, Callable[[Work], None] | None], list[Work]],
    inputs: Iterable[Any] | np.ndarray,
    *,
    limit: int,
    chunk: int,
    ordered: bool = True,
    on_idle: Callable[[bool, bool], None] | None = None,
) -> Iterator[Work]:
    """Submit `inputs` chunk by chunk, never more than `limit` rows unfinished, and yield
    each Work once it has settled (in input order, or as they finish). `on_idle(ended,
    full)` is called before it blocks, as `PipelineDriver`'s (partial batches that wait for
    others are flushed once no more rows can come to them)."""
    pending: deque[Work] = deque()
    finished: queue.SimpleQueue[Work] = queue.SimpleQueue()
    notify = None if ordered else finished.put
    window = Window(limit)  # rows of the Works submitted and not yet yielded
    source = chunks(inputs, chunk)
    exhausted = False
    try:
        while True:
            while not exhausted and window.fits(chunk):
                items = next(source, None)
                if items is None:
                    exhausted = True
                    break
                for work in submit(items, notify):
                    pending.append(work)
                    window.enter(work.rows)
            if not pending:
                return
            if on_idle is not None and (exhausted or window.full(chunk)):
                on_idle(exhausted, True)
            if ordered:
                work = pending.popleft()
                work.wait()
            else:
                work = finished.get()
                pending.remove(work)
            window.leave(work.rows)
            yield work
    finally:
        for work in pending:
            work.cancel()
