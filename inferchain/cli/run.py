"""`inferchain run RECIPE`: the recipe's pipeline over its inputs, one line per item.

Every item ends as one line of `results.jsonl`, a result or an error (`file`, `error`);
one that fails (or runs past `--item-timeout`) does not stop the others. Exit 0 when every
item has a result, 1 when one failed, 2 on bad input (no inputs at all, an earlier run's
results in the way).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

from inferchain.cli.options import add_command, positive_int
from inferchain.cli.tally import Tally, positive_seconds
from inferchain.config import load_recipe
from inferchain.driver import PipelineDriver
from inferchain.errors import ConfigError
from inferchain.offline import OfflineInference
from inferchain.pipeline import Pipeline, PipelineWrapper, Process
from inferchain.results import RESULTS, Mode, ResultsFile
from inferchain.shards import ShardedResults
from inferchain.sources import Item, input_files, input_items, load_item, sources_of
from inferchain.tools.progress import Progress
from inferchain.utilisation import format_utilisation

DESCRIPTION = (
    f"Run a recipe's pipeline over input files and write {RESULTS} in the output folder: one "
    "line per item, in input order, each flushed as soon as it is written: a result, or an "
    "error ({'file', 'error'}). A failed item does not stop the run. Exit 0 when all items "
    "succeeded, 1 when some failed, 2 on bad input."
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
        "are retried) and append the rest",
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
    run.add_argument("--ray", action="store_true", help="on Ray Data: RAY_ADDRESS or a local Ray")
    run.add_argument(
        "--concurrency", type=positive_int, default=1, help="with --ray: actors (default 1)"
    )


def cmd_run(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe)
    out_dir = Path(args.output or Path("out") / recipe.name)
    mode: Mode = "resume" if args.resume else "overwrite" if args.overwrite else "new"
    sources = sources_of(recipe, args.input)
    results = results_sink(out_dir, mode, args.format, args.rows_per_file)
    results.check()  # refuse before loading any model
    if args.ray and args.item_timeout is not None:
        raise ConfigError("--item-timeout does not run with --ray (Ray Data bounds its tasks)")
    if args.ray:  # scale-out: the same recipe over a Ray dataset (docs/scale-out.md)
        if not isinstance(results, ResultsFile):
            raise ConfigError("--format parquet does not run with --ray: it writes results.jsonl")
        from inferchain.integrations.ray import run_recipe

        level = getattr(args, "log_level", None)
        return run_recipe(
            recipe, sources, out_dir, args.concurrency, args.limit, level, results=results
        )
    with OfflineInference(recipe) as oi:
        if args.format is None and oi.pipeline.output_format != "jsonl":  # the recipe's own
            results = results_sink(out_dir, mode, oi.pipeline.output_format, args.rows_per_file)
            results.check()
        files = input_items(input_files(sources, oi.pipeline), oi.pipeline)
        with results:
            left = [f for f in files if f.key not in results.done]
            todo = left[: args.limit]
            tally = Tally(before=len(files) - len(left), beyond=len(left) - len(todo))
            started = time.perf_counter()
            total = tally.before + len(todo)
            runs, write = anchored(files, todo, oi.pipeline.anchor)
            # a bar on a TTY only; the inputs done before count as done
            with Progress(total, "run", summary=False, done=tally.before) as progress:
                run_files(oi, runs, results, out_dir, progress, tally, args.item_timeout, write)
            seconds = time.perf_counter() - started
        use = oi.metrics.utilisation()
        names = [m.name for m in oi.models]
    print(tally.line(seconds, str(results.path)))
    if todo:
        print("utilisation: " + "; ".join(format_utilisation(use, names)))
    return 1 if tally.num_failed else 0


FORMATS = ("jsonl", "parquet")
Results = ResultsFile | ShardedResults


def results_sink(folder: Path, mode: Mode, form: str | None, rows_per_file: int) -> Results:
    """Where `run` writes: `results.jsonl`, or Parquet shards (`--format parquet`)."""
    if form in (None, "jsonl"):
        return ResultsFile(folder, mode)
    if form != "parquet":
        raise ConfigError(f"output_format must be one of {', '.join(FORMATS)}, got {form!r}")
    return ShardedResults(folder, mode, rows_per_file)


class FileReader(PipelineWrapper):
    """The recipe's pipeline over `(index, path)` items: each file is loaded when its item
    starts, so one that cannot be read fails alone; loaded items are kept for `save`."""

    def __init__(self, inner: Pipeline) -> None:
        super().__init__(inner)
        self.loaded: dict[int, Any] = {}  # index -> the loaded item, until its result is saved

    def process(self, item: tuple[int, Item]) -> Process:
        index, source = item
        loaded = load_item(self.inner, source)
        self.loaded[index] = loaded
        work = self.inner.process(loaded)
        if isinstance(work, Generator):
            return (yield from work)
        return work


def anchored(
    files: Sequence[Item], todo: Sequence[Item], anchor: int | None
) -> tuple[list[Item], set[int] | None]:
    """What to run for `todo`: itself, or for a pipeline with an `anchor`, every whole run
    of `anchor` input positions holding an item of `todo`, so that its batches are those
    of a run straight through; and which of them to write (None: all)."""
    if anchor is None or len(todo) == len(files):
        return list(todo), None
    wanted = {item.key for item in todo}
    runs: list[Item] = []
    write: set[int] = set()
    for start in range(0, len(files), anchor):
        run = files[start : start + anchor]
        if any(item.key in wanted for item in run):
            write.update(len(runs) + i for i, item in enumerate(run) if item.key in wanted)
            runs.extend(run)
    return runs, write


def run_files(
    oi: OfflineInference,
    files: Sequence[Item],
    results: Results,
    out_dir: Path,
    progress: Progress,
    tally: Tally,
    item_timeout: float | None = None,
    write: set[int] | None = None,
) -> None:
    """Every file through the pipeline, each line written as it finishes, counted; with
    `write`, only those items (the others ran for their batches: done before)."""
    pipeline = oi.pipeline
    reader = FileReader(pipeline)
    driver = PipelineDriver(reader, on_error="return", item_timeout=item_timeout)
    progress.update(0)  # the clock starts now
    for index, (source, result) in enumerate(zip(files, driver.run(enumerate(files)), strict=True)):
        loaded = reader.loaded.pop(index, None)
        if write is not None and index not in write:
            continue
        if isinstance(results, ShardedResults):
            record = _row(pipeline, source, loaded, result, out_dir)
        else:
            record = _record(pipeline, source, loaded, result, out_dir)
        results.write(record)
        progress.update()
        tally.add(record.get("error"))
        if "error" in record:
            progress.print(f"{source.name}: ERROR {record['error']}")
        else:
            progress.print(f"{source.name}: {pipeline.summary(result)}")


def _where(source: Item) -> dict[str, Any]:
    where: dict[str, Any] = {"file": str(source.file)}
    if source.line is not None:
        where |= {"line": source.line, "text": source.text}
    return where


def _row(pipeline: Pipeline, source: Item, item: Any, result: Any, out_dir: Path) -> dict[str, Any]:
    """The Parquet row of one item (its input key first, arrays as they are; its
    artefacts saved), or its error line."""
    where = {"key": source.key, **_where(source)}
    if not isinstance(result, Exception):
        try:
            row = {**where, **pipeline.to_row(result)}
            pipeline.save(source.file, item, result, out_dir)
            return row
        except Exception as e:
            result = e
    return {**where, "error": f"{type(result).__name__}: {result}"}


def _record(
    pipeline: Pipeline, source: Item, item: Any, result: Any, out_dir: Path
) -> dict[str, Any]:
    """The line of one item: its result (and its artefacts saved), or the error."""
    where = _where(source)
    if not isinstance(result, Exception):
        try:
            record = {**where, **pipeline.to_record(result)}
            json.dumps(record, ensure_ascii=False)
            pipeline.save(source.file, item, result, out_dir)
            return record
        except Exception as e:
            result = e
    return {**where, "error": f"{type(result).__name__}: {result}"}
