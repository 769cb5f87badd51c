"""The loop of `inferchain run`: each item through the recipe's pipeline, its record (a
result or an error, `key` and `file` first) written at its input position as it finishes,
counted and shown. An interrupt between two results stops the driver at once."""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import attrs

from inferchain.cli.tally import Tally
from inferchain.driver import PipelineDriver
from inferchain.errors import InvalidInput
from inferchain.offline import OfflineInference
from inferchain.pipeline import Pipeline, PipelineWrapper, Process
from inferchain.results import ResultsFile
from inferchain.shards import ShardedResults
from inferchain.sources import Item, load_item
from inferchain.tools.progress import Progress

Results = ResultsFile | ShardedResults


class FileReader(PipelineWrapper):
    """The recipe's pipeline over `(position, Item)` items: each file is loaded when its
    item starts, so one that cannot be read fails alone; loaded items are kept for `save`."""

    def __init__(self, inner: Pipeline) -> None:
        super().__init__(inner)
        self.loaded: dict[int, Any] = {}  # position -> the loaded item, until it is saved

    def process(self, item: tuple[int, Item]) -> Process:
        index, source = item
        loaded = load_item(self.inner, source)
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
