"""Progress of long CLI runs: a live bar on a terminal, one summary line when logged to a file.

The library reports progress through plain callbacks; only the CLI draws. `Progress.update`
may be called from any thread.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from inferchain.closing import Closing

_WIDTH = 24  # characters of the bar


class Progress(Closing):
    """Counts finished units towards `total` and shows it on `stream` (stderr by default).

    On a TTY a bar is redrawn in place at most every `interval` seconds and whenever the count
    reaches `total`; `close()` leaves it, at its final count, on screen. Otherwise nothing is
    drawn, and `close()` writes one summary line (unless `summary=False`). Lines for
    stdout go through `print()` so they never tear the bar.
    """

    def __init__(
        self,
        total: int | None,
        label: str,
        *,
        stream: TextIO | None = None,
        interactive: bool | None = None,
        summary: bool = True,
        interval: float = 0.1,
        done: int = 0,
    ) -> None:
        self.total = total
        self.label = label
        self.done = done  # units done before this run (a resumed job): counted, not timed
        self.count = done
        self._stream = stream if stream is not None else sys.stderr
        self._live = self._stream.isatty() if interactive is None else interactive
        self._summary = summary
        self._interval = interval
        self._lock = threading.Lock()
        self._started = time.perf_counter()
        self._drawn = 0.0  # when the bar was last drawn; 0 = not on screen
        self._closed = False

    def update(self, n: int = 1) -> None:
        """`n` more units are done; `update(0)` before the first unit restarts the clock (the
        work starts now: loading models was not progress)."""
        with self._lock:
            now = time.perf_counter()
            if n == 0 and self.count == self.done:
                self._started = now
            self.count += n
            finished = self.total is not None and self.count >= self.total
            if (
                self._live
                and not self._closed
                and (finished or now - self._drawn >= self._interval)
            ):
                self._draw(now)

    def print(self, line: str, file: TextIO | None = None) -> None:
        """Print `line` (to stdout by default) without tearing the bar."""
        with self._lock:
            shown = self._drawn
            if shown:
                self._stream.write("\r\x1b[K")
                self._stream.flush()
            print(line, file=file or sys.stdout, flush=self._live)
            if shown:
                self._draw(time.perf_counter())

    def close(self) -> None:
        """Once: on a TTY, draw the bar at its final count and leave it on screen; otherwise
        write the summary line (unless `summary=False`)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._live and (self._drawn or self.count):
                self._draw(time.perf_counter())
                self._stream.write("\n")
            elif self._summary:
                self._stream.write(self.line(time.perf_counter()) + "\n")
            self._stream.flush()

    def line(self, now: float) -> str:
        """`label: count/total in s (rate/s, s left)`; units done before this run count
        towards the total but not the rate (`N done before`)."""
        seconds = now - self._started
        ran = self.count - self.done
        rate = ran / seconds if seconds > 0 else 0.0
        done = f"{self.count}/{self.total}" if self.total else str(self.count)
        timing = f"{rate:.1f}/s"
        if self.total and self.count < self.total:
            timing += f", {(self.total - self.count) / rate:.0f}s left" if rate else ", ? left"
        before = f", {self.done} done before" if self.done else ""
        return f"{self.label}: {done} in {seconds:.1f}s ({timing}{before})"

    def _draw(self, now: float) -> None:
        text = self.line(now)
        if self.total:
            fraction = min(self.count / self.total, 1.0)
            filled = round(fraction * _WIDTH)
            bar = "#" * filled + "." * (_WIDTH - filled)
            text = f"{self.label} [{bar}] {fraction:4.0%} {text[len(self.label) + 2 :]}"
        self._stream.write("\r\x1b[K" + text)
        self._stream.flush()
        self._drawn = now
