"""B4 and B5 of BENCHMARKS.md: the OCR recipe against RapidOCR, and OCR + orientation at once.

B4  OCR recipe (det -> cls -> rec) on the sample pages: images/s vs RapidOCR()   target >= 1.6x
    RapidOCR is called once per page, as its users do, with its own (default) settings; the
    texts of both must be identical. For reference, the ceiling of any schedule of the same
    work here: the recipe's own det, cls and rec tensors of the pages (no host work, no
    dependencies between them) run by bare one-thread sessions, one per core, each job
    placed ahead of time so that every core gets the same model time (`ceiling`).
    The OpenVINO side: the same recipe on `backend: openvino` at f32 (its texts identical to
    RapidOCR's too), against the recipe on onnxruntime; no bf16 side: the OCR recipe states
    no tolerance for it (its texts must stay RapidOCR's).
B5  OCR and the orientation classifier at once, in one process (one recipe, four models)
    vs the same two workloads one after the other on the same OfflineInference  target >= 1.2x

Both sides of each pair run in this process, interleaved (A B A B ...) after a warm-up round.
Run: `python benchmarks/bench_ocr.py [--quick]`; writes benchmarks/results/bench_ocr.json.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import yaml
from common import interleave, median, table, write_results
from openvino_sides import openvino_recipes, precisions

import inferchain as ic
from inferchain.config import import_recipe_module
from inferchain.driver import PipelineDriver
from inferchain.images import RAPIDOCR, read_image
from inferchain.pipeline import load_pipeline

REPO = Path(__file__).resolve().parent.parent
OCR = REPO / "recipes" / "ocr"
ORIENTATION = REPO / "recipes" / "orientation"
MODELS = ("det", "cls", "rec")


def cycle(paths: Iterable[Path], n: int) -> list[np.ndarray]:
    """`n` images read from `paths`, repeating them in order."""
    images = [read_image(p, RAPIDOCR) for p in sorted(paths)]
    return list(itertools.islice(itertools.cycle(images), n))


def texts(results: Iterable[Iterable[Any]]) -> list[list[str]]:
    """The texts per page, from RapidOCR's `[box, text, score]` or our `{"text": ...}` lines."""
    return [[ln["text"] if isinstance(ln, dict) else ln[1] for ln in page] for page in results]


def ratios(slow: list[float], fast: list[float]) -> dict[str, float]:
    """Speed-up per interleaved pair (median) and of the medians."""
    per_pair = [s / f for s, f in zip(slow, fast, strict=True)]
    return {"median_of_pairs": median(per_pair), "of_medians": median(slow) / median(fast)}


# -- B4 -------------------------------------------------------------------------------------


def b4(pages: list[np.ndarray], rounds: int, in_flight: int) -> dict[str, Any]:
    """RapidOCR per page (its defaults, and one thread per session) vs the recipe's `run`."""
    from rapidocr_onnxruntime import RapidOCR

    engines = {
        "rapidocr": RapidOCR(),
        "rapidocr_1thread": RapidOCR(intra_op_num_threads=1, inter_op_num_threads=1),
    }
    outputs: dict[str, list[Any]] = {}
    wanted, why_not = precisions(ic.load_recipe(OCR))
    with ic.OfflineInference(ic.load_recipe(OCR)) as oi, contextlib.ExitStack() as stack:
        ov = openvino_recipes(OCR, stack, wanted)

        def on_openvino(p: str) -> Callable[[], float]:
            def run() -> float:
                started = time.perf_counter()
                outputs[f"openvino_{p}"] = list(ov[p].run(pages, max_in_flight=in_flight))
                return time.perf_counter() - started

            return run

        def baseline(name: str) -> Callable[[], float]:
            def run() -> float:
                started = time.perf_counter()
                outputs[name] = [engines[name](page)[0] or [] for page in pages]
                return time.perf_counter() - started

            return run

        def inferchain() -> float:
            started = time.perf_counter()
            outputs["inferchain"] = list(oi.run(pages, max_in_flight=in_flight))
            return time.perf_counter() - started

        clock = oi.pipeline.clock  # type: ignore[attr-defined]
        inferchain()  # every page shape once, so the breakdown below is the steady state
        bound = ceiling(oi.recipe, capture(oi, pages))
        clock.reset()
        before = oi.stats()
        sides = {name: baseline(name) for name in engines} | {"inferchain": inferchain}
        sides["ceiling"] = bound
        sides |= {f"openvino_{p}": on_openvino(p) for p in wanted}
        samples = interleave(sides, rounds)
        stages = breakdown(before, oi.stats(), clock.seconds, len(pages) * (rounds + 1))
    reference = texts(outputs["rapidocr"])
    return {
        "pages": len(pages),
        "rounds": rounds,
        "max_in_flight": in_flight,
        "seconds": {k: median(v) for k, v in samples.items()},
        "samples_s": samples,
        "images_per_s": {k: len(pages) / median(v) for k, v in samples.items()},
        "speedup": {name: ratios(samples[name], samples["inferchain"]) for name in engines},
        "ceiling": {
            "vs_rapidocr": ratios(samples["rapidocr"], samples["ceiling"]),
            "inferchain_share": ratios(samples["ceiling"], samples["inferchain"]),
        },
        "texts_identical": all(texts(out) == reference for out in outputs.values()),
        "openvino": {
            f"openvino_{p}": {
                "vs_onnxruntime_recipe": ratios(samples["inferchain"], samples[f"openvino_{p}"]),
                "vs_rapidocr": ratios(samples["rapidocr"], samples[f"openvino_{p}"]),
            }
            for p in wanted
        },
        "openvino_not_run": why_not,
        "stages": stages,
        "target": ">= 1.6x",
    }


