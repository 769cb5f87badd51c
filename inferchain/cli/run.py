"""`inferchain run RECIPE`: the recipe's pipeline over its inputs, one line per item.

Every item ends as one line of `results.jsonl`, a result or an error (`key`, `file`,
`error`), at its input position; one that fails (or runs past `--item-timeout`) does not
stop the others. The output folder is locked for the run (`inferchain.output_lock`). Exit 0
when every item has a result, 1 when one failed, 2 on bad input (no inputs at all, an
earlier run's results in the way, the folder in use by another run).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import attrs

from inferchain.cli.options import add_command, positive_int
from inferchain.cli.tally import Tally, positive_seconds
from inferchain.config import Recipe, load_recipe
from inferchain.driver import PipelineDriver
from inferchain.errors import ConfigError, InvalidInput
from inferchain.offline import OfflineInference
from inferchain.output_lock import OutputLock
from inferchain.pipeline import Pipeline, PipelineWrapper, Process
from inferchain.records import input_key
from inferchain.results import RESULTS, Mode, ResultsFile
from inferchain.shards import ShardedResults
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
    sources = _sources(recipe, args.input)
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
Results = ResultsFile | ShardedResults


def results_sink(folder: Path, mode: Mode, form: str | None, rows_per_file: int) -> Results:
    """Where `run` writes: `results.jsonl`, or Parquet shards (`--format parquet`)."""
    if form in (None, "jsonl"):
        return ResultsFile(folder, mode)
    if form != "parquet":
        raise ConfigError(f"output_format must be one of {', '.join(FORMATS)}, got {form!r}")
    return ShardedResults(folder, mode, rows_per_file)


def _sources(recipe: Recipe, given: Sequence[Path] | None) -> list[Path]:
    """The --input paths, or the recipe's `inputs:`; each must exist."""
    sources = list(given or ([recipe.root / recipe.inputs] if recipe.inputs else []))
    if not sources:
        raise ConfigError(f"{recipe.source}: no `inputs:` in the recipe; pass --input")
    for p in sources:
        if not p.exists():
            raise ConfigError(f"--input {p}: no such file or folder")
    return sources


@attrs.frozen
class Item:
    """One item of a run: a file, or one line of a file (a pipeline's `item_per_line`)."""

    file: Path
    line: int | None = None  # 1-based
    text: str = ""  # that line

    @property
    def key(self) -> str:
        return input_key(self.file, self.line)

    @property
    def name(self) -> str:
        return self.file.name if self.line is None else f"{self.file.name}:{self.line}"


def input_items(files: Sequence[Path], pipeline: Pipeline) -> list[Item]:
    """Each file as an item, or each of its non-blank lines for an `item_per_line`
    pipeline (read as UTF-8)."""
    if not pipeline.item_per_line:
        return [Item(f) for f in files]
    items: list[Item] = []
    for f in files:
        try:
            lines = f.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--input {f}: not a readable UTF-8 text file ({e})") from None
        items.extend(Item(f, n, t.strip()) for n, t in enumerate(lines, 1) if t.strip())
    return items


def input_files(sources: Sequence[Path], pipeline: Pipeline) -> list[Path]:
    """The files given, and those of the folders given that the pipeline reads; ConfigError
    naming the folders and the kinds of file when there are none at all."""
    files: list[Path] = []
    for p in sources:
        files.extend(pipeline.input_files(p) if p.is_dir() else [p])
    if not files:
        folders = ", ".join(str(p) for p in sources)
        kinds = ", ".join(pipeline.suffixes)
        raise ConfigError(f"{folders}: no input files (the recipe's pipeline reads {kinds})")
    return files


class FileReader(PipelineWrapper):
    """The recipe's pipeline over `(position, Item)` items: each file is loaded when its
    item starts, so one that cannot be read fails alone; loaded items are kept for `save`."""

    def __init__(self, inner: Pipeline) -> None:
        super().__init__(inner)
        self.loaded: dict[int, Any] = {}  # position -> the loaded item, until it is saved

    def process(self, item: tuple[int, Item]) -> Process:
        index, source = item
        inner = self.inner
        loaded = inner.load(source.file) if source.line is None else inner.load_line(source.text)
        self.loaded[index] = loaded
        work = self.inner.process(loaded)
        if isinstance(work, Generator):
            return (yield from work)
        return work


