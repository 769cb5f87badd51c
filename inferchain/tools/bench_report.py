"""What a benchmark run reports: the records `inferchain.tools.bench` returns, as JSON
(`to_dict`, what `bench --json` writes) and as the text `inferchain bench` prints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs
import numpy as np

from inferchain.metrics import BatchTiming, ModelStats, Percentiles, Stats
from inferchain.tools.table import render
from inferchain.utilisation import HostStep, Utilisation

Source = Literal["synthetic", "pipeline"]
Inputs = dict[str, dict[str, list[int]]]  # model -> input -> synthetic item shape


@attrs.frozen
class ItemStats:
    """Items through the pipeline (the pipeline source): not model requests, of which each
    item makes any number."""

    items: int  # finished, with a result or an error
    errors: int  # of those, failed
    throughput: float  # items per second of wall time
    latency_ms: Percentiles  # per item: its first step to its result

    def to_dict(self) -> dict[str, object]:
        return {**attrs.asdict(self, recurse=False), "latency_ms": self.latency_ms.to_dict()}


@attrs.frozen(eq=False)
class BenchReport:
    """One benchmark run: what was driven, and the figures."""

    recipe: str
    backend: str
    source: Source
    requested: int  # requests per model (synthetic) or items (pipeline)
    wall_s: float  # first submit -> last result, as the driver saw it
    inputs: Inputs  # synthetic item shape per model and input (none for the pipeline)
    workers: tuple[str, ...]  # every worker, "model#i", idle or not
    stats: Stats
    timeline: tuple[BatchTiming, ...]  # every batch, by the time a worker took it
    latencies_s: np.ndarray  # end to end per request (seconds), for plots
    items: ItemStats | None = None  # the pipeline source only
    host_steps: tuple[HostStep, ...] = ()  # the pipeline's host steps, for traces
    # per model, how its synthetic items' shapes were chosen, where that matters (buckets,
    # or dynamic dims filled with `dynamic_dim`)
    shape_notes: dict[str, str] = attrs.field(factory=dict)
    in_flight: dict[str, int] = attrs.field(factory=dict)  # synthetic requests in flight, max
    # per request: waiting for admission, a batch and a worker (queue + batch_wait +
    # worker_wait), and service (execute); ms
    waiting_ms: Percentiles = attrs.field(factory=lambda: Percentiles.of(np.empty(0)))
    service_ms: Percentiles = attrs.field(factory=lambda: Percentiles.of(np.empty(0)))

    def to_dict(self) -> dict[str, object]:
        """`Stats.to_dict()` (model requests), a `pipeline` section with the pipeline source
        (its items), and a `bench` section saying what ran."""
        pipeline = {"pipeline": self.items.to_dict()} if self.items is not None else {}
        return {
            **self.stats.to_dict(),
            **pipeline,
            "bench": {
                "recipe": self.recipe,
                "backend": self.backend,
                "source": self.source,
                "requested": self.requested,
                "wall_s": self.wall_s,
                "inputs": self.inputs,
                "shape_notes": self.shape_notes,
                "in_flight": self.in_flight,
                "waiting_ms": self.waiting_ms.to_dict(),
                "service_ms": self.service_ms.to_dict(),
                "workers": list(self.workers),
            },
        }


def _percentiles(p: Percentiles) -> str:
    return f"p50 {p.p50:.2f}  p90 {p.p90:.2f}  p95 {p.p95:.2f}  p99 {p.p99:.2f}"


def _stage_rows(stages: dict[str, Percentiles], e2e: Percentiles) -> list[list[object]]:
    rows = [[name, p.count, p.mean, p.p50, p.p90, p.p95, p.p99] for name, p in stages.items()]
    rows.append(["end_to_end", e2e.count, e2e.mean, e2e.p50, e2e.p90, e2e.p95, e2e.p99])
    return rows


def _model_row(m: ModelStats) -> list[object]:
    sizes = ", ".join(f"{k}x{v}" for k, v in sorted(m.batch_sizes.items(), reverse=True))
    return [m.name, m.requests, m.errors, m.batches, m.mean_batch_size, m.throughput, sizes]


_SEQUENCE_HEADERS = [
    "sequences",
    "steps",
    "steps/s",
    "step batches",
    "rows per step",
    "live mean",
    "live max",
    "queue/step p50 ms",
    "p90 ms",
]


def _sequence_row(m: ModelStats) -> list[object]:
    q = m.sequences
    assert q is not None
    return [m.name, q.steps, q.steps_per_s, q.step_batches, q.rows_per_step, q.live_mean,
            q.live_max, q.queue_ms.p50, q.queue_ms.p90]  # fmt: skip


def utilisation_table(u: Utilisation, models: Sequence[str]) -> list[str]:
    """Each worker's busy / starved / idle share of the run and its batches, the host pool,
    the models' padding, and what bounds the run."""
    rows = [
        [w.worker, f"{w.busy:.0%}", f"{w.starved:.0%}", f"{max(0.0, 1 - w.busy - w.starved):.0%}",
         w.batches, w.mean_batch]
        for w in u.workers
    ]  # fmt: skip
    headers = ["worker", "busy", "starved", "idle", "batches", "mean batch"]
    lines = [render(headers, rows)]
    timed = [w.worker for w in u.workers if w.device]
    if timed:
        lines.append(f"busy of {', '.join(timed)}: device time from the stream timeline")
    if u.host_steps:
        threads = u.host_workers or "the caller's"
        lines.append(f"host steps: {u.host_steps} on {threads} thread(s), busy {u.host_busy:.0%}")
    padded = ", ".join(f"{m} {u.padding[m]:.1%}" for m in models if m in u.padding)
    if padded:
        lines.append(f"padding (share of input elements run): {padded}")
    lines.append(f"bound by: {u.bound()} (the busiest of the host pool and the models)")
    return lines


