"""`inferchain bench RECIPE`: throughput, batch sizes and latency percentiles per stage."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from inferchain.cli.options import add_command, positive_int
from inferchain.config import load_recipe
from inferchain.errors import ConfigError
from inferchain.extras import require
from inferchain.tools.bench import run_bench
from inferchain.tools.bench_report import BenchReport, Source, format_report
from inferchain.tools.feeds import DYNAMIC_DIM
from inferchain.tools.plot import PLOT_MODULES
from inferchain.tools.progress import Progress


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    bench = add_command(
        sub, parents, "bench", cmd_bench, help="benchmark a recipe's models (synthetic inputs)"
    )
    bench.add_argument("recipe", help="recipe folder or its YAML file")
    bench.add_argument(
        "--model", action="append", metavar="NAME", help="only this model (repeatable)"
    )
    bench.add_argument(
        "--requests", type=positive_int, default=1000, metavar="N", help="per model (default 1000)"
    )
    bench.add_argument(
        "--dynamic-dim",
        type=int,
        metavar="D",
        default=DYNAMIC_DIM,
        help=f"size of dynamic dims in synthetic inputs where the recipe has no shape buckets "
        f"(default {DYNAMIC_DIM})",
    )
    bench.add_argument(
        "--pipeline",
        action="store_true",
        help="run the recipe's inputs through its pipeline instead (times pre/post too)",
    )
    bench.add_argument(
        "--input",
        action="append",
        type=Path,
        metavar="PATH",
        help="with --pipeline: these files or folders instead of the recipe's `inputs:`, read "
        "as `run` reads them (repeatable)",
    )
    bench.add_argument(
        "--in-flight",
        type=positive_int,
        metavar="N",
        help="synthetic requests in flight per model (default: two batches per worker "
        "stream, the rate the model drains them)",
    )
    bench.add_argument("--json", type=Path, metavar="FILE", help="write the figures as JSON")
    bench.add_argument(
        "--trace", type=Path, metavar="FILE", help="write a Chrome/Perfetto trace (JSON)"
    )
    bench.add_argument(
        "--plot", type=Path, metavar="FILE", help="write latency/throughput/occupancy (PNG)"
    )


def cmd_bench(args: argparse.Namespace) -> int:
    if args.plot:  # before anything runs, not after the whole benchmark
        require(PLOT_MODULES, "plot", "--plot")
    recipe = load_recipe(args.recipe)
    if args.input and not args.pipeline:
        raise ConfigError("--input needs --pipeline: the recipe's pipeline reads the files")
    source: Source = "pipeline" if args.pipeline else "synthetic"
    models = args.model or [m.name for m in recipe.models]
    total = args.requests * (1 if args.pipeline else len(models))
    with Progress(total, "bench", summary=False) as progress:
        report = run_bench(
            recipe,
            models=args.model,
            requests=args.requests,
            source=source,
            on_done=progress.update,
            dynamic_dim=args.dynamic_dim,
            inputs=args.input,
            in_flight=args.in_flight,
        )
    print(format_report(report), flush=True)
    write_outputs(report, args)
    failed = report.stats.errors + (report.items.errors if report.items is not None else 0)
    return 0 if failed == 0 else 1  # a request, or a pipeline item, failed


def write_outputs(report: BenchReport, args: argparse.Namespace) -> None:
    """The --json, --trace and --plot files that were asked for."""
    if args.json:
        args.json.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        print(f"figures in {args.json}", file=sys.stderr)
    if args.trace:
        from inferchain.tools.trace import write_trace

        write_trace(
            args.trace,
            report.timeline,
            process=report.recipe,
            workers=report.workers,
            host=report.host_steps,
        )
        print(f"trace in {args.trace} (open at ui.perfetto.dev)", file=sys.stderr)
    if args.plot:
        from inferchain.tools.plot import plot_timeline

        plot_timeline(
            args.plot,
            report.timeline,
            report.latencies_s,
            workers=report.workers,
            title=f"{report.recipe}: {_rate(report)}",
        )
        print(f"plot in {args.plot}", file=sys.stderr)


def _rate(report: BenchReport) -> str:
    if report.items is not None:
        return f"{report.items.throughput:.1f} pipeline items/s"
    return f"{report.stats.throughput:.1f} requests/s"