def anchored(
    count: int, todo: Sequence[int], anchor: int | None
) -> tuple[list[int], set[int] | None]:
    """The input positions to run for the positions `todo` (of `count` inputs): `todo`,
    or for a pipeline with an `anchor`, every whole run of `anchor` positions holding one
    of them, so that its batches are those of a run straight through; and which of them to
    write (None: all)."""
    if anchor is None or len(todo) == count:
        return list(todo), None
    wanted = set(todo)
    runs: list[int] = []
    for start in range(0, count, anchor):
        run = range(start, min(start + anchor, count))
        if any(p in wanted for p in run):
            runs.extend(run)
    return runs, wanted


@attrs.define
class Job:
    """One `run` over its inputs: each item through the pipeline, its record written at
    its input position as it finishes, counted and shown."""

    oi: OfflineInference
    files: Sequence[Item]  # every input, in input order
    results: Results
    out_dir: Path
    progress: Progress
    tally: Tally
    item_timeout: float | None = None

    def run(self, positions: Sequence[int], write: set[int] | None = None) -> None:
        """The items at `positions`; with `write`, only those are written (the others ran
        for their batches: done before)."""
        pipeline = self.oi.pipeline
        reader = FileReader(pipeline)
        driver = PipelineDriver(reader, on_error="return", item_timeout=self.item_timeout)
        items = ((p, self.files[p]) for p in positions)
        self.progress.update(0)  # the clock starts now
        outputs = driver.run(items)  # held here: not closed (and waited for) before abort()
        try:
            for position, result in zip(positions, outputs, strict=True):
                loaded = reader.loaded.pop(position, None)
                if write is None or position in write:
                    self._write(position, loaded, result)
        except KeyboardInterrupt:  # here, between two results: out at once, not at exit
            driver.abort()
            raise

    def _write(self, position: int, loaded: Any, result: Any) -> None:
        pipeline, source = self.oi.pipeline, self.files[position]
        if isinstance(self.results, ShardedResults):
            record = _row(pipeline, source, loaded, result, self.out_dir)
        else:
            record = _record(pipeline, source, loaded, result, self.out_dir)
        self.results.write(record, position)
        self._show(source, record, result)

    def _show(self, source: Item, record: dict[str, Any], result: Any) -> None:
        self.progress.update()
        self.tally.add(record.get("error"))
        if "error" in record:
            self.progress.print(f"{source.name}: ERROR {record['error']}")
        else:
            self.progress.print(f"{source.name}: {self.oi.pipeline.summary(result)}")


def _where(source: Item) -> dict[str, Any]:
    """What names an item in its record: its `key` (what a resume matches), its `file` as
    given (and its `line`, `text`)."""
    where: dict[str, Any] = {"key": source.key, "file": str(source.file)}
    if source.line is not None:
        where |= {"line": source.line, "text": source.text}
    return where


def _row(pipeline: Pipeline, source: Item, item: Any, result: Any, out_dir: Path) -> dict[str, Any]:
    """The Parquet row of one item (its input key first, arrays as they are; its
    artefacts saved), or its error line (also for a file name that is not UTF-8: Parquet
    strings are)."""
    where = _where(source)
    if not isinstance(result, Exception):
        try:
            row = {**where, **pipeline.to_row(result)}
            _utf8(row)
            pipeline.save(source.file, item, result, out_dir)
            return row
        except Exception as e:
            result = e
    return {**where, "error": f"{type(result).__name__}: {result}"}


def _utf8(row: dict[str, Any]) -> None:
    """InvalidInput naming the field when a text value of `row` cannot be UTF-8."""
    for name, value in row.items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                shown = value.encode("utf-8", "backslashreplace").decode("ascii", "replace")
                raise InvalidInput(
                    f"{name} {shown!r} is not UTF-8 text, which Parquet strings must be "
                    "(--format jsonl keeps such names)"
                ) from None


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