def capture(oi: ic.OfflineInference, pages: list[np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """The model inputs the recipe's pipeline makes for `pages`: (model, batch) jobs, det one
    page each, cls batches of its max batch, rec one crop each (its cheapest batch here)."""
    ocr = import_recipe_module(OCR)
    p: Any = oi.pipeline
    cls_batch = oi.recipe.model("cls").max_batch_size
    jobs: list[tuple[str, np.ndarray]] = []
    for image in pages:
        page = ocr.prepare_page(image, p.page_settings)
        tensor = ocr.det_input(page.image, p.det_settings, p.det_lut)
        jobs.append(("det", tensor[None]))
        boxes = p.find_boxes(oi.infer("det", tensor), page)
        crops = [ocr.crop_line(page.image, box) for box in boxes]
        _, h, w = p.cls_settings.image_shape
        cls_in = [ocr.line_input(c, h, w, w) for c in crops]
        for i in range(0, len(cls_in), cls_batch):
            jobs.append(("cls", np.stack(cls_in[i : i + cls_batch])))
        upright = p.turn_upright(crops, [oi.infer("cls", x) for x in cls_in])
        jobs += [("rec", x[None]) for x in p.rec_inputs(upright)]
    return jobs


def ceiling(recipe: ic.Recipe, jobs: list[tuple[str, np.ndarray]]) -> Callable[[], float]:
    """Runs `jobs` on one bare one-thread session set per core, balanced by their measured
    single-thread times (longest first onto the least loaded core); returns seconds."""
    import onnxruntime as ort

    from inferchain.backends.onnxruntime import session_options

    options = session_options(recipe.session_options)
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    cores = len(os.sched_getaffinity(0))
    sets = [
        {m.name: ort.InferenceSession(m.path, options, providers=["CPUExecutionProvider"])
         for m in recipe.models}
        for _ in range(cores)
    ]  # fmt: skip
    names = {m: s.get_inputs()[0].name for m, s in sets[0].items()}
    costs = []
    for model, x in jobs:
        sets[0][model].run(None, {names[model]: x})  # warm this shape
        started = time.perf_counter()
        sets[0][model].run(None, {names[model]: x})
        costs.append(time.perf_counter() - started)
    lanes: list[list[tuple[str, np.ndarray]]] = [[] for _ in range(cores)]
    loads = [0.0] * cores
    for i in sorted(range(len(jobs)), key=lambda i: -costs[i]):
        lane = loads.index(min(loads))
        lanes[lane].append(jobs[i])
        loads[lane] += costs[i]

    def lane_run(k: int) -> None:
        for model, x in lanes[k]:
            sets[k][model].run(None, {names[model]: x})

    def run() -> float:
        threads = [threading.Thread(target=lane_run, args=(k,)) for k in range(1, cores)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        lane_run(0)
        for t in threads:
            t.join()
        return time.perf_counter() - started

    return run


def breakdown(
    before: ic.Stats, after: ic.Stats, pre_post_s: dict[str, float], pages: int
) -> dict[str, Any]:
    """Per model: batches and execute time (oi.stats()); pre/post ms per page (measured)."""
    out: dict[str, Any] = {}
    for name in MODELS:
        m, m0 = after.models[name], before.models[name]
        batches = m.batches - m0.batches
        requests = m.requests - m0.requests
        out[name] = {
            "requests_per_page": requests / pages,
            "batches": batches,
            "mean_batch": requests / batches if batches else 0.0,
            "execute_ms_p50": m.stages["execute"].p50,
            "execute_ms_mean": m.stages["execute"].mean,
            "pre_ms_per_page": 1000 * pre_post_s.get(f"{name}_pre", 0.0) / pages,
            "post_ms_per_page": 1000 * pre_post_s.get(f"{name}_post", 0.0) / pages,
        }
    return out


# -- B5 -------------------------------------------------------------------------------------


def combined_recipe() -> ic.Recipe:
    """The OCR recipe plus the orientation recipe's model (and params): four models."""
    ocr = yaml.safe_load((OCR / "recipe.yaml").read_text(encoding="utf-8"))
    orient = yaml.safe_load((ORIENTATION / "recipe.yaml").read_text(encoding="utf-8"))
    # it runs with the OCR recipe's session options (a model-level `session_options:` mapping
    # is not accepted by inferchain.config yet)
    model = {k: v for k, v in orient["models"][0].items() if k != "session_options"}
    model["reference"] = str(ORIENTATION / model["reference"])  # relative to its own recipe
    return ic.load_recipe(OCR, models=[*ocr["models"], model], params=orient.get("params", {}))


def b5(pages: list[np.ndarray], items: list[np.ndarray], rounds: int) -> dict[str, Any]:
    """Both workloads on one four-model OfflineInference: in turn, then side by side."""
    parts: dict[str, dict[str, float]] = {}  # last round: wall seconds and cores busy per part
    results: dict[str, tuple[list[Any], list[Any]]] = {}
    with ic.OfflineInference(combined_recipe()) as oi:
        orientation = load_pipeline(ic.load_recipe(ORIENTATION), oi)

        def run_ocr() -> list[Any]:
            return list(oi.run(pages))

        def run_orientation() -> list[Any]:
            return list(PipelineDriver(orientation).run(items))

        def one_after_the_other() -> float:
            ocr = metered(run_ocr, parts, "ocr alone")
            angles = metered(run_orientation, parts, "orientation alone")
            results["sequential"] = (texts(ocr), [a["angle"] for a in angles])
            return parts["ocr alone"]["s"] + parts["orientation alone"]["s"]

        def at_once() -> float:
            angles, ocr = metered(
                lambda: side_by_side(run_orientation, run_ocr), parts, "both at once"
            )
            results["concurrent"] = (texts(ocr), [a["angle"] for a in angles])
            return parts["both at once"]["s"]

        samples = interleave({"sequential": one_after_the_other, "concurrent": at_once}, rounds)
        mix = oi.stats().models
    total = len(pages) + len(items)
    return {
        "pages": len(pages),
        "orientation_items": len(items),
        "rounds": rounds,
        "seconds": {k: median(v) for k, v in samples.items()},
        "samples_s": samples,
        "parts": parts,
        "items_per_s": {k: total / median(v) for k, v in samples.items()},
        "speedup": ratios(samples["sequential"], samples["concurrent"]),
        "results_identical": results["sequential"] == results["concurrent"],
        "mean_batch": {name: s.mean_batch_size for name, s in mix.items()},
        "target": ">= 1.2x",
    }


def metered(fn: Callable[[], Any], into: dict[str, dict[str, float]], name: str) -> Any:
    """`fn()`, recording its wall seconds and the cores this process kept busy meanwhile."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    into[name] = {"s": wall, "cores": cpu / wall}
    return value


def side_by_side(first: Callable[[], list[Any]], second: Callable[[], list[Any]]) -> list[Any]:
    """`first` on a thread while `second` runs here; both results, errors re-raised."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = first()
        except BaseException as e:  # re-raised on the caller's thread
            box["error"] = e

    thread = threading.Thread(target=target, name="bench-orientation")
    thread.start()
    try:
        other = second()
    finally:
        thread.join()
    if "error" in box:
        raise box["error"]
    return [box["value"], other]


# -- report ---------------------------------------------------------------------------------


def report(r4: dict[str, Any], r5: dict[str, Any]) -> None:
    rows: list[tuple[str, ...]] = [
        ("id", "measure", "inferchain", "baseline", "speed-up", "target", "same output"),
        *(
            (
                "B4",
                f"pages/s ({r4['pages']} pages)",
                f"{r4['images_per_s']['inferchain']:.2f}",
                f"{r4['images_per_s'][name]:.2f} {label}",
                f"{r4['speedup'][name]['median_of_pairs']:.2f}x",
                ">= 1.6x",
                str(r4["texts_identical"]),
            )
            for name, label in (
                ("rapidocr", "RapidOCR()"),
                ("rapidocr_1thread", "RapidOCR(1 thread)"),
            )
        ),
        (
            "B4",
            "ceiling: bare sessions, same tensors",
            f"{r4['images_per_s']['ceiling']:.2f}",
            f"{r4['images_per_s']['rapidocr']:.2f} RapidOCR()",
            f"{r4['ceiling']['vs_rapidocr']['median_of_pairs']:.2f}x",
            "(reference)",
            "",
        ),
        *(
            (
                "B4",
                f"pages/s, recipe on openvino {side.split('_')[1]}",
                f"{r4['images_per_s'][side]:.2f}",
                f"{r4['images_per_s']['inferchain']:.2f} recipe on onnxruntime",
                f"{r['vs_onnxruntime_recipe']['median_of_pairs']:.2f}x "
                f"({r['vs_rapidocr']['median_of_pairs']:.2f}x RapidOCR())",
                "(reference)",
                str(r4["texts_identical"]),
            )
            for side, r in r4["openvino"].items()
        ),
        (
            "B5",
            f"items/s ({r5['pages']} pages + {r5['orientation_items']} orientation)",
            f"{r5['items_per_s']['concurrent']:.2f}",
            f"{r5['items_per_s']['sequential']:.2f} one after the other",
            f"{r5['speedup']['median_of_pairs']:.2f}x",
            ">= 1.2x",
            str(r5["results_identical"]),
        ),
    ]
    print(table(rows))
    busy = ", ".join(
        f"{k} {v['s']:.1f} s on {v['cores']:.2f} cores" for k, v in r5["parts"].items()
    )
    print(f"B5, last round: {busy}")
    if r4["openvino_not_run"]:
        print(f"B4 on openvino, not run: {r4['openvino_not_run']}")
    share = r4["ceiling"]["inferchain_share"]["median_of_pairs"]
    print(
        f"B4: inferchain runs at {share:.0%} of the ceiling's speed; the ceiling is "
        f"{r4['ceiling']['vs_rapidocr']['median_of_pairs']:.2f}x RapidOCR()"
    )
    print("\nB4, where the time goes (inferchain side; ms per page unless noted)")
    stage_rows: list[tuple[str, ...]] = [
        ("model", "requests/page", "batches", "mean batch", "execute p50 ms", "pre", "post")
    ]
    for name, s in r4["stages"].items():
        stage_rows.append(
            (
                name,
                f"{s['requests_per_page']:.1f}",
                str(s["batches"]),
                f"{s['mean_batch']:.1f}",
                f"{s['execute_ms_p50']:.1f}",
                f"{s['pre_ms_per_page']:.1f}",
                f"{s['post_ms_per_page']:.1f}",
            )
        )
    print(table(stage_rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to keep it working")
    parser.add_argument("--pages", type=int, default=12, help="pages per pass (samples repeated)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved pairs after warm-up")
    parser.add_argument("--in-flight", type=int, default=8, help="pages in flight (B4)")
    parser.add_argument(
        "--orientation-per-page", type=int, default=32, help="orientation items per page (B5)"
    )
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    n, rounds = (2, 1) if args.quick else (args.pages, args.rounds)
    pages = cycle((OCR / "samples").glob("*.png"), n)
    items = cycle((ORIENTATION / "samples").glob("*.png"), n * args.orientation_per_page)
    r4 = b4(pages, rounds, args.in_flight)
    r5 = b5(pages, items, rounds)
    report(r4, r5)
    path = write_results("bench_ocr", {"quick": args.quick, "B4": r4, "B5": r5})
    print(f"wrote {path}")
    if not (r4["texts_identical"] and r5["results_identical"]):
        raise SystemExit("outputs differ between the sides: see the JSON")


if __name__ == "__main__":
    main()
