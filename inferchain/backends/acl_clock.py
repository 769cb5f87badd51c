"""The device's own timeline on the host's clock: when a batch's work ran on the device.

pyACL times events only against each other (`rt.event_elapsed_time`: milliseconds between
two recorded, completed events). A session keeps one epoch event, recorded on an idle stream
and synchronized, and the host's `perf_counter` at that moment; any other event's time is
then the epoch's host time plus the milliseconds from the epoch to it. So a batch's device
span (its "start" event to its "done" event) can be set beside the host's records, and the
spans of a session's streams merged into the time its device was busy.

The epoch is recorded again every `ANCHOR_S` seconds (on a stream just collected, so idle),
so the milliseconds stay small (a float's precision then is well under a microsecond) and a
drift between the device's clock and the host's does not build up. Where the runtime cannot
time events, there is no clock (`DeviceClock.open` returns None).
"""

from __future__ import annotations

import time
from typing import Any

from inferchain.backends.acl_api import ACL_SUCCESS, check
from inferchain.backends.acl_buffers import Attempt, ignore, value_of

ANCHOR_S = 60.0  # seconds between two recordings of the epoch


class DeviceClock:
    """One session's epoch event and its host time. Used under the session's lock."""

    def __init__(self, acl: Any, model: str, event: int) -> None:
        self._acl = acl
        self._model = model
        self._event = event  # the epoch: recorded, and reached, at host time `_at`
        self._at = 0.0  # perf_counter seconds

    @classmethod
    def open(cls, acl: Any, model: str, stream: int) -> DeviceClock | None:
        """The clock of a session whose `stream` is idle, or None where the runtime cannot
        time events (no `rt.event_elapsed_time`)."""
        if getattr(acl.rt, "event_elapsed_time", None) is None:
            return None
        event = value_of(acl, acl.rt.create_event(), f"{model}: rt.create_event (the device clock)")
        clock = cls(acl, model, event)
        try:
            clock.anchor(stream)
        except BaseException:  # the event may be recorded and not reached: reach it first
            ignore(acl.rt.synchronize_stream(stream), "rt.synchronize_stream")
            clock.release(ignore)
            raise
        return clock

    def anchor(self, stream: int) -> None:
        """Record the epoch on `stream`, which has nothing queued, and wait for that event:
        it was reached between the two host readings around that."""
        rt = self._acl.rt
        before = time.perf_counter()
        check(self._acl, rt.record_event(self._event, stream), f"{self._model}: rt.record_event")
        ret = rt.synchronize_event(self._event)
        check(self._acl, ret, f"{self._model}: rt.synchronize_event (the device clock)")
        self._at = (before + time.perf_counter()) / 2

    def span(self, first: int, last: int) -> tuple[float, float] | None:
        """Host times (perf_counter seconds) at which the device reached the completed
        events `first` and `last`; None when the runtime cannot tell."""
        elapsed = self._acl.rt.event_elapsed_time
        start_ms, ret = elapsed(self._event, first)
        if ret != ACL_SUCCESS:
            return None
        end_ms, ret = elapsed(self._event, last)
        if ret != ACL_SUCCESS:
            return None
        return self._at + float(start_ms) / 1000.0, self._at + float(end_ms) / 1000.0

    def due(self) -> bool:
        """The epoch is older than `ANCHOR_S`: record it again at the next idle stream."""
        return time.perf_counter() - self._at > ANCHOR_S

    def release(self, attempt: Attempt) -> None:
        if self._event:
            attempt(self._acl.rt.destroy_event(self._event), "rt.destroy_event (the device clock)")
            self._event = 0
