"""Results of a batch run as Parquet shards: tensors stay typed arrays, a kill loses no shard.

`ShardedResults` is `inferchain run --format parquet`'s sink: results are gathered into
shards of exactly `rows_per_file` rows (the last one may hold fewer), each written to a
temporary file, fsynced and renamed into place, so a shard under its final name is always
whole: the shards are the manifest, and their `key` column says which inputs are done.
A run that stops early (an interrupt, an error) writes its rows in hand as a shorter last
shard; a resume takes that shard's rows back and writes it again, fuller, under the same
name, so shards stay cut at multiples of `rows_per_file` over the whole job. Errors go to
`errors.jsonl`, one flushed line each. `read_results` gives them back.

Columns: `key` (the input's `input_key`), `file` (and `line`, `text` for one item per
line), then the pipeline's `to_row`: an array of the same shape and dtype in every row is
an Arrow fixed-shape tensor column (`arrow.fixed_shape_tensor`), a scalar a typed column,
anything else what Arrow infers (lists, structs).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Self, TextIO

import numpy as np

from inferchain.closing import Closing
from inferchain.errors import ConfigError
from inferchain.results import REST, RESULTS, Mode
from inferchain.resume import json_line, match_positions, parse_line

ERRORS = "errors.jsonl"
_PART = "part-{:05d}.parquet"
_GLOB = "part-*.parquet"


def arrow() -> tuple[ModuleType, ModuleType]:
    """`pyarrow` and `pyarrow.parquet`, or a one-line ConfigError naming the extra."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            "Parquet results need pyarrow: pip install 'inferchain[parquet]'"
        ) from None
    return pa, pq


def shard_files(folder: Path) -> list[Path]:
    """The whole shards in `folder`, in the order they were written."""
    return sorted(folder.glob(_GLOB))


class ShardedResults(Closing):
    """Parquet shards and `errors.jsonl` in an output folder, opened in one of the modes of
    `ResultsFile` (`new`, `overwrite`, `resume`: keep the shards, drop the errors and any
    temporary file a kill left, skip the inputs the shards hold)."""

    def __init__(self, folder: Path, mode: Mode = "new", rows_per_file: int = 4096) -> None:
        if rows_per_file < 1:
            raise ConfigError(f"--rows-per-file must be >= 1, got {rows_per_file}")
        self.folder = folder
        self.path = folder  # where the results are, for the closing line
        self.mode = mode
        self.rows_per_file = rows_per_file
        self._keys: list[str] = []  # the whole shards' keys, in order (resume)
        self._rows: list[tuple[int, Mapping[str, Any]]] = []  # (position, row) not in a shard
        self._added = False  # a row came since the last shard was written (or taken back)
        self._next = 0  # number of the next shard
        self._errors: TextIO | None = None

    def check(self) -> None:
        """ConfigError when the mode is `new` and an earlier run's results are there, or
        when resuming a folder of jsonl results."""
        arrow()
        lines = self.folder / RESULTS
        if self.mode == "resume" and lines.is_file() and lines.stat().st_size > 0:
            raise ConfigError(
                f"{self.folder} holds jsonl results ({RESULTS}): resume it with --format "
                "jsonl, or pass --overwrite to start over in parquet"
            )
        if self.mode != "new":
            return
        earlier = [*shard_files(self.folder), self.folder / ERRORS, lines]
        if any(p.is_file() and p.stat().st_size > 0 for p in earlier):
            raise ConfigError(
                f"{self.folder} holds an earlier run's results: pass --resume to skip the "
                "inputs it has, --overwrite to start over, or another --output"
            )

    def open(self) -> Self:
        """Prepare the folder as the mode says; open `errors.jsonl` (once)."""
        if self._errors is not None:
            return self
        self.check()
        _, pq = arrow()
        self.folder.mkdir(parents=True, exist_ok=True)
        for torn in self.folder.glob(_GLOB + ".tmp"):  # a shard a kill cut short
            torn.unlink()
        shards = shard_files(self.folder)
        if self.mode == "resume":
            for shard in shards:
                keys = pq.read_table(shard, columns=["key"]).column("key").to_pylist()
                self._keys.extend(keys)
            self._next = int(shards[-1].name[5:10]) + 1 if shards else 0
        else:
            for old in (*shards, self.folder / RESULTS, self.folder / REST):
                old.unlink(missing_ok=True)
        self._errors = (self.folder / ERRORS).open("w", encoding="utf-8")  # errors: retried
        return self

    def plan(self, keys: Sequence[str]) -> set[int]:
        """For a resume over the inputs `keys` (in input order): the positions with a row
        in a shard. A last shard shorter than `rows_per_file` is taken back: its rows are
        written again with the next ones, under its name."""
        if not self._keys:
            return set()
        positions = match_positions(self._keys, keys)
        last = shard_files(self.folder)[-1]
        table = arrow()[1].read_table(last)
        if table.num_rows < self.rows_per_file:
            rows = table_rows(table)
            taken = positions[len(positions) - len(rows) :]
            self._rows = [(-1 if p is None else p, r) for p, r in zip(taken, rows, strict=True)]
            self._next -= 1
        return {p for p in positions if p is not None}

    def write(self, record: Mapping[str, Any], position: int = -1) -> None:
        """One item's row (`key`, `file`, ... and its values), or its error line; a shard
        is written as soon as `rows_per_file` rows are there, in input `position` order."""
        assert self._errors is not None, "open() first"
        if "error" in record:
            self._errors.write(json_line(record))
            self._errors.flush()
            return
        self._rows.append((position, record))
        self._added = True
        if len(self._rows) >= self.rows_per_file:
            self._write_shard()

    def _write_shard(self) -> None:
        _, pq = arrow()
        self._rows.sort(key=lambda row: row[0])  # a row that ran again takes its place
        table = to_table([row for _, row in self._rows])
        final = self.folder / _PART.format(self._next)
        temporary = final.with_name(final.name + ".tmp")
        with temporary.open("wb") as sink:
            pq.write_table(table, sink)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temporary, final)
        _fsync_dir(self.folder)  # the rename itself survives a power loss
        if len(self._rows) >= self.rows_per_file:  # one statement: no interrupt between
            self._rows, self._next, self._added = [], self._next + 1, False
        else:
            self._added = False

    def close(self) -> None:
        """Write the rows left as a last, shorter shard (one a resume takes back); close
        `errors.jsonl`."""
        if self._errors is None:
            return
        try:
            if self._rows and self._added:
                self._write_shard()
        finally:
            self._errors.close()
            self._errors = None

    def __enter__(self) -> Self:
        return self.open()


