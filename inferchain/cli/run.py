"""`inferchain run RECIPE`: the recipe's pipeline over its inputs, one line per item.

Every item ends as one line of `results.jsonl`, a result or an error (`key`, `file`,
`error`), at its input position; one that fails (or runs past `--item-timeout`) does not
stop the others. The output folder is locked for the run (`inferchain.output_lock`). Exit 0
when every item has a result, 1 when one failed, 2 on bad input (no inputs at all, an
earlier run's results in the way, the folder in use by another run).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from inferchain.cli.options import add_command, positive_int
from inferchain.cli.run_job import Job, Results, anchored
from inferchain.cli.tally import Tally, positive_seconds
from inferchain.config import Recipe, deterministic, load_recipe
from inferchain.errors import ConfigError
from inferchain.offline import OfflineInference
from inferchain.output_lock import OutputLock
from inferchain.results import RESULTS, Mode, ResultsFile
from inferchain.resume import batches_formed_anew, resume_warning
from inferchain.shards import ShardedResults
from inferchain.sources import input_files, input_items, sources_of
from inferchain.tools.progress import Progress
from inferchain.utilisation import format_utilisation

DESCRIPTION = (
    f"Run a recipe's pipeline over input files and write {RESULTS} in the output folder: one "
    "line per item, in input order, each flushed as soon as it is written: a result, or an "
    "error ({'key', 'file', 'error'}). A failed item does not stop the run. Exit 0 when all "
    "items succeeded, 1 when some failed, 2 on bad input."
)


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    run = add_command(
        sub,
        parents,
        "run",
        cmd_run,
        help="run a recipe's pipeline over its inputs",
        description=DESCRIPTION,
    )
    run.add_argument("recipe", help="recipe folder or its YAML file (or pkg:// to either)")
    run.add_argument(
        "--input",
        action="append",
        type=Path,
        help="file or folder (repeatable; default: the recipe's `inputs:`)",
    )
    run.add_argument("--output", type=Path, help="output folder (default out/<recipe name>)")
    run.add_argument("--limit", type=positive_int, metavar="N", help="at most N items")
    earlier = run.add_mutually_exclusive_group()
    earlier.add_argument(
        "--resume",
        action="store_true",
        help=f"skip the inputs that already have a result in the output's {RESULTS} (errors "
        "are retried) and run the rest, each at its input position",
    )
    earlier.add_argument(
        "--overwrite", action="store_true", help=f"replace an earlier run's {RESULTS}"
    )
    run.add_argument(
        "--format",
        choices=FORMATS,
        help="jsonl: one JSON line per item; parquet: shards of --rows-per-file rows, "
        "tensors as typed arrays, errors in errors.jsonl (default: the recipe's, else jsonl)",
    )
    run.add_argument(
        "--rows-per-file",
        type=positive_int,
        default=4096,
        metavar="N",
        help="with --format parquet: rows per shard (default 4096)",
    )
    run.add_argument(
        "--item-timeout",
        type=positive_seconds,
        metavar="S",
        help="an item not finished S seconds after it started becomes an error line "
        "('timed out after S s') and the run goes on",
    )
    run.add_argument(
        "--deterministic",
        action="store_true",
        help="every model `deterministic: true`: each batch at its max batch (rows padded), "
        "items at a shape of their own, so an item's results never depend on what shares "
        "its batch (a resume, another --max-batch-size, timing); costs the padding",
    )
    run.add_argument("--ray", action="store_true", help="on Ray Data: RAY_ADDRESS or a local Ray")
    run.add_argument(
        "--concurrency", type=positive_int, default=1, help="with --ray: actors (default 1)"
    )


def cmd_run(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe)
    if args.deterministic:
        recipe = deterministic(recipe)
    out_dir = Path(args.output or Path("out") / recipe.name)
    mode: Mode = "resume" if args.resume else "overwrite" if args.overwrite else "new"
    sources = sources_of(recipe, args.input)
    results = results_sink(out_dir, mode, args.format, args.rows_per_file)
    results.check()  # refuse before loading any model
    if args.ray and args.item_timeout is not None:
        raise ConfigError("--item-timeout does not run with --ray (Ray Data bounds its tasks)")
    with OutputLock(out_dir):  # one run writes a folder at a time
        if args.ray:  # scale-out: the same recipe over a Ray dataset (docs/scale-out.md)
            if not isinstance(results, ResultsFile):
                raise ConfigError("--format parquet does not run with --ray: it writes jsonl")
            from inferchain.integrations.ray import run_recipe

            level = getattr(args, "log_level", None)
            return run_recipe(
                recipe, sources, out_dir, args.concurrency, args.limit, level, results=results
            )
        return _run_here(args, recipe, out_dir, sources, results)


def _run_here(
    args: argparse.Namespace, recipe: Recipe, out_dir: Path, sources: list[Path], results: Results
) -> int:
    """`run` in this process: the inputs without a result, in input order, written at
    their positions; the summary line; the exit status."""

    with OfflineInference(recipe) as oi:
        if args.format is None and oi.pipeline.output_format != "jsonl":  # the recipe's own
            form = oi.pipeline.output_format
            results = results_sink(out_dir, results.mode, form, args.rows_per_file)
            results.check()
        files = input_items(input_files(sources, oi.pipeline), oi.pipeline)
        with results:
            done = results.plan([f.key for f in files])
            if done:  # a resume: say where its bytes may differ from a run straight through
                for model in batches_formed_anew(recipe):
                    print(resume_warning(model), file=sys.stderr)
            left = [p for p in range(len(files)) if p not in done]
            todo = left[: args.limit]
            tally = Tally(before=len(files) - len(left), beyond=len(left) - len(todo))
            started = time.perf_counter()
            runs, write = anchored(len(files), todo, oi.pipeline.anchor)
            # a bar on a TTY only; the inputs done before count as done
            with Progress(tally.before + len(todo), "run", summary=False, done=tally.before) as bar:
                job = Job(oi, files, results, out_dir, bar, tally, args.item_timeout)
                job.run(runs, write)
            seconds = time.perf_counter() - started
        use = oi.metrics.utilisation()
        names = [m.name for m in oi.models]
    print(tally.line(seconds, str(results.path)))
    if todo:
        print("utilisation: " + "; ".join(format_utilisation(use, names)))
    return 1 if tally.num_failed else 0


FORMATS = ("jsonl", "parquet")


def results_sink(folder: Path, mode: Mode, form: str | None, rows_per_file: int) -> Results:
    """Where `run` writes: `results.jsonl`, or Parquet shards (`--format parquet`)."""
    if form in (None, "jsonl"):
        return ResultsFile(folder, mode)
    if form != "parquet":
        raise ConfigError(f"output_format must be one of {', '.join(FORMATS)}, got {form!r}")
    return ShardedResults(folder, mode, rows_per_file)
