"""Shape strategies side by side on the OCR recognizer's real crops, whose widths vary.

The crops are the text lines the OCR recipe finds on its sample pages, each resized to the
recognizer's height (48) at its own width (a multiple of 8). They run through the rec model
alone (one 1-thread instance, batches of up to 8) with each `shapes:` strategy:

- dynamic: only crops of the same width share a batch (nothing padded);
- buckets: four uniform widths up to the widest crop (every crop padded up to its bucket);
- auto: four buckets derived from the first crops (`sample`), minimising padding;
- longest: any crops share a batch, padded to its widest.

Reported per strategy: crops/s, mean batch, and the share of input elements run that were
padding (`oi.stats().utilisation.padding`). Texts are not compared: padding changes what
this model reads (which is why the OCR recipe keeps `dynamic`).
Run: `python benchmarks/bench_padding.py [--quick]`; writes benchmarks/results/
bench_padding.json (a quick run: out/benchmarks/).
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from common import interleave, median, table, write_results

import inferchain as ic
from inferchain.images import RAPIDOCR, read_image

OCR = Path(__file__).resolve().parent.parent / "recipes" / "ocr"
HEIGHT, STEP, BATCH = 48, 8, 8


def crops() -> list[np.ndarray]:
    """Each rec input of the sample pages at its own width (3, 48, W), W a multiple of 8."""
    found: list[np.ndarray] = []
    with ic.OfflineInference(ic.load_recipe(OCR)) as oi:
        pipeline: Any = oi.pipeline
        line_input = ic.import_recipe_module(OCR).line_input
        padded_as_the_recipe_does = pipeline.rec_inputs

        def at_own_width(lines: list[np.ndarray]) -> list[np.ndarray]:
            for crop in lines:
                h, w = crop.shape[:2]
                width = -(-math.ceil(HEIGHT * w / h) // STEP) * STEP
                found.append(line_input(crop, HEIGHT, width, width))
            return padded_as_the_recipe_does(lines)  # type: ignore[no-any-return]

        pipeline.rec_inputs = at_own_width
        list(oi.run(read_image(p, RAPIDOCR) for p in sorted((OCR / "samples").glob("*.png"))))
    return found


def recipe(shapes: dict[str, Any]) -> ic.Recipe:
    rec = next(m for m in ic.load_recipe(OCR).models if m.name == "rec")
    return ic.Recipe.from_dict(
        {
            "name": "padding",
            "session_options": {"intra_op_num_threads": 1, "inter_op_num_threads": 1},
            "models": [
                {
                    "name": "rec",
                    "path": rec.path,
                    "max_batch_size": BATCH,
                    "max_queue_delay_ms": 50,
                    "batching": "wait",
                    "warmup": False,
                    "shapes": shapes,
                }
            ],
        }
    )


def strategies(items: list[np.ndarray]) -> dict[str, dict[str, Any]]:
    widest = max(x.shape[2] for x in items)
    step = -(-widest // (4 * STEP)) * STEP
    uniform = [[3, HEIGHT, step * k] for k in range(1, 5)]
    return {
        "dynamic": {"strategy": "dynamic"},
        "buckets": {"strategy": "buckets", "buckets": uniform},
        "auto": {"strategy": "auto", "num_buckets": 4, "sample": min(64, len(items))},
        "longest": {"strategy": "longest"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="24 crops, 1 round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    items = crops()
    rounds = args.rounds
    if args.quick:
        items, rounds = items[:24], 1
    widths = sorted({x.shape[2] for x in items})
    sessions = {
        name: ic.OfflineInference(recipe(s)).init() for name, s in strategies(items).items()
    }
    try:

        def side(oi: ic.OfflineInference) -> Any:
            def run() -> float:
                started = time.perf_counter()
                for r in oi.submit_many("rec", items):
                    r.result()
                return time.perf_counter() - started

            return run

        s = interleave({name: side(oi) for name, oi in sessions.items()}, rounds)
        figures = {}
        for name, oi in sessions.items():
            stats = oi.stats()
            assert stats.utilisation is not None
            figures[name] = {
                "seconds": median(s[name]),
                "crops_per_s": len(items) / median(s[name]),
                "mean_batch": stats.models["rec"].mean_batch_size,
                "padding": stats.utilisation.padding["rec"],
            }
    finally:
        for oi in sessions.values():
            oi.close()
    rows = [("strategy", "crops/s", "mean batch", "padding", "vs dynamic")]
    for name, f in figures.items():
        speed = figures["dynamic"]["seconds"] / f["seconds"]
        rows.append((name, f"{f['crops_per_s']:.1f}", f"{f['mean_batch']:.2f}",
                     f"{f['padding']:.1%}", f"{speed:.2f}x"))  # fmt: skip
    print(f"{len(items)} crops, {len(widths)} widths ({widths[0]}-{widths[-1]}), {rounds} rounds")
    print(table(rows))
    path = write_results(
        "bench_padding",
        {"quick": args.quick, "crops": len(items), "widths": widths, "strategies": figures},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
