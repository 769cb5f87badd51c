"""Gates a test opens: it orders what threads do by events, never by sleeps.

A fake backend numbers the points its threads pass (the n-th run, the n-th load, the n-th
execution of a fake device) and holds some of them shut: the test waits until a thread is
there ("run 1 is busy now"), does what must happen meanwhile, then opens the gate. That
order holds on any machine, however slow.
"""

from __future__ import annotations

import threading
from collections.abc import Collection

HOLD_TIMEOUT_S = 30.0  # a held point gives up after this long (a test that never opens it)


class Gates:
    """Numbered points that threads pass (the n-th run, the n-th load, 1-based), with the
    gates at some of them held shut until the test opens them.

    The passing thread calls `arrive(n)` (or `arrive()`, which numbers it next); the test
    holds gates with `held` or `hold_next()`, waits for a thread with `wait_arrived(n)` and
    lets a held one go on with `open(n)`. A held point that is never opened gives up after
    `timeout_s` (`arrive` returns False), so a failing test ends instead of hanging.
    """

    def __init__(self, held: Collection[int] = (), timeout_s: float = HOLD_TIMEOUT_S) -> None:
        self.held = set(held)  # the points whose gate is shut until opened
        self.timeout_s = timeout_s
        self._arrived: dict[int, threading.Event] = {}
        self._opened: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self.count = 0  # the highest point reached so far

    def _event(self, table: dict[int, threading.Event], n: int) -> threading.Event:
        with self._lock:
            event = table.get(n)
            if event is None:
                event = table[n] = threading.Event()
            return event

    def arrive(self, n: int | None = None) -> bool:
        """Point `n` (default: the one after the last reached) is reached by the calling
        thread: mark it, then wait while its gate is held; False if it was not opened within
        `timeout_s`."""
        with self._lock:
            n = self.count + 1 if n is None else n
            self.count = max(self.count, n)
        self._event(self._arrived, n).set()
        if n not in self.held:
            return True
        return self._event(self._opened, n).wait(self.timeout_s)

    def wait_arrived(self, n: int, timeout: float = 10.0) -> bool:
        """Block until point `n` has been reached (a held one waits at its gate then)."""
        return self._event(self._arrived, n).wait(timeout)

    def hold_next(self) -> int:
        """Hold the gate of the point after the last reached; returns its number (call it
        while no thread is passing, e.g. between two batches the test waits for)."""
        with self._lock:
            n = self.count + 1
            self.held.add(n)
            return n

    def open(self, *ns: int) -> None:
        """Let the held points `ns` go on (now, or at once when they are reached later)."""
        for n in ns:
            self._event(self._opened, n).set()
