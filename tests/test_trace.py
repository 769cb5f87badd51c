"""Chrome/Perfetto traces: one named track per worker, one slice per batch, no overlaps."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import inferchain as ic
from inferchain.metrics import BatchTiming
from inferchain.tools.bench import bench
from inferchain.tools.trace import chrome_trace, write_trace


def timing(
    worker: str, picked: float, end: float, *, size: int = 2, ok: bool = True
) -> BatchTiming:
    return BatchTiming(
        model=worker.partition("#")[0],
        worker=worker,
        size=size,
        shape_key=((64,),),
        ok=ok,
        picked=picked,
        run_start=picked + (end - picked) / 4,
        run_end=end - (end - picked) / 4,
        end=end,
    )


def slices(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def track_names(trace: dict[str, Any]) -> dict[int, str]:
    events = trace["traceEvents"]
    return {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}


def assert_no_overlap(trace: dict[str, Any]) -> None:
    by_track: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for s in slices(trace):
        by_track[s["tid"]].append((s["ts"], s["ts"] + s["dur"]))
    for spans in by_track.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end


def test_a_real_run_gives_one_track_per_worker_and_one_slice_per_batch(
    mlp_path: Path, tmp_path: Path
) -> None:
    recipe = ic.Recipe.from_dict(
        {
            "name": "t",
            "session_options": {"intra_op_num_threads": 1},
            "models": [{"name": "m", "path": str(mlp_path), "instances": 3, "max_batch_size": 4}],
        }
    )
    with ic.OfflineInference(recipe) as oi:
        report = bench(oi, requests=400)
    path = write_trace(tmp_path / "trace.json", report.timeline, workers=report.workers)
    trace = json.loads(path.read_text())
    assert sorted(track_names(trace).values()) == ["m#0", "m#1", "m#2"]
    batches = slices(trace)
    assert len(batches) == report.stats.batches == len(report.timeline)
    assert sum(s["args"]["batch_size"] for s in batches) == 400
    assert all(s["args"]["model"] == "m" and s["args"]["shape"] == [[64]] for s in batches)
    assert {s["tid"] for s in batches} <= set(track_names(trace))
    assert_no_overlap(trace)


def test_tracks_are_named_sorted_and_include_idle_workers() -> None:
    timeline = [timing("det#10", 1.0, 1.5), timing("det#2", 1.1, 1.2), timing("cls#0", 1.2, 1.3)]
    trace = chrome_trace(timeline, process="ocr", workers=["det#0", "det#2", "det#10", "cls#0"])
    names = track_names(trace)
    assert [names[t] for t in sorted(names)] == ["cls#0", "det#0", "det#2", "det#10"]
    process = [e for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert process[0]["args"]["name"] == "ocr"
    assert len(slices(trace)) == 3


def test_slices_are_microseconds_from_the_first_batch_with_their_args() -> None:
    stages = {"h2d": 0.001, "compute": 0.002, "d2h": 0.0005}
    first = timing("m#0", 10.0, 10.004)
    second = BatchTiming("m", "m#0", 1, ((3, 8),), False, 10.004, 10.005, 10.006, 10.007, stages)
    trace = chrome_trace([second, first])
    one, two = slices(trace)
    assert one["ts"] == 0 and one["dur"] == 4000
    assert one["cat"] == "batch" and two["cat"] == "batch,error"
    assert two["args"]["h2d_ms"] == 1.0 and two["args"]["shape"] == [[3, 8]]
    assert two["args"]["run_ms"] == 1.0
    assert_no_overlap(trace)


def test_back_to_back_batches_never_overlap_after_rounding() -> None:
    edges = [1.0 + i * 0.0012345678 for i in range(50)]
    timeline = [timing("m#0", a, b) for a, b in itertools.pairwise(edges)]
    assert_no_overlap(chrome_trace(timeline))


def test_an_empty_timeline_is_a_valid_trace() -> None:
    trace = chrome_trace([], workers=["m#0"])
    assert json.loads(json.dumps(trace))["traceEvents"]
    assert slices(trace) == [] and list(track_names(trace).values()) == ["m#0"]
