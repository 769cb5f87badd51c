"""How busy each worker and the host pool were: the framework's "device utilisation" figure.

Over a run's active span (from the first thing put in flight to the last one ending), each
worker's time is split three ways:

- busy: a batch of it was running (the union of its batches' spans, so a worker with
  several streams counts overlapping batches once). A batch's span is the device's own where
  the backend times it (on acl: its stream's events, first copy in to last copy out, on the
  host's clock: `inferchain.backends.acl_clock`), so busy is the device time the stream
  timeline saw; elsewhere the worker's pick-up -> delivery;
- starved: idle while something was in flight (items in a pipeline's host steps, works in the
  engine waiting for a batching window, a dependency, a free slot): the worker could have
  been fed;
- idle: nothing at all was in flight (the caller was not submitting).

The host pool's busy share is its threads' time in host steps over its threads times the
span. A model's padding share is the input elements its batches ran that were padding (rows
padded to a fixed batch, dims padded to a bucket or to a batch's longest row) over all the
elements they ran. `Activity` is a clock of "something is in flight": the engine has one
(works submitted, until they settle) and the pipeline drivers one (items, until they end).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import attrs

_HOST_TIMELINE = 4096  # latest host steps kept for traces


class Activity:
    """Counts what is in flight and the seconds during which anything was. Not locked: its
    owner calls it under a lock of its own (the engine, under its drain lock), so its hot
    path takes no second lock; `span` reads it as it is (a moment's skew at most).
    `LockedActivity` is the one for any thread."""

    def __init__(self) -> None:
        self._count = 0
        self._since = 0.0  # when the count last left 0
        self._active_s = 0.0  # closed active spans, seconds
        self.first: float | None = None  # the first enter
        self.last = 0.0  # the last leave to 0

    def enter(self, now: float | None = None) -> None:
        if self._count == 0:
            self._since = t = time.perf_counter() if now is None else now
            if self.first is None:
                self.first = t
        self._count += 1

    def leave(self, now: float | None = None) -> None:
        self._count -= 1
        if self._count == 0:
            self.last = t = time.perf_counter() if now is None else now
            self._active_s += t - self._since

    def span(self, now: float | None = None) -> tuple[float | None, float, float]:
        """(the first enter, the last leave or now while active, seconds during which
        anything was in flight)."""
        now = time.perf_counter() if now is None else now
        if self._count:
            return self.first, now, self._active_s + now - self._since
        return self.first, self.last, self._active_s


class LockedActivity(Activity):
    """An `Activity` any thread may call (the pipeline drivers')."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def enter(self, now: float | None = None) -> None:
        with self._lock:
            super().enter(now)

    def leave(self, now: float | None = None) -> None:
        with self._lock:
            super().leave(now)

    def span(self, now: float | None = None) -> tuple[float | None, float, float]:
        with self._lock:
            return super().span(now)


def merged_span(*activities: Activity) -> tuple[float, float]:
    """(seconds from the first enter of any to the last leave of any; seconds active, the
    most of any one: the pipeline's items hold the engine's works within them)."""
    now = time.perf_counter()
    spans = [a.span(now) for a in activities]
    firsts = [f for f, _, _ in spans if f is not None]
    if not firsts:
        return 0.0, 0.0
    last = max(last for f, last, _ in spans if f is not None)
    return last - min(firsts), max(active for _, _, active in spans)


class BusyClock:
    """One worker's busy seconds: the union of its batches' spans, which end in the order
    they started (a worker collects its streams in launch order). A batch's span is when the
    device ran it where the backend times its device (`RunTiming.device`: the acl
    backend's stream events), else the worker's pick-up -> delivery."""

    __slots__ = ("batches", "busy_s", "device_batches", "last_end", "rows")

    def __init__(self) -> None:
        self.busy_s = 0.0
        self.last_end = 0.0
        self.batches = 0
        self.rows = 0
        self.device_batches = 0  # of `batches`, those timed on the device

    def add(
        self,
        picked: float,
        end: float,
        rows: int,
        device: Sequence[tuple[float, float]] = (),
        batches: int = 1,
    ) -> None:
        """A run of `batches` batches of `rows` rows in all, from `picked` to `end` (or
        its `device` spans)."""
        self.batches += batches
        self.rows += rows
        if device:
            self.device_batches += batches
        for start, stop in device or ((picked, end),):  # the union of the spans so far
            last = self.last_end
            if stop > last:
                lo = start if start > last else last
                if stop > lo:
                    self.busy_s += stop - lo
                self.last_end = stop


@attrs.frozen
class HostStep:
    """One host step of a pipeline item, for traces."""

    thread: str
    start: float  # perf_counter seconds
    end: float
    index: int  # the item's position in its run's input


class HostClock:
    """The pipeline driver's host steps: busy seconds and the pool size (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.busy_s = 0.0
        self.steps = 0
        self.workers = 0  # the largest pool a run used (0: the caller's thread only)
        self.timeline: deque[HostStep] = deque(maxlen=_HOST_TIMELINE)

    def started(self, workers: int) -> None:
        with self._lock:
            self.workers = max(self.workers, workers)

    def record(self, step: HostStep) -> None:
        with self._lock:
            self.busy_s += step.end - step.start
            self.steps += 1
            self.timeline.append(step)

    def snapshot(self) -> tuple[float, int, int, list[HostStep]]:
        with self._lock:
            return self.busy_s, self.steps, self.workers, list(self.timeline)


@attrs.frozen
class WorkerUse:
    """One worker over the active span (seconds, and shares of the span)."""

    worker: str
    busy_s: float
    starved_s: float  # idle while something was in flight
    idle_s: float  # idle with nothing in flight
    batches: int
    mean_batch: float  # rows per batch
    device: bool = False  # busy is the device's own timeline (acl), not the worker's times

    @property
    def busy(self) -> float:
        total = self.busy_s + self.starved_s + self.idle_s
        return self.busy_s / total if total > 0 else 0.0

    @property
    def starved(self) -> float:
        total = self.busy_s + self.starved_s + self.idle_s
        return self.starved_s / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        return {**attrs.asdict(self), "busy": self.busy, "starved": self.starved}


@attrs.frozen
class Utilisation:
    """What `oi.stats().utilisation` gives: workers, the host pool, padding per model."""

    span_s: float  # first thing in flight -> last one ended
    active_s: float  # of which something was in flight
    workers: tuple[WorkerUse, ...]
    host_workers: int  # threads of the pipeline's host pool (0: the caller's thread)
    host_busy_s: float  # seconds in host steps, all threads
    host_steps: int
    padding: Mapping[str, float]  # per model: padded input elements / elements run

    @property
    def host_busy(self) -> float:
        """The host pool's busy share (threads x span)."""
        threads = max(self.host_workers, 1)
        return self.host_busy_s / (threads * self.span_s) if self.span_s > 0 else 0.0

    def bound(self) -> str:
        """What bounds the run: the busiest of the host pool and the models' workers (by
        their mean busy share), named "host" or the model's name."""
        shares: dict[str, list[float]] = {}
        for w in self.workers:
            shares.setdefault(w.worker.rpartition("#")[0] or w.worker, []).append(w.busy)
        candidates = {name: sum(v) / len(v) for name, v in shares.items()}
        if self.host_steps:
            candidates["host"] = self.host_busy
        return max(candidates, key=lambda k: candidates[k]) if candidates else ""

    def to_dict(self) -> dict[str, object]:
        return {
            "span_s": self.span_s,
            "active_s": self.active_s,
            "workers": {w.worker: w.to_dict() for w in self.workers},
            "host": {
                "workers": self.host_workers,
                "busy_s": self.host_busy_s,
                "steps": self.host_steps,
                "busy": self.host_busy,
            },
            "padding": dict(self.padding),
            "bound": self.bound(),
        }


def utilisation(
    activities: Sequence[Activity],
    workers: Mapping[str, BusyClock],
    host: HostClock,
    padding: Mapping[str, tuple[int, int]],
) -> Utilisation:
    """The figures now, from the clocks (`padding`: model -> (padded, total) elements)."""
    span, active = merged_span(*activities)
    uses = []
    for name in sorted(workers, key=worker_order):
        clock = workers[name]
        busy = min(clock.busy_s, span) if span > 0 else clock.busy_s
        starved = max(active - busy, 0.0)
        idle = max(span - busy - starved, 0.0)
        mean = clock.rows / clock.batches if clock.batches else 0.0
        timed = clock.device_batches > 0
        uses.append(WorkerUse(name, busy, starved, idle, clock.batches, mean, timed))
    host_busy, steps, threads, _ = host.snapshot()
    shares = {m: (p / t if t else 0.0) for m, (p, t) in padding.items()}
    return Utilisation(span, active, tuple(uses), threads, host_busy, steps, shares)


def worker_order(name: str) -> tuple[str, int, str]:
    """Sort "det#10" after "det#2": by model, then instance number (names as `model#i`)."""
    model, _, index = name.rpartition("#")
    return (model, int(index), "") if index.isdigit() else (name, -1, name)


def format_utilisation(u: Utilisation, models: Iterable[str] = ()) -> list[str]:
    """Short lines for a run's summary: each worker, the host pool, padding, the bound."""
    lines = []
    for w in u.workers:
        lines.append(
            f"{w.worker}: busy {w.busy:.0%}{' (device)' if w.device else ''}, "
            f"starved {w.starved:.0%} "
            f"({w.batches} batches, mean {w.mean_batch:.1f} rows)"
        )
    if u.host_steps:
        lines.append(f"host: {u.host_workers or 'caller'} thread(s) busy {u.host_busy:.0%}")
    padded = [f"{m} {u.padding[m]:.1%}" for m in models if u.padding.get(m)]
    if padded:
        lines.append("padding: " + ", ".join(padded))
    if u.bound():
        lines.append(f"bound by: {u.bound()}")
    return lines
