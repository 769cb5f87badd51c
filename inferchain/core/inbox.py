"""The engine's inbox: what the threads around it hand it, and the wake-up its loop sleeps on.

Workers post finished runs and changes of health here (their outbox), callers append the
Works they submit and the cancels they make; whoever steps the engine drains it under the
engine's lock. Built before the workers and the engine, so that each is given it whole.
"""

from __future__ import annotations

import contextlib
import queue
from collections import deque
from typing import TYPE_CHECKING

from inferchain.core.records import RunResult, WorkerChanged

if TYPE_CHECKING:
    from inferchain.core.request import Request
    from inferchain.core.work import Work


class Inbox:
    """Thread-shared deques (append from any thread, drained by the engine's step) and the
    loop's wake-up. Appending and taking from a deque are atomic; nothing here locks."""

    def __init__(self) -> None:
        self.posted: deque[RunResult | WorkerChanged] = deque()  # from workers and runs inline
        self.submitted: deque[Work] = deque()
        self.cancelled: deque[Request | Work] = deque()
        self._wakeups: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.wake_pending = False  # cleared by a step before it drains the deques

    def post(self, record: RunResult | WorkerChanged) -> None:
        """A worker's outbox: a finished run or a change of health."""
        self.posted.append(record)
        self.wake()

    def wake(self) -> None:
        """Make the loop step soon (cheap when a wake-up is pending)."""
        if not self.wake_pending:
            self.wake_pending = True
            self._wakeups.put(None)

    def sleep(self, timeout: float | None) -> None:
        """The loop's wait for the next wake-up (at most `timeout` seconds; None: until one)."""
        with contextlib.suppress(queue.Empty):
            self._wakeups.get(timeout=timeout)

    @property
    def news(self) -> bool:
        """Something waits to be drained."""
        return bool(self.posted or self.submitted or self.cancelled)
