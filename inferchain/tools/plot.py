"""A benchmark at a glance: latency histogram, throughput over time and worker occupancy.

Needs matplotlib (the `plot` extra: `pip install 'inferchain[plot]'`), imported only when a
plot is drawn. Figures are drawn on matplotlib's Agg canvas, without pyplot's global state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferchain.extras import require
from inferchain.metrics import BatchTiming

BINS = 50  # histogram bins and throughput intervals
PLOT_MODULES = ("matplotlib.figure", "matplotlib.backends.backend_agg")  # what a plot imports


def _matplotlib() -> tuple[Any, Any]:
    require(PLOT_MODULES, "plot", "a plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return Figure, FigureCanvasAgg


def _latency(ax: Any, latencies_s: np.ndarray) -> None:
    ms = latencies_s * 1e3
    ax.set_title("end-to-end latency")
    ax.set_xlabel("ms")
    ax.set_ylabel("requests")
    if not ms.size:
        return
    ax.hist(ms, bins=BINS, color="tab:blue")
    for q, style in ((50, "-"), (90, "--"), (99, ":")):
        value = float(np.percentile(ms, q))
        ax.axvline(value, color="black", linestyle=style, label=f"p{q} {value:.2f} ms")
    ax.legend(loc="upper right", fontsize="small")


def _throughput(ax: Any, batches: Sequence[BatchTiming], origin: float) -> None:
    ax.set_title("throughput")
    ax.set_xlabel("s")
    ax.set_ylabel("items/s")
    done = [(b.end - origin, b.size) for b in batches if b.ok]
    if not done:
        return
    ends = np.array([t for t, _ in done])
    sizes = np.array([n for _, n in done], dtype=float)
    bins = int(np.clip(len(done) // 8, 5, BINS))  # ~8 batches an interval: less quantised
    edges = np.linspace(0.0, max(float(ends.max()), 1e-6), bins + 1)
    counts, _ = np.histogram(ends, bins=edges, weights=sizes)
    width = float(edges[1] - edges[0])
    ax.stairs(counts / width, edges, color="tab:green")


def _occupancy(
    ax: Any, batches: Sequence[BatchTiming], workers: Sequence[str], origin: float
) -> None:
    ax.set_title("worker occupancy")
    ax.set_xlabel("s")
    span = max((b.end for b in batches), default=origin) - origin
    labels = []
    for row, worker in enumerate(workers):
        spans = [(b.picked - origin, b.end - b.picked) for b in batches if b.worker == worker]
        busy = sum(d for _, d in spans)
        ax.broken_barh(spans, (row - 0.4, 0.8), color="tab:orange")
        labels.append(f"{worker} {busy / span:.0%}" if span > 0 else worker)
    ax.set_yticks(range(len(workers)), labels)
    ax.set_ylim(max(len(workers), 1) - 0.5, -0.5)  # first worker on top


def plot_timeline(
    path: str | Path,
    timeline: Sequence[BatchTiming],
    latencies_s: np.ndarray,
    *,
    workers: Sequence[str] = (),
    title: str = "",
) -> Path:
    """Write a PNG (or any format matplotlib knows from the suffix) with the three panels."""
    figure_cls, canvas_cls = _matplotlib()
    batches = sorted(timeline, key=lambda b: b.picked)
    origin = batches[0].picked if batches else 0.0
    names = list(dict.fromkeys([*workers, *(b.worker for b in batches)]))
    figure = figure_cls(figsize=(10, 8 + 0.25 * len(names)), layout="constrained")
    canvas_cls(figure)
    top, middle, bottom = figure.subplots(3, 1)
    _latency(top, latencies_s)
    _throughput(middle, batches, origin)
    _occupancy(bottom, batches, names, origin)
    if title:
        figure.suptitle(title)
    out = Path(path)
    figure.savefig(out, dpi=100)
    return out
