"""The engine's inbox: what comes in, counted, and the wake-up its loop sleeps on.

Callers submit Works here (counted against the queue bound and registered until they
finish: `wait_all` waits for them) and cancels; workers post finished runs and changes of
health (their outbox); the sequence layer submits its step batches. Whoever steps the engine
drains it under the engine's lock. Built before the workers, the sequence layer and the engine,
so that each is given it whole.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import deque
from typing import TYPE_CHECKING

from inferchain.core.records import RunResult, WorkerChanged
from inferchain.core.request import Request, RequestState
from inferchain.errors import Closed, QueueFull, RequestError
from inferchain.utilisation import Activity

if TYPE_CHECKING:
    from inferchain.core.work import Work

S = RequestState
_FAILED_KEPT = 65536  # failed requests remembered whole for depends_on by id (then a bit)


class Inbox:
    """Thread-shared deques (append from any thread, drained by the engine's step), the
    loop's wake-up, and the books of what is in flight (each under its own lock)."""

    def __init__(self, activity: Activity | None = None, max_queue_size: int = 10_000) -> None:
        """`activity`: the engine's "something is in flight" clock (the metrics')."""
        self.posted: deque[RunResult | WorkerChanged] = deque()  # from workers and runs inline
        self.submitted: deque[Work] = deque()
        self.cancelled: deque[Request | Work] = deque()
        self._wakeups: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.wake_pending = False  # cleared by the loop before it steps
        self._activity = activity or Activity()
        self._max_queue = max_queue_size  # rows submitted and not yet admitted, at most
        self._space_lock = threading.Lock()  # guards _queued, _space_waiters, stopping
        self._space = threading.Condition(self._space_lock)  # full queues wait here
        self._queued = 0  # rows submitted, not yet admitted nor dropped
        self._space_waiters = 0
        self.stopping = False
        self._drains = threading.Lock()  # guards _outstanding (taken as is on hot paths)
        self._drained = threading.Condition(self._drains)  # ... and wait_all waits on it
        self._outstanding = 0  # works submitted, not yet finished
        self._recovering = 0  # workers re-initialising after failures
        self._waiting = 0  # callers in wait_all (told when the last work finishes)
        self.live: dict[int, Request] = {}  # requests not yet terminal, by id
        self.failed: dict[int, Request] = {}  # the latest that ended without outputs
        self._failed_ids = bytearray()  # one bit per request id: it ended without outputs

    def post(self, record: RunResult | WorkerChanged) -> None:
        """A worker's outbox: a finished run or a change of health."""
        self.posted.append(record)
        self.wake()

    def cancel(self, item: Request | Work) -> None:
        """A request was cancelled, or a work's untaken rows should be (any thread)."""
        self.cancelled.append(item)
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

    # -- intake (any thread) --------------------------------------------------------------

    def submit(
        self, work: Work, *, block: bool, bounded: bool, refuse: bool = True, wake: bool = True
    ) -> None:
        """Take a WAITING `work` in: count its rows against the queue (waiting, or raising
        `QueueFull` without `block`, at `max_queue_size` rows where `bounded`), register
        it until it finishes, and wake the loop (unless the caller steps the engine itself);
        `refuse`: raise `Closed` once the engine is stopping."""
        rows = work.rows
        with self._space_lock:
            if refuse and self.stopping:
                raise Closed("the engine is stopped")
            if bounded and self._queued + rows > self._max_queue and self._queued > 0:
                if not block:
                    raise QueueFull(
                        f"waiting queue is full ({self._queued}/{self._max_queue} rows)"
                    )
                self._space_waiters += 1
                try:
                    self._space.wait_for(
                        lambda: (
                            self.stopping
                            or self._queued + rows <= self._max_queue
                            or self._queued == 0
                        )
                    )
                finally:
                    self._space_waiters -= 1
                if self.stopping:
                    raise Closed("the engine is stopped")
            self._queued += rows
        self.register(work)
        self.submitted.append(work)
        if wake:
            self.wake()

    def register(self, work: Work) -> None:
        """`work` is in flight until it finishes (`finished`): `wait_all` waits for it, and
        its Requests are found by id."""
        with self._drains:  # the condition's lock itself: no Python frame of a Condition's
            self._outstanding += 1
            if self._outstanding == 1:  # the engine has something in flight again
                self._activity.enter()
        requests = work.requests
        if requests is not None:
            if work.steps is not None:  # sequence steps: their ids are not consecutive
                self.live.update((r.id, r) for r in requests)
            else:
                self.live.update(zip(range(work.id, work.id + work.rows), requests, strict=True))

    def unqueue(self, rows: int) -> None:
        """`rows` left the waiting queue (admitted, or dropped before)."""
        with self._space_lock:
            self._queued -= rows
            if self._space_waiters:
                self._space.notify_all()

    def stop(self) -> None:
        """Refuse every later submission, wake the callers waiting for room and the loop
        (it ends)."""
        with self._space:
            self.stopping = True
            self._space.notify_all()
        self.wake()

    def wait_all(self, timeout: float | None) -> bool:
        """True once every work registered has finished and no worker is re-initialising
        (within `timeout` seconds)."""
        with self._drained:
            self._waiting += 1
            try:
                return self._drained.wait_for(
                    lambda: self._outstanding == 0 and self._recovering <= 0, timeout
                )
            finally:
                self._waiting -= 1

    def finished(self) -> None:
        """A registered work has finished (under the engine's lock)."""
        with self._drains:
            self._outstanding -= 1
            if self._outstanding == 0:
                self._activity.leave()
                if self._waiting:
                    self._drained.notify_all()

    def recovering_changed(self, by: int) -> None:
        """A worker began re-initialising (+1), or is healthy again or dead (-1)."""
        with self._drained:
            self._recovering += by
            self._drained.notify_all()

    def remember_failed(self, r: Request) -> None:
        """`r` ended without outputs: kept for `depends_on` by id (then a bit of it)."""
        failed = self.failed
        failed[r.id] = r  # remembered so that depends_on=[id] fails later too
        if len(failed) > _FAILED_KEPT:
            failed.pop(next(iter(failed)), None)
        byte = r.id >> 3
        bits = self._failed_ids
        if byte >= len(bits):
            bits.extend(bytes(max(byte + 1 - len(bits), len(bits))))
        bits[byte] |= 1 << (r.id & 7)

    # -- requests by id (any thread) ------------------------------------------------------

    def cancel_live(self) -> int:
        """Cancel every live request not yet running; returns how many were."""
        return sum(1 for r in list(self.live.values()) if r.state <= S.READY and r.cancel())

    def lookup(self, id: int) -> Request | None:
        """Request `id` while it is live or after it ended without outputs; a stand-in
        ended in ERROR where only the fact of its failure is still kept; None once it
        finished DONE (or was never submitted)."""
        found = self.live.get(id) or self.failed.get(id)
        if found is not None:
            return found
        byte = id >> 3
        bits = self._failed_ids
        if 0 <= byte < len(bits) and bits[byte] >> (id & 7) & 1:
            gone = Request(id, "(forgotten)")
            gone.try_transition(S.ERROR, error=RequestError(
                f"request {id} failed (only the fact is kept after {_FAILED_KEPT} later failures)"
            ))  # fmt: skip
            return gone
        return None
