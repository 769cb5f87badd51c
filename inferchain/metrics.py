"""Counters and latency percentiles per model, recorded once per run of batches by the engine.

Stages, in milliseconds per request, one after the other: `queue` (submit -> READY),
`batch_wait` (READY -> RUNNING: in a batch handed to a worker), `worker_wait` (RUNNING -> the
worker takes the batch: the wait for a free worker or stream), `execute` (taken -> finished,
on the worker), and within `execute`: `run` (the backend's `Session.run`) and whatever
split the backend reports in `Session.last_stages` (e.g. `h2d`, `compute`, `d2h`). Where a
pipeline's steps are timed (`record_item`), `pre` (item -> first request) and `post`
(outputs -> result) are per item.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping

import attrs
import numpy as np

from inferchain.core.records import NO_STAGES, BatchTiming, Run, RunTiming, batch_timings
from inferchain.utilisation import (
    Activity,
    BusyClock,
    HostClock,
    LockedActivity,
    Utilisation,
    utilisation,
)

# per slice of a batch: rows, submitted, admitted, dispatched, picked, end, ok
_Stamp = tuple[int, float, float, float, float, float, bool]

__all__ = [
    "NO_STAGES",
    "BatchTiming",
    "Metrics",
    "ModelMetrics",
    "ModelStats",
    "SequenceStats",
    "Stats",
]

STAGES = ("queue", "batch_wait", "worker_wait", "execute", "end_to_end")  # per request
RUN = "run"  # Session.run per batch, counted once per request of the batch
PIPELINE_STAGES = ("pre", "post")  # per item, where a pipeline's steps are timed
_CAPACITY = 1 << 16  # latest samples kept per stage and model
_TIMELINE = 4096  # latest runs kept for traces and plots


@attrs.frozen
class Percentiles:
    """Latency percentiles in milliseconds over the recorded samples."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float

    @classmethod
    def of(cls, samples_s: np.ndarray) -> Percentiles:
        if samples_s.size == 0:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0)
        ms = samples_s * 1000.0
        p50, p90, p95, p99 = np.percentile(ms, [50, 90, 95, 99])
        return cls(int(ms.size), float(ms.mean()), float(p50), float(p90), float(p95), float(p99))

    def to_dict(self) -> dict[str, float]:
        return attrs.asdict(self)


@attrs.frozen
class SequenceStats:
    """A stateful model's sequence steps (`oi.sequence`)."""

    steps: int  # steps that ran and succeeded (rows of step batches)
    steps_per_s: float  # steps per second between the first submit and the last result
    step_batches: int  # batches that ran steps
    rows_per_step: float  # mean steps per step batch
    live_mean: float  # live sequences when a step batch formed, on average
    live_max: int  # and at most
    queue_ms: Percentiles  # per step: step() -> its batch starts (queued and batch_wait)

    def to_dict(self) -> dict[str, object]:
        return {**attrs.asdict(self, recurse=False), "queue_ms": self.queue_ms.to_dict()}


@attrs.frozen
class ModelStats:
    """One model's figures."""

    name: str
    requests: int  # finished DONE
    errors: int  # finished ERROR on a worker
    batches: int
    batch_sizes: Mapping[int, int]  # batch size -> number of batches
    throughput: float  # DONE items per second between first submit and last completion
    latency_ms: Percentiles  # end to end, submit -> DONE
    stages: Mapping[str, Percentiles]  # queue, batch_wait, worker_wait, execute
    sequences: SequenceStats | None = None  # a stateful model's steps, once any ran

    @property
    def mean_batch_size(self) -> float:
        total = sum(self.batch_sizes.values())
        return sum(k * v for k, v in self.batch_sizes.items()) / total if total else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "batches": self.batches,
            "mean_batch_size": self.mean_batch_size,
            "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
            "throughput": self.throughput,
            "latency_ms": self.latency_ms.to_dict(),
            "stages": {k: v.to_dict() for k, v in self.stages.items()},
            "sequences": None if self.sequences is None else self.sequences.to_dict(),
        }