def format_report(report: BenchReport) -> str:
    """The report as `inferchain bench` prints it."""
    s = report.stats
    what = "items through the pipeline" if report.source == "pipeline" else "requests per model"
    head = f"{report.recipe} on {report.backend}: {report.requested} {what}"
    lines = [f"{head} in {report.wall_s:.2f}s"]
    if report.items is not None:
        i = report.items
        lines.append(
            f"pipeline items: {i.items} ({i.errors} failed), {i.throughput:.1f} items/s; "
            f"latency per item (ms) {_percentiles(i.latency_ms)}"
        )
    lines.append(
        f"model requests: {s.requests} (all models), {s.throughput:.1f} requests/s; "
        f"latency per request (ms) {_percentiles(s.latency_ms)}"
    )
    lines.append(
        f"  of it waiting (queue + batch_wait + worker_wait) {_percentiles(report.waiting_ms)}"
    )
    lines.append(
        f"  and service (execute)                           {_percentiles(report.service_ms)}"
    )
    for model, shapes in report.inputs.items():
        described = ", ".join(f"{k}{v}" for k, v in shapes.items())
        fed = report.in_flight.get(model)
        rate = f"; at most {fed} in flight (--in-flight)" if fed else ""
        lines.append(f"synthetic inputs of {model}: {described}{rate}")
        if model in report.shape_notes:
            lines.append(f"  ({report.shape_notes[model]})")
    headers = ["model", "done", "errors", "batches", "mean batch", "items/s", "batch sizes"]
    lines += ["", render(headers, [_model_row(m) for m in s.models.values()])]
    sequences = [m for m in s.models.values() if m.sequences is not None]
    if sequences:
        lines += ["", render(_SEQUENCE_HEADERS, [_sequence_row(m) for m in sequences])]
    if s.utilisation is not None and s.utilisation.workers:
        lines += ["", *utilisation_table(s.utilisation, list(s.models))]
    stage_headers = ["stage (ms)", "count", "mean", "p50", "p90", "p95", "p99"]
    lines += ["", render(stage_headers, _stage_rows(dict(s.stages), s.latency_ms))]
    if len(s.models) > 1:
        for m in s.models.values():
            lines += ["", f"{m.name}:"]
            lines.append(render(stage_headers, _stage_rows(dict(m.stages), m.latency_ms), "  "))
    return "\n".join(lines)