def to_table(rows: Sequence[Mapping[str, Any]]) -> Any:
    """Rows (name -> value) as one pyarrow Table, columns in first-seen order."""
    pa, _ = arrow()
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    columns = {name: _column(pa, [row.get(name) for row in rows]) for name in names}
    return pa.table(columns)


def _column(pa: ModuleType, values: list[Any]) -> Any:
    """A fixed-shape tensor column where every value is an array of one shape and dtype
    (a plain typed column for 0-d ones); else what Arrow infers."""
    first = values[0]
    if isinstance(first, np.ndarray | np.generic) and all(
        isinstance(v, np.ndarray | np.generic) and v.shape == first.shape and v.dtype == first.dtype
        for v in values
    ):
        stacked = np.stack([np.asarray(v) for v in values])
        if stacked.ndim == 1:
            return pa.array(stacked)
        return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(stacked))
    return pa.array([v.tolist() if isinstance(v, np.ndarray | np.generic) else v for v in values])


def read_results(folder: str | Path) -> Any:
    """The results of `inferchain run` in `folder` as one pyarrow Table, in the order they
    were written: its Parquet shards, or else its `results.jsonl` (errors are not rows:
    they are in `errors.jsonl` or on the lines with `error`; a line a kill cut short is not
    there). See `result_arrays`."""
    pa, pq = arrow()
    folder = Path(folder)
    shards = shard_files(folder)
    if shards:
        return pa.concat_tables([pq.read_table(s) for s in shards])
    lines = folder / RESULTS
    if not lines.is_file():
        raise ConfigError(f"{folder}: no results (no {_GLOB}, no {RESULTS})")
    with lines.open("rb") as f:  # a last line a kill cut short is not a record yet
        records = [r for r in map(parse_line, f) if r is not None and "error" not in r]
    return pa.Table.from_pylist(records)


def table_rows(table: Any) -> list[dict[str, Any]]:
    """A results table back as rows that `to_table` makes the same table of: tensor
    columns as arrays, typed columns without nulls as numpy scalars, others as Python."""
    pa, _ = arrow()
    columns: dict[str, list[Any]] = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if isinstance(column.type, pa.FixedShapeTensorType):
            columns[name] = list(column.to_numpy_ndarray())
        elif pa.types.is_primitive(column.type) and column.null_count == 0:
            columns[name] = list(column.to_numpy(zero_copy_only=False))
        else:
            columns[name] = column.to_pylist()
    return [
        dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)
    ]


def result_arrays(table: Any) -> dict[str, np.ndarray]:
    """Each column of a results table as a numpy array: a tensor column as one array of
    shape (rows, *item shape) and its dtype, others as Arrow converts them."""
    pa, _ = arrow()
    arrays: dict[str, np.ndarray] = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if isinstance(column.type, pa.FixedShapeTensorType):
            arrays[name] = column.to_numpy_ndarray()
        else:
            arrays[name] = column.to_numpy(zero_copy_only=False)
    return arrays


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