@attrs.frozen
class Stats:
    """Figures for the whole OfflineInference, as `oi.stats()` returns them."""

    throughput: float  # DONE items per second, all models
    requests: int
    errors: int
    latency_ms: Percentiles
    stages: Mapping[str, Percentiles]  # queue, ..., execute, then those recorded
    models: Mapping[str, ModelStats]
    batches: int = 0  # all models
    span_s: float = 0.0  # first submit -> last completion, seconds
    utilisation: Utilisation | None = None  # workers busy / starved, host pool, padding

    def to_dict(self) -> dict[str, object]:
        return {
            "utilisation": None if self.utilisation is None else self.utilisation.to_dict(),
            "throughput": self.throughput,
            "requests": self.requests,
            "errors": self.errors,
            "batches": self.batches,
            "span_s": self.span_s,
            "latency_ms": self.latency_ms.to_dict(),
            "stages": {k: v.to_dict() for k, v in self.stages.items()},
            "models": {k: v.to_dict() for k, v in self.models.items()},
        }


class _Ring:
    """The latest `_CAPACITY` float samples."""

    def __init__(self) -> None:
        self.data = np.empty(_CAPACITY)
        self.n = 0  # samples ever written

    def extend(self, values: np.ndarray) -> None:
        values = values[-_CAPACITY:]
        start = self.n % _CAPACITY
        end = start + values.size
        if end <= _CAPACITY:
            self.data[start:end] = values
        else:
            cut = _CAPACITY - start
            self.data[start:] = values[:cut]
            self.data[: end - _CAPACITY] = values[cut:]
        self.n += values.size

    def values(self) -> np.ndarray:
        return self.data[: min(self.n, _CAPACITY)].copy()


