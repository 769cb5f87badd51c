"""Device-to-device chaining (recipe `inputs: {x: {from: embed.y}}`): the host <-> device bytes
per item of a two-model chain on acl, before (the first model's output goes to the host and
back to the device) and after (it stays in device memory).

Two tiny MLPs (`embed`: x f32[64] -> y f32[WIDTH]; `head`: x f32[WIDTH] -> y f32[10]) run as
one pipeline (embed, then head on embed's `y` as it came back) on FakeAcl compiled for the
recipe (`FakeAcl.for_recipe`), batches of 8. The bytes come from the fake's copy counters
after `init()` (warm-ups excluded), divided by the items; they do not vary between runs. The
outputs must be identical on both sides and equal to onnxruntime's.

Also items/s and process CPU time per item of both sides, interleaved rounds, medians, on
FakeAcl with instant copies: what the hand-over costs (or saves) the framework on the host,
not what a card's copies take.

Run: `python benchmarks/bench_handover.py [--quick] [--width N]`; writes
benchmarks/results/bench_handover.json (a quick run: out/benchmarks/).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from common import interleave, median, table, write_results

import inferchain as ic
from inferchain.driver import PipelineDriver
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_mlp64

BATCH = 8
DIRECTIONS = ("h2d", "d2h", "d2d")


class Chain(ic.Pipeline):
    def process(self, x: np.ndarray) -> ic.Process:
        out = yield self.submit("embed", x)
        result = yield self.submit("head", {"x": out["y"]})
        return result["y"]


def write_models(folder: Path, width: int) -> tuple[Path, Path]:
    embed = write_mlp64(folder / "embed.onnx", out_features=width, seed=1)
    head = write_mlp64(folder / "head.onnx", in_features=width, out_features=10, seed=2)
    return embed, head


def recipe(paths: tuple[Path, Path], chained: bool, backend: str = "acl") -> ic.Recipe:
    embed, head = paths
    taken = {"x": {"from": "embed.y"}} if chained else {}
    models: list[dict[str, Any]] = [
        {"name": "embed", "path": str(embed), "max_batch_size": BATCH},
        {"name": "head", "path": str(head), "max_batch_size": BATCH, "inputs": taken},
    ]
    return ic.Recipe.from_dict(
        {
            "name": "handover",
            "backend": backend,
            "session_options": {"intra_op_num_threads": 1},
            "models": models,
        }
    )


def bytes_per_item(r: ic.Recipe, xs: list[np.ndarray]) -> tuple[dict[str, float], np.ndarray]:
    """Bytes and copies per item by direction, and the outputs."""
    fake = FakeAcl.for_recipe(r)
    with ic.OfflineInference(r, acl_module=fake) as oi:
        before = fake.copies()
        out = np.stack(list(PipelineDriver(Chain(oi)).run(xs)))
        after = fake.copies()
    live = {k: v for k, v in fake.live_handles().items() if v}
    if live or fake.errors:
        raise SystemExit(f"FakeAcl: left {live}, errors {fake.errors[:3]}")
    n = len(xs)
    figures = {d: (after[d][1] - before[d][1]) / n for d in DIRECTIONS}
    figures |= {f"{d}_copies": (after[d][0] - before[d][0]) / n for d in DIRECTIONS}
    return figures, out


def timed(oi: ic.OfflineInference, xs: list[np.ndarray], walls: list[float]) -> Callable[[], float]:
    """A side: the process CPU seconds of the chain over `xs` (its wall seconds go to
    `walls`)."""

    def run() -> float:
        cpu, started = time.process_time(), time.perf_counter()
        for _ in PipelineDriver(Chain(oi)).run(xs):
            pass
        walls.append(time.perf_counter() - started)
        return time.process_time() - cpu

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="256 items, 1 round")
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=64, help="floats a row of embed.y")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    n, rounds = (256, 1) if args.quick else (args.items, args.rounds)
    xs = list(np.random.default_rng(0).standard_normal((n, 64)).astype(np.float32))
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_models(Path(tmp), args.width)
        sides = {"before": recipe(paths, False), "after": recipe(paths, True)}
        with ic.OfflineInference(recipe(paths, False, "onnxruntime")) as oi:
            expected = np.stack(list(PipelineDriver(Chain(oi)).run(xs)))
        counted = {name: bytes_per_item(r, xs) for name, r in sides.items()}
        identical = all(np.array_equal(out, expected) for _, out in counted.values())
        sessions = {  # instant copies: the framework's host cost only
            name: ic.OfflineInference(r, acl_module=FakeAcl.for_recipe(r, copy_bandwidth=None))
            for name, r in sides.items()
        }
        try:
            for oi in sessions.values():
                oi.init()
            walls: dict[str, list[float]] = {k: [] for k in sessions}
            cpu = interleave({k: timed(oi, xs, walls[k]) for k, oi in sessions.items()}, rounds)
        finally:
            for oi in sessions.values():
                oi.close()
        speed = {k: n / median(v[1:]) for k, v in walls.items()}  # [0]: the warm-up round
        cpu_us = {k: 1e6 * median(v) / n for k, v in cpu.items()}
    before, after = counted["before"][0], counted["after"][0]
    crossing = {k: f[0]["h2d"] + f[0]["d2h"] for k, f in counted.items()}
    rows = [("", "h2d B/item", "d2h B/item", "d2d B/item", "copies/item", "items/s", "CPU us/item")]
    for name, f in (("before", before), ("after", after)):
        copies = sum(f[f"{d}_copies"] for d in DIRECTIONS)
        rows.append((name, f"{f['h2d']:.0f}", f"{f['d2h']:.0f}", f"{f['d2d']:.0f}",
                     f"{copies:.3f}", f"{speed[name]:.0f}", f"{cpu_us[name]:.0f}"))  # fmt: skip
    print(table(rows))
    ratio = crossing["after"] / crossing["before"]
    print(
        f"host <-> device bytes per item {crossing['before']:.0f} -> {crossing['after']:.0f} "
        f"({ratio:.3f}x); after / before (instant copies): items/s "
        f"{speed['after'] / speed['before']:.2f}x, CPU per item "
        f"{cpu_us['after'] / cpu_us['before']:.2f}x; outputs identical to onnxruntime: "
        f"{identical}"
    )
    path = write_results(
        "bench_handover",
        {
            "quick": args.quick,
            "items": n,
            "rounds": rounds,
            "width": args.width,
            "batch": BATCH,
            "bytes_per_item": {"before": before, "after": after},
            "crossing_bytes_per_item": crossing,
            "wall_seconds": walls,
            "cpu_seconds": cpu,
            "items_per_s": speed,
            "cpu_us_per_item": cpu_us,
            "figures": {
                "host_device_bytes_ratio": ratio,
                "items_per_s_ratio": speed["after"] / speed["before"],
                "cpu_per_item_ratio": cpu_us["after"] / cpu_us["before"],
            },
            "identical": identical,
        },
    )
    print(f"wrote {path}")
    if not identical:
        raise SystemExit("the outputs differ from onnxruntime's")


if __name__ == "__main__":
    main()
