"""B6 of BENCHMARKS.md: 1M tiny items streamed through `map` keep memory flat.

- RSS growth after warm-up while 1M items of the tiny MLP stream through `oi.map` (target
  < 5 %), with the RSS of the hand-batched loop over the same items as the baseline;
- device allocations per batch in the steady state on the acl backend (FakeAcl; target 0).

Run: `python benchmarks/bench_memory.py [--quick]`; writes benchmarks/results/bench_memory.json.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import structlog
from common import table, write_results

import inferchain as ic
from inferchain.config import Recipe
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_mlp64
from inferchain.testing.soak import rss_bytes


def items(n: int) -> Iterator[np.ndarray]:
    rng = np.random.default_rng(0)
    block = rng.standard_normal((1024, 64)).astype(np.float32)
    for i in range(n):
        yield block[i % 1024]


def recipe(path: Path, backend: str = "onnxruntime") -> Recipe:
    return Recipe.from_dict(
        {
            "name": "b6",
            "backend": backend,
            "session_options": {"intra_op_num_threads": 1},
            "models": [{"name": "m", "path": str(path), "max_batch_size": 64}],
        }
    )


def stream(oi: ic.OfflineInference, n: int, warmup: int) -> dict[str, float]:
    it = oi.map("m", items(n))
    for _ in range(warmup):
        next(it)
    start = rss_bytes()
    peak = start
    started = time.perf_counter()
    for k, _ in enumerate(it):
        if k % 50_000 == 0:
            peak = max(peak, rss_bytes())
    end = rss_bytes()
    return {
        "rss_start_mb": start / 2**20,
        "rss_end_mb": end / 2**20,
        "rss_peak_mb": max(peak, end) / 2**20,
        "growth": max(peak, end) / start - 1.0,
        "items_per_s": (n - warmup) / (time.perf_counter() - started),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    n = 50_000 if args.quick else 1_000_000
    warmup = n // 10
    with tempfile.TemporaryDirectory() as tmp:
        path = write_mlp64(Path(tmp) / "m.onnx")
        with ic.OfflineInference(recipe(path)) as oi:
            ort = stream(oi, n, warmup)
        fake = FakeAcl(static_batch=64)
        with ic.OfflineInference(recipe(path, "acl"), acl_module=fake) as oi:
            list(oi.map("m", items(2_000)))
            mallocs, batches = fake.call_count("rt.malloc"), oi.stats().models["m"].batches
            list(oi.map("m", items(n // 10)))
            steady_batches = oi.stats().models["m"].batches - batches
            per_batch = (fake.call_count("rt.malloc") - mallocs) / max(steady_batches, 1)
    print(
        table(
            [
                ("measure", "value", "target"),
                (f"RSS growth, {n:,} items via map", f"{ort['growth']:+.2%}", "< 5 %"),
                (
                    "RSS after warm-up / end (MB)",
                    f"{ort['rss_start_mb']:.1f} / {ort['rss_end_mb']:.1f}",
                    "",
                ),
                ("items/s while streaming", f"{ort['items_per_s']:,.0f}", ""),
                (f"acl mallocs per batch ({steady_batches} batches)", f"{per_batch:g}", "0"),
            ]
        )
    )
    path_out = write_results(
        "bench_memory",
        {
            "quick": args.quick,
            "items": n,
            "onnxruntime": ort,
            "acl": {"steady_batches": steady_batches, "mallocs_per_batch": per_batch},
        },
    )
    print(f"wrote {path_out}")


if __name__ == "__main__":
    main()
