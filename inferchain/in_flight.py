"""A bounded window of Works in flight, for `oi.map` and `oi.map_batches`.

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
    rows = 0
    source = chunks(inputs, chunk)
    exhausted = False
    try:
        while True:
            while not exhausted and rows + chunk <= max(limit, chunk):
                items = next(source, None)
                if items is None:
                    exhausted = True
                    break
                for work in submit(items, notify):
                    pending.append(work)
                    rows += work.rows
            if not pending:
                return
            if on_idle is not None and (exhausted or rows + chunk > max(limit, chunk)):
                on_idle(exhausted, True)
            if ordered:
                work = pending.popleft()
                work.wait()
            else:
                work = finished.get()
                pending.remove(work)
            rows -= work.rows
            yield work
    finally:
        for work in pending:
            work.cancel()