class _Rings:
    """Rings by stage name, made on first use (in first-use order); callers hold a lock."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.rings = {name: _Ring() for name in names}

    def extend(self, name: str, values: np.ndarray) -> None:
        ring = self.rings.get(name)
        if ring is None:
            ring = self.rings[name] = _Ring()
        ring.extend(values)

    def values(self) -> dict[str, np.ndarray]:
        return {name: ring.values() for name, ring in self.rings.items()}


class ModelMetrics:
    """Recorder for one model; the engine calls `record_run` once per finished run.

    Recording is cheap (counters, and one tuple of stamps per work slice of the run);
    arrays, percentiles and the timeline's batches are made only when someone asks
    (`samples`, `snapshot`, `batches`).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self.requests = 0
        self.errors = 0
        self.batch_sizes: Counter[int] = Counter()
        self.first_submit: float | None = None
        self.last_done: float | None = None
        self._slices: deque[_Stamp] = deque(maxlen=_CAPACITY)
        self.runs: deque[RunTiming] = deque(maxlen=_TIMELINE)  # the timeline, run by run
        self.busy: dict[str, BusyClock] = {}  # per worker name
        self.elements = 0  # input elements run, and of those padding
        self.padded = 0
        self.steps = 0  # sequence steps run, and the batches they ran in
        self.step_batches = 0
        self._formed = 0  # step batches formed, and the live sequences at each
        self._live_sum = 0
        self._live_max = 0

    def record_steps_formed(self, live: int) -> None:
        """A batch of sequence steps formed while `live` sequences were open."""
        with self._lock:
            self._formed += 1
            self._live_sum += live
            self._live_max = max(self._live_max, live)

    def record_run(self, timing: RunTiming, run: Run) -> None:
        """Count a finished run's batches, keep the stamps of its slices and the run in the
        timeline: the one call per run, whatever executor ran it."""
        sent = run.dispatched
        picked = timing.picked if timing.picked > sent else sent
        end, slices, rows = timing.end, run.slices, timing.rows
        size, failed = timing.size, timing.failed
        full, last = divmod(rows, size)
        errors = 0
        if failed:
            errors = sum(size if i < full else last for i in failed)
        stamps: _Stamp | list[_Stamp]
        if len(slices) == 1:  # the common case
            work = slices[0].work
            first = work.submitted
            admitted = work.admitted or sent
            stamps = (rows - errors, first, admitted, sent, picked, end, True)
            if errors:
                stamps = [stamps, (errors, first, admitted, sent, picked, end, False)]
        else:  # one batch: all of it ran, or none
            ok = not failed
            stamps = [
                (s.rows, s.work.submitted, s.work.admitted or sent, sent, picked, end, ok)
                for s in slices
            ]
            first = min(s[1] for s in stamps)
        with self._lock:
            if full:
                self.batch_sizes[size] += full
            if last:
                self.batch_sizes[last] += 1
            self.requests += rows - errors
            self.errors += errors
            if self.first_submit is None or first < self.first_submit:
                self.first_submit = first
            self.last_done = end
            if isinstance(stamps, list):
                self._slices.extend(stamps)
            else:
                self._slices.append(stamps)
            self.runs.append(timing)
            clock = self.busy.get(timing.worker)
            if clock is None:
                clock = self.busy[timing.worker] = BusyClock()
            clock.add(picked, end, rows, timing.device, full + (last > 0))
            if timing.elements:
                self.elements += timing.elements
                self.padded += timing.padded
            if timing.steps and not failed:
                steps = slices[0].work.steps
                self.steps += timing.steps
                self.step_batches += 1 if steps is None else steps.count  # model runs

    def samples(self) -> dict[str, np.ndarray]:
        """Seconds per stage (`end_to_end` included), the latest samples of each."""
        with self._lock:
            slices = list(self._slices)
            runs = list(self.runs)
        if not slices:
            return {stage: np.empty(0) for stage in STAGES}
        a = np.array([s[1:6] for s in slices], dtype=float)
        rows = np.array([s[0] for s in slices])
        ok = np.repeat(np.array([s[6] for s in slices], dtype=bool), rows)
        submit, ready, running, picked, end = (np.repeat(a[:, i], rows) for i in range(5))
        samples = {
            "queue": ready - submit,
            "batch_wait": running - ready,
            "worker_wait": picked - running,
            "execute": end - picked,
            "end_to_end": (end - submit)[ok],
        }
        batches = [b for r in runs for b in batch_timings(r) if b.ok]
        if batches:  # `run` and the backend's own stages, once per row of a batch
            sizes = np.array([b.size for b in batches])
            samples[RUN] = np.repeat([b.run_end - b.run_start for b in batches], sizes)
            for stage in {k for b in batches for k in b.stages}:
                have = [b for b in batches if stage in b.stages]
                samples[stage] = np.repeat([b.stages[stage] for b in have], [b.size for b in have])
        return samples

    def batches(self) -> list[BatchTiming]:
        """The recorded timeline, a record per batch."""
        with self._lock:
            runs = list(self.runs)
        return [b for r in runs for b in batch_timings(r)]

    def snapshot(self) -> tuple[ModelStats, dict[str, np.ndarray]]:
        samples = self.samples()
        with self._lock:
            span = (self.last_done or 0.0) - (self.first_submit or 0.0)
            stats = ModelStats(
                name=self.name,
                requests=self.requests,
                errors=self.errors,
                batches=sum(self.batch_sizes.values()),
                batch_sizes=dict(self.batch_sizes),
                throughput=self.requests / span if span > 0 else 0.0,
                latency_ms=Percentiles.of(samples["end_to_end"]),
                stages=_stage_percentiles(samples),
                sequences=self._sequences(span, samples),
            )
        return stats, samples

    def _sequences(self, span: float, samples: Mapping[str, np.ndarray]) -> SequenceStats | None:
        """The step figures (under `_lock`); None when no step ran."""
        if not self.steps:
            return None
        return SequenceStats(
            steps=self.steps,
            steps_per_s=self.steps / span if span > 0 else 0.0,
            step_batches=self.step_batches,
            rows_per_step=self.steps / self.step_batches,
            live_mean=self._live_sum / self._formed if self._formed else 0.0,
            live_max=self._live_max,
            queue_ms=Percentiles.of(samples["queue"] + samples["batch_wait"]),
        )


