"""Streaming many items through one model with a bounded number in flight (`oi.map`)."""

from __future__ import annotations

import itertools
import queue
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from inferchain.request import Outputs, Request


def stream(
    submit_many: Callable[[list[Any]], list[Request]],
    inputs: Iterable[Any],
    *,
    limit: int,
    ordered: bool = True,
) -> Iterator[Outputs]:
    """Submit `inputs` in chunks, never more than `limit` unfinished, and yield outputs.

    In input order, or as they finish with `ordered=False`. An item's error is raised at its
    turn; whatever is still in flight is then cancelled (also when the caller stops early).
    """
    chunk = max(1, limit // 2)
    source = iter(inputs)
    pending: deque[Request] = deque()
    finished: queue.SimpleQueue[Request] = queue.SimpleQueue()
    exhausted = False
    try:
        while True:
            if not exhausted and len(pending) <= limit - chunk:
                items = list(itertools.islice(source, chunk))
                exhausted = len(items) < chunk
                if items:
                    new = submit_many(items)
                    if not ordered:
                        for r in new:
                            r.add_done_listener(finished.put)
                    pending.extend(new)
            if not pending:
                return
            if ordered:
                yield pending.popleft().result()
            else:
                done = finished.get()
                pending.remove(done)
                yield done.result()
    finally:
        for r in pending:
            r.cancel()
