"""B12 of BENCHMARKS.md: a pipeline with host pre-processing keeps an acl device busy.

The orientation recipe (its own pre-processing on the host pool, `batching: wait`) runs on
`backend: acl` through FakeAcl's device time model, with compute made slower than the host
work (`compute_scale`, calibrated in the same run so that a batch's device compute takes
at least 1.5x what the host threads need to prepare the next batch, and at least twice the
fake's own compute, which runs on this machine's CPU as a card's would not): the device is
the bottleneck.
The figure is the device's busy share of the run: the union of FakeAcl's device slices
(copies and compute, every stream) over the run's wall time. Target >= 90 %.

Angles must be those of the same recipe on onnxruntime.
Run: `python benchmarks/bench_acl_pipeline.py [--quick]`; writes
benchmarks/results/bench_acl_pipeline.json (a quick run: out/benchmarks/).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path

import structlog
from bench_orientation import pages
from common import median, table, write_results

import inferchain as ic
from inferchain.testing.fake_acl import FakeAcl, Slice

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "orientation"
BATCH = 16


def busy_share(slices: list[Slice], start: float, end: float) -> float:
    """The union of `slices` inside [start, end] over end - start."""
    spans = sorted((max(s.start, start), min(s.end, end)) for s in slices if s.end > start)
    busy, reach = 0.0, start
    for a, b in spans:
        if b <= reach:
            continue
        busy += b - max(a, reach)
        reach = b
    return busy / (end - start) if end > start else 0.0


def calibrate(images: list, recipe: ic.Recipe) -> tuple[float, float, float]:
    """(host seconds to prepare one batch on the pool, device compute seconds of one batch
    at scale 1, the compute_scale that makes the device 1.5x slower than the host)."""
    fake = FakeAcl(static_batch=BATCH)
    with ic.OfflineInference(recipe, acl_module=fake) as oi:
        pipeline = oi.pipeline
        workers = max(1, oi.recipe.host_workers or 2)
        started = time.perf_counter()
        for image in images[: 2 * BATCH]:
            pipeline.preprocess(image)  # type: ignore[attr-defined]
        per_page = (time.perf_counter() - started) / (2 * BATCH)
        list(oi.run(images[: 2 * BATCH]))
        compute = statistics.median(s.end - s.start for s in fake.slices if s.kind == "compute")
    host = per_page * BATCH / workers
    # FakeAcl computes on this machine's CPU, which a card does not: at least half of the
    # simulated device time is a wait (compute_scale >= 2), leaving the cores to the host
    return host, compute, max(2.0, 1.5 * host / compute)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="64 pages, 1 round")
    parser.add_argument("--pages", type=int, default=240)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    n, rounds = (64, 1) if args.quick else (args.pages, args.rounds)
    images = pages(n)
    # one instance: one device whose executions follow each other (its session's two streams
    # overlap the copies); the recipe's second instance is for CPUs
    acl = ic.load_recipe(RECIPE, backend="acl", models={"orientation": {"instances": 1}})
    host_s, compute_s, scale = calibrate(images, acl)
    with ic.OfflineInference(ic.load_recipe(RECIPE)) as oi:
        expected = [r["angle"] for r in oi.run(images)]
    fake = FakeAcl(static_batch=BATCH, compute_scale=scale)
    shares, worker_busy, seconds, batches = [], [], [], []
    identical = True
    with ic.OfflineInference(acl, acl_module=fake) as oi:
        list(oi.run(images[:BATCH]))  # warm
        for _ in range(rounds):
            mark = len(fake.slices)
            started = time.perf_counter()
            angles = [r["angle"] for r in oi.run(images)]
            ended = time.perf_counter()
            identical = identical and angles == expected
            shares.append(busy_share(list(fake.slices[mark:]), started, ended))
            seconds.append(ended - started)
        u = oi.stats().utilisation
        assert u is not None
        worker_busy = [w.busy for w in u.workers]
        batches = [w.mean_batch for w in u.workers]
    figures = {"B12_device_busy": median(shares)}
    rows = [
        ("pages", "host s/batch", "device s/batch (x scale)", "wall s", "device busy", "target"),
        (str(n), f"{host_s:.4f}", f"{compute_s:.4f} x {scale:.2f}", f"{median(seconds):.3f}",
         f"{figures['B12_device_busy']:.1%}", ">= 90 %"),
    ]  # fmt: skip
    print(table(rows))
    print(
        f"worker busy (utilisation) {', '.join(f'{b:.0%}' for b in worker_busy)}; mean batch "
        f"{', '.join(f'{b:.1f}' for b in batches)}; angles identical to onnxruntime: {identical}"
    )
    path = write_results(
        "bench_acl_pipeline",
        {
            "quick": args.quick,
            "pages": n,
            "rounds": rounds,
            "host_s_per_batch": host_s,
            "compute_s_per_batch": compute_s,
            "compute_scale": scale,
            "seconds": seconds,
            "device_busy": shares,
            "worker_busy": worker_busy,
            "figures": figures,
            "identical": identical,
            "target": ">= 0.9",
        },
    )
    print(f"wrote {path}")
    if not identical:
        raise SystemExit("the angles differ from onnxruntime's")


if __name__ == "__main__":
    main()
