"""B7 of BENCHMARKS.md: start-up cost, against bare ONNX Runtime session loads in the same run.

B7 init   `init()` of all of a recipe's models vs the sum of bare `ort.InferenceSession`
          loads of the same files (each instance) with the same session options  target <= 1.1x
          (also reported with `warmup: false` on every model: the cost of warm-up itself)
B7 first  the first `infer()` after `init()` vs the steady P50 of single `infer()` calls
          (models with static item shapes), with warm-up as the recipe says    target <= 1.5x
          and again with `warmup: false`, to show what warm-up buys

Recipes: recipes/orientation, and recipes/ocr when it is there. Sides run interleaved (A B A B)
after a warm-up round, `--repeats` times (init: three times as many); medians of the times
and the median of the per-round ratios are reported.

Run: `python benchmarks/bench_startup.py [--quick]`; writes benchmarks/results/bench_startup.json.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import structlog
from common import interleave, median, table, write_results

import inferchain as ic
from inferchain.backends.onnxruntime import providers, session_options
from inferchain.config import Recipe

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def recipes() -> dict[str, Path]:
    names = ["orientation", "ocr"]
    return {n: RECIPES / n for n in names if (RECIPES / n / "recipe.yaml").is_file()}


def no_warmup(recipe: Recipe, path: Path) -> Recipe:
    return ic.load_recipe(path, models={m.name: {"warmup": False} for m in recipe.models})


# -- B7 init ----------------------------------------------------------------------------------


def bare_loads(recipe: Recipe) -> Callable[[], float]:
    """A side: every model file loaded (once per instance) as a user would, seconds in all."""
    names, options = providers(recipe.providers, ort.get_available_providers())

    def run() -> float:
        started = time.perf_counter()
        sessions = [
            ort.InferenceSession(
                m.path,
                sess_options=session_options(m.session_options or recipe.session_options),
                providers=names,
                provider_options=options,
            )
            for m in recipe.models
            for _ in range(m.instances)
        ]
        seconds = time.perf_counter() - started
        del sessions
        return seconds

    return run


def init_time(recipe: Recipe) -> Callable[[], float]:
    """A side: `OfflineInference.init()` of the recipe, seconds (close() not counted)."""

    def run() -> float:
        oi = ic.OfflineInference(recipe)
        started = time.perf_counter()
        oi.init()
        seconds = time.perf_counter() - started
        oi.close()
        return seconds

    return run


def b7_init(path: Path, repeats: int) -> dict[str, Any]:
    recipe = ic.load_recipe(path)
    s = interleave(
        {
            "bare_loads": bare_loads(recipe),
            "init": init_time(recipe),
            "init_no_warmup": init_time(no_warmup(recipe, path)),
        },
        repeats,
    )
    return {
        "models": {m.name: {"instances": m.instances, "warmup": m.warmup} for m in recipe.models},
        "seconds": {k: median(v) for k, v in s.items()},
        "rounds": s,
        "ratio": paired(s["init"], s["bare_loads"]),
        "ratio_no_warmup": paired(s["init_no_warmup"], s["bare_loads"]),
        "target": "<= 1.1",
    }


def paired(sides: list[float], baselines: list[float]) -> float:
    """The median of the per-round ratios (each pair ran back to back)."""
    return median([a / b for a, b in zip(sides, baselines, strict=True)])


# -- B7 first request -------------------------------------------------------------------------


def static_items(oi: ic.OfflineInference) -> dict[str, list[np.ndarray]]:
    """One random item per model whose item shapes are all static (others have no warm-up)."""
    rng = np.random.default_rng(0)
    items = {}
    for m in oi.models:
        descs = oi.model_info(m.name).inputs
        shapes = [t.item_shape() if m.max_batch_size > 0 else t.shape for t in descs]
        if all(None not in s for s in shapes):
            items[m.name] = [
                rng.standard_normal(s).astype(t.dtype)  # type: ignore[arg-type]
                for s, t in zip(shapes, descs, strict=True)
            ]
    return items


def first_and_steady(recipe: Recipe, calls: int) -> dict[str, tuple[float, float]]:
    """Per static model: (first infer() after init, P50 of `calls` more), seconds."""
    out = {}
    with ic.OfflineInference(recipe) as oi:
        for name, item in static_items(oi).items():
            started = time.perf_counter()
            oi.infer(name, item)
            first = time.perf_counter() - started
            latencies = []
            for _ in range(calls):
                started = time.perf_counter()
                oi.infer(name, item)
                latencies.append(time.perf_counter() - started)
            out[name] = (first, float(np.median(latencies)))
    return out


def b7_first(path: Path, repeats: int, calls: int) -> dict[str, Any]:
    variants = {"warmup": ic.load_recipe(path)}
    variants["no_warmup"] = no_warmup(variants["warmup"], path)
    rounds: dict[str, list[dict[str, tuple[float, float]]]] = {k: [] for k in variants}
    for i in range(repeats + 1):  # round 0 warms files, imports and caches up
        for key, recipe in variants.items():
            measured = first_and_steady(recipe, calls)
            if i:
                rounds[key].append(measured)
    result: dict[str, Any] = {}
    for model in rounds["warmup"][0]:
        result[model] = {key: summarize([r[model] for r in rs]) for key, rs in rounds.items()}
    return result


def summarize(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    firsts, p50s = [p[0] for p in pairs], [p[1] for p in pairs]
    return {
        "first_ms": median(firsts) * 1e3,
        "p50_ms": median(p50s) * 1e3,
        "ratio": paired(firsts, p50s),  # first and P50 of the same init
        "ratios_per_round": [f / p for f, p in pairs],
        "target": "<= 1.5",
    }


# -- report -----------------------------------------------------------------------------------


def rows(init: dict[str, Any], first: dict[str, Any]) -> list[tuple[str, ...]]:
    out = [("B7", "recipe / model", "inferchain", "baseline", "ratio", "target")]
    for name, r in init.items():
        s = r["seconds"]
        out.append(
            (
                "init",
                name,
                f"{s['init'] * 1e3:.0f} ms",
                f"{s['bare_loads'] * 1e3:.0f} ms bare",
                f"{r['ratio']:.2f}x",
                "<= 1.1x",
            )
        )
        out.append(
            (
                "init",
                f"{name} (warmup: false)",
                f"{s['init_no_warmup'] * 1e3:.0f} ms",
                f"{s['bare_loads'] * 1e3:.0f} ms bare",
                f"{r['ratio_no_warmup']:.2f}x",
                "",
            )
        )
    for name, models in first.items():
        for model, v in models.items():
            for key, label in (("warmup", ""), ("no_warmup", " (warmup: false)")):
                m = v[key]
                out.append(
                    (
                        "first",
                        f"{name}/{model}{label}",
                        f"{m['first_ms']:.1f} ms first",
                        f"{m['p50_ms']:.1f} ms P50",
                        f"{m['ratio']:.2f}x",
                        "<= 1.5x" if key == "warmup" else "",
                    )
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to keep it working")
    parser.add_argument("--repeats", type=int, default=None, help="rounds per side (default 5)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    repeats = args.repeats or (1 if args.quick else 5)
    calls = 5 if args.quick else 50
    found = recipes()
    # init rounds are cheap and noisier than the rest (a few ms over ~100): three times as many
    init = {name: b7_init(path, 3 * repeats) for name, path in found.items()}
    first = {name: b7_first(path, repeats, calls) for name, path in found.items()}
    print(table(rows(init, first)))
    payload = {"quick": args.quick, "repeats": repeats, "calls": calls}
    path = write_results("bench_startup", {**payload, "B7": {"init": init, "first": first}})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
