"""Shared benchmark plumbing: interleaved repetitions, medians, a table and a JSON file."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Full runs write benchmarks/results/ (tracked: the figures the README quotes); quick runs
# write out/benchmarks/ (untracked), so `make test` leaves the tree clean. The environment
# variable INFERCHAIN_BENCH_RESULTS redirects both (the test suite's quick runs use it).
RESULTS = Path(__file__).resolve().parent / "results"
QUICK_RESULTS = Path(__file__).resolve().parent.parent / "out" / "benchmarks"


def interleave(sides: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Run each side once per round (A B C A B C ...) after one warm-up round.

    Each side returns its own measure (seconds, or a latency); returns all rounds per side.
    """
    for fn in sides.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, fn in sides.items():
            samples[name].append(fn())
    return samples


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    """A side that returns the wall time of `fn()`."""

    def run() -> float:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started

    return run


def median(values: list[float]) -> float:
    return statistics.median(values)


def deterministic_cost(
    samples_s: dict[str, list[float]], outputs: dict[str, Any], default: str = "inferchain"
) -> dict[str, Any]:
    """The `deterministic` side against the default recipe of the same rounds (B13): the
    median per-round throughput ratio (default seconds / deterministic seconds; 0.85
    means 15 % slower) and whether its outputs are equal to the default's."""
    pairs = zip(samples_s[default], samples_s["deterministic"], strict=True)
    return {
        "throughput_ratio": median([d / x for d, x in pairs]),
        "identical_to_default": outputs["deterministic"] == outputs[default],
        "target": ">= 0.85 for the recurrent recipes",
    }


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def results_dir(quick: bool) -> Path:
    """Where a run's JSON goes (see RESULTS above)."""
    override = os.environ.get("INFERCHAIN_BENCH_RESULTS")
    return Path(override) if override else QUICK_RESULTS if quick else RESULTS


def write_results(name: str, payload: dict[str, Any]) -> Path:
    """Write `payload` as `<name>.json`: a quick run (`payload["quick"]`) outside the tree."""
    folder = results_dir(bool(payload.get("quick")))
    folder.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "machine": {"python": platform.python_version(), "cpu_count": _cpus()},
        **payload,
    }
    path = folder / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def _cpus() -> int:
    return len(os.sched_getaffinity(0))
