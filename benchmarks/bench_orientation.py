"""B11 of BENCHMARKS.md: the orientation recipe's own pipeline against a hand-written script.

The script is what a competent user writes instead (15 lines): the recipe's own `preprocess`
on a 2-thread `ThreadPoolExecutor`, full batches of 16 to an onnxruntime session with the
recipe's session options. Two pairs, each interleaved (A B A B ...) after a warm-up round:

B11a  `oi.run(images)` vs the script over the same decoded images    target >= 1.0x, mean
      batch >= 12 of 16
B11b  `inferchain run`'s loop over files (`run_job.Job`, start-up not counted) vs the script
      reading the same files itself (cv2.imread in its pool)         target >= 0.9x

A third script, for reference, runs the same 15 lines with the session's thread setting
that suits a lone script best here (2 intra-op threads that do not spin: `--reference-threads`),
whatever the recipe says: `oi.run` against it is reported too (`B11a_vs_tuned`), no target.

B13: the same `oi.run(images)` with the recipe `deterministic: true` (`run --deterministic`:
every batch at 16 rows, padded), in the same rounds: its throughput ratio to `oi.run`
(`B13_deterministic_vs_run`) and whether its results are the default's.

The OpenVINO sides: the same `oi.run(images)` with the recipe on `backend: openvino` at f32
(target >= 1.05x the onnxruntime recipe, angles identical) and at bf16 where this CPU runs it
(target >= 1.4x, the recipe's precision check at init passing on its reference pages); and
the raw-model ceiling of each runtime: the model alone on the pages pre-processed, batches
of 16 on two bare one-thread sessions (one per core).

The ceiling (`ceilings.py`), timed in the same rounds: the recipe's own pre-processing of
every page on one thread (from the decoded images; for the files side, from the files,
decode included) plus the model on the pre-processed pages in full batches of 16 on a bare
one-thread session, over the machine's cores. `oi.run` and `inferchain run` print their
fraction of it.

Pages: the recipe's 12 samples, each at 20 scales (0.6x to 1.3x), so every page costs its
own resize. Angles must be identical on both sides.
Run: `python benchmarks/bench_orientation.py [--quick]`; writes benchmarks/results/
bench_orientation.json (a quick run: out/benchmarks/).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort
import structlog
from ceilings import bare_session, cores, cpu_bound, fraction, host_seconds, model_seconds
from common import interleave, median, table, timed, write_results
from openvino_sides import openvino_recipes, precisions, raw_ceiling

import inferchain as ic
from inferchain.backends.onnxruntime import session_options
from inferchain.cli.run_job import Job
from inferchain.cli.tally import Tally
from inferchain.config import deterministic
from inferchain.images import RAPIDOCR, read_image
from inferchain.results import ResultsFile
from inferchain.sources import Item
from inferchain.tools.progress import Progress

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "orientation"
BATCH = 16


def pages(n: int) -> list[np.ndarray]:
    samples = [read_image(p, RAPIDOCR) for p in sorted((RECIPE / "samples").glob("*.png"))]
    out = []
    for i in range(n):
        image = samples[i % len(samples)]
        scale = 0.6 + 0.7 * ((i // len(samples)) % 20) / 19
        h, w = image.shape[:2]
        out.append(cv2.resize(image, (round(w * scale), round(h * scale))))
    return out


def script(
    preprocess: Callable[[np.ndarray], np.ndarray],
    labels: Sequence[str],
    recipe: ic.Recipe,
) -> Callable[[Sequence[Any], Callable[[Any], np.ndarray]], list[int]]:
    """The hand-written pipeline: a 2-thread pool for pre-processing, full batches."""
    model = recipe.models[0]
    sess = ort.InferenceSession(
        model.path, session_options(recipe.session_options), providers=["CPUExecutionProvider"]
    )
    name = sess.get_inputs()[0].name

    def run(items: Sequence[Any], read: Callable[[Any], np.ndarray]) -> list[int]:
        angles: list[int] = []
        with ThreadPoolExecutor(2) as pool:
            tensors = pool.map(lambda item: preprocess(read(item)), items)
            batch: list[np.ndarray] = []
            for tensor in tensors:
                batch.append(tensor)
                if len(batch) == BATCH:
                    angles += _angles(sess.run(None, {name: np.stack(batch)})[0], labels)
                    batch = []
            if batch:
                angles += _angles(sess.run(None, {name: np.stack(batch)})[0], labels)
        return angles

    return run


def _angles(scores: np.ndarray, labels: Sequence[str]) -> list[int]:
    return [int(labels[i]) for i in np.argmax(scores, axis=1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="48 pages, 1 round")
    parser.add_argument("--pages", type=int, default=240)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reference-threads", type=int, default=2)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    n, rounds = (48, 1) if args.quick else (args.pages, args.rounds)
    images = pages(n)
    recipe = ic.load_recipe(RECIPE)
    angles: dict[str, list[int]] = {}
    results: dict[str, list[Any]] = {}  # the recipe's whole results: default, deterministic
    batches: dict[str, list[float]] = {"run": [], "run_files": []}
    wanted, why_not = precisions(recipe)
    with (
        tempfile.TemporaryDirectory() as tmp,
        ic.OfflineInference(recipe) as oi,
        ic.OfflineInference(deterministic(recipe)) as det,
        contextlib.ExitStack() as stack,
    ):
        ov = openvino_recipes(RECIPE, stack, wanted)
        folder = Path(tmp)
        files = []
        for i, image in enumerate(images):
            files.append(folder / f"page{i:04d}.png")
            cv2.imwrite(str(files[-1]), image)
        items = [Item(f, None, "") for f in files]
        pipeline = oi.pipeline
        by_hand = script(pipeline.preprocess, pipeline.labels, recipe)  # type: ignore[attr-defined]
        tuned = ic.load_recipe(
            RECIPE,
            session_options={
                "intra_op_num_threads": args.reference_threads,
                "allow_spinning": False,
            },
        )
        by_hand_tuned = script(pipeline.preprocess, pipeline.labels, tuned)  # type: ignore[attr-defined]

        def mean_batch(side: str, before: dict[int, int]) -> None:
            after = oi.stats().models["orientation"].batch_sizes
            counts = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            total = sum(counts.values())
            batches[side].append(sum(k * v for k, v in counts.items()) / total)

        def side_run() -> None:
            before = dict(oi.stats().models["orientation"].batch_sizes)
            results["run"] = list(oi.run(images))
            angles["run"] = [r["angle"] for r in results["run"]]
            mean_batch("run", before)

        def side_deterministic() -> None:
            results["deterministic"] = list(det.run(images))

        def side_files() -> None:
            before = dict(oi.stats().models["orientation"].batch_sizes)
            out = folder / "out"
            out.mkdir(exist_ok=True)
            with (
                ResultsFile(out, "overwrite") as results,
                Progress(None, "", summary=False) as p,
                contextlib.redirect_stdout(io.StringIO()),  # its line per file
            ):
                Job(oi, items, results, out, p, Tally()).run(range(len(items)))
            mean_batch("run_files", before)

        def script_images() -> None:
            angles["script"] = by_hand(images, lambda image: image)

        def script_tuned() -> None:
            angles["script_tuned"] = by_hand_tuned(images, lambda image: image)

        def script_files() -> None:
            angles["script_files"] = by_hand(files, lambda path: cv2.imread(str(path)))

        def side_openvino(p: str) -> Callable[[], None]:
            def run() -> None:
                angles[f"openvino_{p}"] = [r["angle"] for r in ov[p].run(images)]

            return run

        tensors = np.stack([pipeline.preprocess(image) for image in images])  # type: ignore[attr-defined]
        raw = raw_ceiling(recipe.models[0], tensors, BATCH, wanted)
        ncores = cores()
        bare = bare_session(recipe.models[0].path)
        feed_name = bare.get_inputs()[0].name
        feeds = [{feed_name: tensors[i : i + BATCH]} for i in range(0, n, BATCH)]
        preprocess = pipeline.preprocess  # type: ignore[attr-defined]
        s = interleave(
            {
                "script": timed(script_images),
                "run": timed(side_run),
                "deterministic": timed(side_deterministic),
                **{f"openvino_{p}": timed(side_openvino(p)) for p in wanted},
                "script_tuned": timed(script_tuned),
                "script_files": timed(script_files),
                "run_files": timed(side_files),
                **{f"raw {name}": side for name, side in raw.items()},
                "ceiling_model": model_seconds(bare, feeds),
                "ceiling_host": host_seconds(preprocess, images),
                "ceiling_host_files": host_seconds(preprocess, files),
            },
            rounds,
        )
        workers = oi.stats().to_dict()
    identical = (
        angles["run"] == angles["script"] == angles["script_files"] == angles["script_tuned"]
    )
    identical = identical and all(angles[f"openvino_{p}"] == angles["run"] for p in wanted)

    def ratio(base: str, side: str) -> float:
        return median([b / f for b, f in zip(s[base], s[side], strict=True)])

    ceiling = cpu_bound([s["ceiling_model"], s["ceiling_host"]], ncores)
    ceiling_files = cpu_bound([s["ceiling_model"], s["ceiling_host_files"]], ncores)

    figures = {
        "B11a": ratio("script", "run"),
        "B11a_mean_batch": median(batches["run"][-rounds:]),
        "B11a_vs_tuned": ratio("script_tuned", "run"),
        "B13_deterministic_vs_run": ratio("run", "deterministic"),
        "B11b": ratio("script_files", "run_files"),
        "B11b_mean_batch": median(batches["run_files"][-rounds:]),
        **{f"openvino_{p}_vs_run": ratio("run", f"openvino_{p}") for p in wanted},
        **{f"raw_{n}_vs_onnxruntime": ratio("raw onnxruntime", f"raw {n}") for n in raw},
        "B11a_of_ceiling": fraction(ceiling, s["run"]),
        "B11b_of_ceiling": fraction(ceiling_files, s["run_files"]),
        "script_tuned_of_ceiling": fraction(ceiling, s["script_tuned"]),
    }
    rows = [
        ("side", "seconds", "pages/s", "vs script", "mean batch"),
        ("script (2-thread pool, batches of 16)", f"{median(s['script']):.3f}",
         f"{n / median(s['script']):.1f}", "1.00", "16"),
        ("oi.run(images)", f"{median(s['run']):.3f}", f"{n / median(s['run']):.1f}",
         f"{figures['B11a']:.2f}", f"{figures['B11a_mean_batch']:.1f}"),
        (f"script, {args.reference_threads} intra-op threads, no spinning (reference)",
         f"{median(s['script_tuned']):.3f}", f"{n / median(s['script_tuned']):.1f}",
         f"{ratio('script', 'script_tuned'):.2f}", "16"),
        ("oi.run vs that reference", "", "", f"{figures['B11a_vs_tuned']:.2f}", ""),
        ("oi.run, deterministic: true", f"{median(s['deterministic']):.3f}",
         f"{n / median(s['deterministic']):.1f}",
         f"vs oi.run: {figures['B13_deterministic_vs_run']:.2f}", "16"),
        ("script reading the files", f"{median(s['script_files']):.3f}",
         f"{n / median(s['script_files']):.1f}", "1.00", "16"),
        ("inferchain run's loop (run_files)", f"{median(s['run_files']):.3f}",
         f"{n / median(s['run_files']):.1f}", f"{figures['B11b']:.2f}",
         f"{figures['B11b_mean_batch']:.1f}"),
    ]  # fmt: skip
    for p in wanted:
        sec = median(s[f"openvino_{p}"])
        vs = f"vs oi.run: {figures[f'openvino_{p}_vs_run']:.2f}"
        rows.append((f"oi.run on backend openvino, {p}", f"{sec:.3f}", f"{n / sec:.1f}", "", vs))
    for name in raw:
        sec = median(s[f"raw {name}"])
        vs = f"vs onnxruntime: {figures[f'raw_{name}_vs_onnxruntime']:.2f}"
        rows.append((f"raw model, {name} (2 bare 1-thread sessions)", f"{sec:.3f}",
                     f"{n / sec:.1f}", "", vs))  # fmt: skip
    for label, secs, share in (
        (f"ceiling, decoded images (host + model, over {ncores} cores)", ceiling,
         "B11a_of_ceiling"),
        (f"ceiling, files (decode, host + model, over {ncores} cores)", ceiling_files,
         "B11b_of_ceiling"),
    ):  # fmt: skip
        sec = median(secs)
        rows.append((label, f"{sec:.3f}", f"{n / sec:.1f}", "", f"side at {figures[share]:.0%}"))
    print(
        f"{n} pages, {rounds} rounds (medians of per-round ratios); angles identical: {identical}"
    )
    if why_not:
        print(f"not run: {why_not}")
    print(table(rows))
    path = write_results(
        "bench_orientation",
        {
            "quick": args.quick,
            "pages": n,
            "rounds": rounds,
            "seconds": {k: median(v) for k, v in s.items()},
            "ceiling_s": {"images": median(ceiling), "files": median(ceiling_files)},
            "cores": ncores,
            "samples_s": s,
            "mean_batch": batches,
            "figures": figures,
            "identical": identical,
            "deterministic": {
                "throughput_ratio": figures["B13_deterministic_vs_run"],
                "identical_to_default": results["deterministic"] == results["run"],
            },
            "stats": workers,
            "targets": {
                "B11a": ">= 1.0, mean batch >= 12",
                "B11b": ">= 0.9",
                "B11a_of_ceiling": ">= 0.9",
                "openvino_f32_vs_run": ">= 1.05, angles identical",
                "openvino_bf16_vs_run": ">= 1.4, the precision check passing",
            },
            "not_run": why_not,
        },
    )
    print(f"wrote {path}")
    if not identical:
        raise SystemExit("the angles differ between the sides")


if __name__ == "__main__":
    main()
