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
    ) -> None:
        self.total = total
        self.label = label
        self.count = 0
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
            if n == 0 and self.count == 0:
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
        """`label: count/total in s (rate/s)`."""
        seconds = now - self._started
        rate = self.count / seconds if seconds > 0 else 0.0
        done = f"{self.count}/{self.total}" if self.total else str(self.count)
        return f"{self.label}: {done} in {seconds:.1f}s ({rate:.1f}/s)"

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