def _stage_percentiles(samples: Mapping[str, np.ndarray]) -> dict[str, Percentiles]:
    """The fixed stages, then every other recorded one that has samples."""
    fixed = STAGES[:-1]
    stages = {s: Percentiles.of(samples.get(s, np.empty(0))) for s in fixed}
    for name, values in samples.items():
        if name not in STAGES and values.size:
            stages[name] = Percentiles.of(values)
    return stages


class Metrics:
    """All models' recorders, and the per-item timings of pipeline steps."""

    def __init__(self, models: Iterable[str]) -> None:
        self.models = {name: ModelMetrics(name) for name in models}
        self.created = time.perf_counter()
        self._lock = threading.Lock()
        self._items = _Rings()  # pipeline stages, per item
        self.activity = LockedActivity()  # the pipeline drivers' items in flight (any thread)
        self.engine_activity = Activity()  # the engine's works (under its drain lock)
        self.host = HostClock()  # the pipeline driver's host steps

    def record_item(self, stages: Mapping[str, float]) -> None:
        """Seconds one pipeline item spent in each of its own stages (e.g. `pre`, `post`)."""
        with self._lock:
            for stage, seconds in stages.items():
                self._items.extend(stage, np.array([seconds]))

    def samples(self, stage: str = "end_to_end") -> np.ndarray:
        """Seconds of `stage` over all models (or pipeline items), latest samples."""
        if stage in PIPELINE_STAGES:
            with self._lock:
                return self._items.values().get(stage, np.empty(0))
        found = [m.samples().get(stage) for m in self.models.values()]
        arrays = [a for a in found if a is not None]
        return np.concatenate(arrays) if arrays else np.empty(0)

    def timeline(self) -> list[BatchTiming]:
        """Every model's recorded batches, by the time a worker picked them up."""
        batches = [b for m in self.models.values() for b in m.batches()]
        return sorted(batches, key=lambda b: b.picked)

    def stats(self) -> Stats:
        per_model: dict[str, ModelStats] = {}
        pooled: dict[str, list[np.ndarray]] = {}
        firsts, lasts = [], []
        for name, recorder in self.models.items():
            stats, samples = recorder.snapshot()
            per_model[name] = stats
            for stage, values in samples.items():
                pooled.setdefault(stage, []).append(values)
            if recorder.first_submit is not None and recorder.last_done is not None:
                firsts.append(recorder.first_submit)
                lasts.append(recorder.last_done)
        with self._lock:
            for stage, values in self._items.values().items():
                pooled.setdefault(stage, []).append(values)
        requests = sum(s.requests for s in per_model.values())
        span = max(lasts) - min(firsts) if firsts else 0.0
        merged = {s: np.concatenate(v) for s, v in pooled.items()}
        return Stats(
            throughput=requests / span if span > 0 else 0.0,
            requests=requests,
            errors=sum(s.errors for s in per_model.values()),
            latency_ms=Percentiles.of(merged.get("end_to_end", np.empty(0))),
            stages=_stage_percentiles(merged),
            models=per_model,
            batches=sum(s.batches for s in per_model.values()),
            span_s=span,
            utilisation=self.utilisation(),
        )

    def utilisation(self) -> Utilisation:
        """Workers' busy / starved / idle time, the host pool's busy share, padding."""
        busy: dict[str, BusyClock] = {}
        padding: dict[str, tuple[int, int]] = {}
        for name, m in self.models.items():
            with m._lock:
                busy.update({w: copy.copy(c) for w, c in m.busy.items()})
                padding[name] = (m.padded, m.elements)
        return utilisation((self.activity, self.engine_activity), busy, self.host, padding)
