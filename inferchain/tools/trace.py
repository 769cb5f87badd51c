"""Timeline traces: the batches each worker ran, as Chrome/Perfetto trace-event JSON.

`{"traceEvents": [...]}` with one track (tid) per worker, named by metadata events, and one
complete ("ph": "X") slice per batch, from a worker taking the batch to its outputs being
delivered; where the backend times its device (acl), one track per worker and stream with
a slice per model run as the device's own timeline saw it; then one track per host thread
of a pipeline with a slice per host step (an item's pre- or post-processing), so a worker's
gaps can be read against the host work that fed it. Open it at ui.perfetto.dev or
chrome://tracing. Times are microseconds from the first batch or host step (or `origin`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from inferchain.metrics import BatchTiming
from inferchain.utilisation import HostStep, worker_order

PID = 1


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _complete(
    name: str, cat: str, tid: int, start_s: float, end_s: float, args: dict[str, Any]
) -> dict[str, Any]:
    """A complete ("X") event from `start_s` to `end_s` (seconds after the trace's origin);
    each end is rounded alone, so that slices on a track never overlap."""
    start = _us(start_s)
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "pid": PID,
        "tid": tid,
        "ts": start,
        "dur": max(_us(end_s) - start, 0.0),
        "args": args,
    }


def _slice(batch: BatchTiming, tid: int, origin: float) -> dict[str, Any]:
    args: dict[str, Any] = {
        "model": batch.model,
        "worker": batch.worker,
        "batch_size": batch.size,
        "shape": [list(s) for s in batch.shape_key],
        "ok": batch.ok,
        "stack_ms": round((batch.run_start - batch.picked) * 1e3, 3),
        "run_ms": round((batch.run_end - batch.run_start) * 1e3, 3),
        "deliver_ms": round((batch.end - batch.run_end) * 1e3, 3),
    }
    args.update({f"{k}_ms": round(v * 1e3, 3) for k, v in batch.stages.items()})
    steps = ""
    if batch.steps:  # a step batch of a stateful model's sequences
        args["steps"] = batch.steps
        steps = f" ({batch.steps} steps)" if batch.steps != batch.size else " steps"
    name = f"{batch.model} x{batch.size}{steps}" + ("" if batch.ok else " (failed)")
    cat = "batch" if batch.ok else "batch,error"
    return _complete(name, cat, tid, batch.picked - origin, batch.end - origin, args)


def _metadata(name: str, tid: int, value: object, key: str = "name") -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": PID, "tid": tid, "args": {key: value}}


def chrome_trace(
    timeline: Iterable[BatchTiming],
    *,
    process: str = "inferchain",
    workers: Sequence[str] = (),
    origin: float | None = None,
    host: Iterable[HostStep] = (),
) -> dict[str, Any]:
    """The trace of `timeline` and the `host` steps; `workers` adds tracks for workers that
    ran no batch."""
    batches = sorted(timeline, key=lambda b: b.picked)
    steps = sorted(host, key=lambda h: h.start)
    names = sorted({*workers, *(b.worker for b in batches)}, key=worker_order)
    devices = sorted({(b.worker, b.stream) for b in batches if b.device})
    on_device = {key: f"{key[0]} device (stream {key[1]})" for key in devices}
    names = [n for name in names for n in (name, *(on_device[k] for k in devices if k[0] == name))]
    threads = sorted({f"host {h.thread}" for h in steps})
    tids = {name: i + 1 for i, name in enumerate([*names, *threads])}
    if origin is None:
        starts = [b.picked for b in batches[:1]] + [h.start for h in steps[:1]]
        origin = min(starts) if starts else 0.0
    events = [_metadata("process_name", 0, process)]
    for name, tid in tids.items():
        events.append(_metadata("thread_name", tid, name))
        events.append(_metadata("thread_sort_index", tid, tid, key="sort_index"))
    events.extend(_slice(b, tids[b.worker], origin) for b in batches)
    for b in batches:
        if b.device:
            tid = tids[on_device[(b.worker, b.stream)]]
            events.extend(_device_slice(b, span, tid, origin) for span in b.device)
    events.extend(_host_slice(h, tids[f"host {h.thread}"], origin) for h in steps)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _device_slice(
    batch: BatchTiming, span: tuple[float, float], tid: int, origin: float
) -> dict[str, Any]:
    args = {"worker": batch.worker, "stream": batch.stream, "batch_size": batch.size}
    name = f"{batch.model} x{batch.size} on the device"
    return _complete(name, "device", tid, span[0] - origin, span[1] - origin, args)


def _host_slice(step: HostStep, tid: int, origin: float) -> dict[str, Any]:
    args = {"item": step.index}
    return _complete(
        f"item {step.index}", "host", tid, step.start - origin, step.end - origin, args
    )


def write_trace(
    path: str | Path,
    timeline: Iterable[BatchTiming],
    *,
    process: str = "inferchain",
    workers: Sequence[str] = (),
    host: Iterable[HostStep] = (),
) -> Path:
    """Write `chrome_trace(...)` to `path` as JSON; returns the path."""
    out = Path(path)
    trace = chrome_trace(timeline, process=process, workers=workers, host=host)
    out.write_text(json.dumps(trace, separators=(",", ":")), encoding="utf-8")
    return out
