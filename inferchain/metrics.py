"""Counters and latency percentiles per model, recorded once per batch by the workers."""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence

import attrs
import numpy as np

from inferchain.request import Request, RequestState

STAGES = ("queue", "batch_wait", "execute", "end_to_end")
_CAPACITY = 1 << 16  # latest samples kept per stage and model
_TIMELINE = 100_000  # latest batches kept for traces and plots


@attrs.frozen
class BatchTiming:
    """When one batch ran on which worker; times are `time.perf_counter()` seconds."""

    model: str
    worker: str  # e.g. "det#0"
    size: int  # requests in the batch
    shape_key: tuple[tuple[int, ...], ...]  # item shape of each input
    ok: bool
    picked: float  # the worker took the batch from its queue
    run_start: float  # Session.run called (inputs stacked)
    run_end: float  # Session.run returned
    end: float  # outputs delivered to the requests
    stages: Mapping[str, float] = attrs.field(factory=dict)  # backend split, e.g. h2d/compute/d2h


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
class ModelStats:
    """One model's figures."""

    name: str
    requests: int  # finished DONE
    errors: int  # finished ERROR on a worker
    batches: int
    batch_sizes: Mapping[int, int]  # batch size -> number of batches
    throughput: float  # DONE items per second between first submit and last completion
    latency_ms: Percentiles  # end to end, submit -> DONE
    stages: Mapping[str, Percentiles]  # queue, batch_wait, execute

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
        }


@attrs.frozen
class Stats:
    """Figures for the whole OfflineInference, as `oi.stats()` returns them."""

    throughput: float  # DONE items per second, all models
    requests: int
    errors: int
    latency_ms: Percentiles
    stages: Mapping[str, Percentiles]
    models: Mapping[str, ModelStats]

    def to_dict(self) -> dict[str, object]:
        return {
            "throughput": self.throughput,
            "requests": self.requests,
            "errors": self.errors,
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


class ModelMetrics:
    """Recorder for one model; `record_batch` is called by its workers."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self.requests = 0
        self.errors = 0
        self.batch_sizes: Counter[int] = Counter()
        self.first_submit: float | None = None
        self.last_done: float | None = None
        self._rings = {stage: _Ring() for stage in STAGES}
        self.timeline: deque[BatchTiming] = deque(maxlen=_TIMELINE)

    def record_batch(
        self, requests: Sequence[Request], ok: bool, timing: BatchTiming | None = None
    ) -> None:
        """Stage latencies of a finished batch, from the requests' state stamps."""
        n = len(requests)
        stamps = np.array([r._stamps for r in requests], dtype=float)
        submit = stamps[:, RequestState.WAITING]
        ready = stamps[:, RequestState.READY]
        running = stamps[:, RequestState.RUNNING]
        end = stamps[:, RequestState.DONE if ok else RequestState.ERROR]
        with self._lock:
            self.batch_sizes[n] += 1
            if ok:
                self.requests += n
            else:
                self.errors += n
            if timing is not None:
                self.timeline.append(timing)
            first = float(submit.min())
            self.first_submit = (
                first if self.first_submit is None else min(self.first_submit, first)
            )
            self.last_done = float(end.max())
            self._rings["queue"].extend(ready - submit)
            self._rings["batch_wait"].extend(running - ready)
            self._rings["execute"].extend(end - running)
            if ok:
                self._rings["end_to_end"].extend(end - submit)

    def snapshot(self) -> tuple[ModelStats, dict[str, np.ndarray]]:
        with self._lock:
            samples = {stage: ring.values() for stage, ring in self._rings.items()}
            span = (self.last_done or 0.0) - (self.first_submit or 0.0)
            stats = ModelStats(
                name=self.name,
                requests=self.requests,
                errors=self.errors,
                batches=sum(self.batch_sizes.values()),
                batch_sizes=dict(self.batch_sizes),
                throughput=self.requests / span if span > 0 else 0.0,
                latency_ms=Percentiles.of(samples["end_to_end"]),
                stages={s: Percentiles.of(samples[s]) for s in STAGES[:-1]},
            )
        return stats, samples


class Metrics:
    """All models' recorders."""

    def __init__(self, models: Iterable[str]) -> None:
        self.models = {name: ModelMetrics(name) for name in models}
        self.created = time.perf_counter()

    def stats(self) -> Stats:
        per_model: dict[str, ModelStats] = {}
        pooled: dict[str, list[np.ndarray]] = {s: [] for s in STAGES}
        firsts, lasts = [], []
        for name, recorder in self.models.items():
            stats, samples = recorder.snapshot()
            per_model[name] = stats
            for stage, values in samples.items():
                pooled[stage].append(values)
            if recorder.first_submit is not None and recorder.last_done is not None:
                firsts.append(recorder.first_submit)
                lasts.append(recorder.last_done)
        requests = sum(s.requests for s in per_model.values())
        span = max(lasts) - min(firsts) if firsts else 0.0
        merged = {s: np.concatenate(v) if v else np.empty(0) for s, v in pooled.items()}
        return Stats(
            throughput=requests / span if span > 0 else 0.0,
            requests=requests,
            errors=sum(s.errors for s in per_model.values()),
            latency_ms=Percentiles.of(merged["end_to_end"]),
            stages={s: Percentiles.of(merged[s]) for s in STAGES[:-1]},
            models=per_model,
        )
