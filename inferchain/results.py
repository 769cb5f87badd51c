"""The results file of a batch run: one JSON line per item, in input order, safe to kill.

Each line is appended and flushed as its item finishes, so a run that is interrupted or
crashes leaves every finished line intact. An earlier run's file is never truncated unless
asked (`overwrite`); `resume` keeps its results and lets the run skip their inputs.

A resume keeps the lines that are whole (`resume.parse_line`) and hold a result, matched
to input positions by their `key`. Where an input before one of them runs again (its line
was an error, or torn), the file is rewritten in input order as the run goes: the kept lines
after the first input to run wait in `results.jsonl.rest` (written, fsynced and renamed into
place before `results.jsonl` is cut back) and are copied over at their turn; closing copies
the rest and removes it. A resume that finds a `.rest` (a run killed meanwhile) takes the
lines of both, so nothing kept is ever lost, and none is written twice.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Self, TextIO

from inferchain.closing import Closing
from inferchain.errors import ConfigError
from inferchain.resume import input_key, json_line, match_positions, parse_line, record_key

__all__ = ["RESULTS", "Mode", "ResultsFile", "input_key"]

RESULTS = "results.jsonl"
REST = RESULTS + ".rest"  # a resume's kept lines not yet copied back
Mode = Literal["new", "overwrite", "resume"]
Kept = tuple[tuple[int, int, int], str]  # (sort key: position, 0 | 1 for one of no input, n)


class ResultsFile(Closing):
    """`results.jsonl` in an output folder, opened in one of three modes.

    - `new`: the file must not exist yet (or be empty): an earlier run's results are kept;
    - `overwrite`: start a new file, dropping what was there (Parquet results too);
    - `resume`: keep the whole result lines, drop error lines and a torn last line, and
      write the run's lines among them in input order (`plan`); refused in a folder of
      Parquet results.
    """

    def __init__(self, folder: Path, mode: Mode = "new") -> None:
        self.path = folder / RESULTS
        self.mode = mode
        self.done: set[str] = set()  # keys of the inputs with a kept result (after open)
        self._sink: TextIO | None = None
        self._found: list[tuple[str | None, str]] = []  # kept (key, line), results.jsonl's
        self._rest: list[tuple[str | None, str]] = []  # ... and a killed resume's .rest
        self._pending: deque[Kept] = deque()  # kept lines still to copy, in input order
        self._good_bytes = 0  # results.jsonl's length up to its last kept line, if in order
        self._in_order = True  # its kept lines are a prefix of whole lines, nothing dropped

    def check(self) -> None:
        """ConfigError when the output folder is a file; when the mode is `new` and an
        earlier run's results are there (its `results.jsonl`, or Parquet shards); when
        resuming a folder of Parquet results."""
        folder = self.path.parent
        if folder.exists() and not folder.is_dir():
            raise ConfigError(
                f"--output {folder} is a file, not a folder: the output is a folder that "
                f"gets {RESULTS} (and what the pipeline saves per item); name a folder"
            )
        shards = folder.is_dir() and any(folder.glob("part-*.parquet"))
        if self.mode == "new" and (self._has_lines() or shards):
            raise ConfigError(
                f"{self.path} holds an earlier run's results: pass --resume to skip the "
                "inputs it has, --overwrite to start over, or another --output"
            )
        if self.mode == "resume" and shards:
            raise ConfigError(
                f"{folder} holds Parquet results (part-*.parquet): resume it with --format "
                "parquet, or pass --overwrite to start over in jsonl"
            )

    def _has_lines(self) -> bool:
        return self.path.is_file() and self.path.stat().st_size > 0

    def open(self) -> Self:
        """Prepare the file as the mode says (once); `plan` (resume) before writing."""
        if self._sink is not None:
            return self
        self.check()
        folder = self.path.parent
        folder.mkdir(parents=True, exist_ok=True)
        if self.mode == "resume":
            self._found = self._read(self.path, whole_file=True)
            rest = folder / REST
            self._rest = self._read(rest) if rest.is_file() else []
            self.done = {k for k, _ in (*self._found, *self._rest) if k is not None}
            self._sink = self.path.open("a", encoding="utf-8")
            return self
        if self.mode == "overwrite":
            for old in (*folder.glob("part-*.parquet"), folder / "errors.jsonl", folder / REST):
                old.unlink(missing_ok=True)
        self._sink = self.path.open("w", encoding="utf-8")
        return self

    def _read(self, path: Path, whole_file: bool = False) -> list[tuple[str | None, str]]:
        """The whole result lines of `path` as (key, line); for results.jsonl, whether
        they are all its whole lines, in a row from its start (then it is kept as it is)."""
        kept: list[tuple[str | None, str]] = []
        if not path.is_file():
            return kept
        offset = 0
        dropped = False
        with path.open("rb") as f:
            for raw in f:
                record = parse_line(raw)
                offset += len(raw)
                if record is None or "error" in record:
                    dropped = True
                    continue
                if whole_file:
                    self._in_order = self._in_order and not dropped
                    if self._in_order:
                        self._good_bytes = offset
                kept.append((record_key(record), raw.decode("utf-8")))
        return kept

    def plan(self, keys: Sequence[str]) -> set[int]:
        """For a resume over the inputs `keys` (in input order): the positions with a kept
        result. From here on `write(record, position)` puts each line in input order."""
        if self.mode != "resume":
            return set()
        entries = self._entries(keys)
        done = {e[0][0] for e in entries if e[0][1] == 0}
        first = next((p for p in range(len(keys)) if p not in done), len(keys))
        prefix = [line for (at, line) in entries if at < (first, 0, 0)]
        if not self._rest and self._in_order and prefix == [line for _, line in self._found]:
            self._keep_as_is()  # nothing to move: cut off what is torn, append
        else:
            self._rewrite(entries, prefix)
            self._pending = deque(e for e in entries if e[0] >= (first, 0, 0))
        return done

    def _entries(self, keys: Sequence[str]) -> list[Kept]:
        """The kept lines of results.jsonl and a killed resume's .rest, each at its input
        position (one of results.jsonl wins), in input order."""
        by_position: dict[int, str] = {}
        loose: dict[str, tuple[int, int, int]] = {}  # a line of no input -> after what
        for n, source in enumerate((self._found, self._rest)):
            positions = match_positions([k for k, _ in source], keys)
            last = -1
            for i, ((_, line), position) in enumerate(zip(source, positions, strict=True)):
                if position is None:
                    loose.setdefault(line, (last, 1, n * len(self._found) + i))
                else:
                    by_position.setdefault(position, line)
                    last = position
        entries = [((p, 0, 0), line) for p, line in by_position.items()]
        entries += [(at, line) for line, at in loose.items()]
        return sorted(entries)

    def _keep_as_is(self) -> None:
        sink = self._sink
        assert sink is not None
        sink.flush()
        os.truncate(self.path, self._good_bytes)  # a torn or merged last line goes
        sink.seek(0, os.SEEK_END)

    def _rewrite(self, entries: list[Kept], prefix: list[str]) -> None:
        """`.rest` (every kept line) first, then results.jsonl as the lines before the
        first input to run: a kill between the two loses nothing."""
        folder = self.path.parent
        _replace(folder / REST, (line for _, line in entries))
        assert self._sink is not None
        self._sink.close()
        _replace(self.path, iter(prefix))
        self._sink = self.path.open("a", encoding="utf-8")

    def resume_keys(self) -> set[str]:
        """For a resume that writes its lines after those kept, in the order they come
        (`write(record)` without a position; `--ray`): the keys of the inputs done."""
        if self.mode == "resume" and (self._rest or not self._in_order):
            entries = [((0, 0, i), line) for i, (_, line) in enumerate(self._found)]
            seen = {line for _, line in self._found}
            entries += [((1, 0, i), ln) for i, (_, ln) in enumerate(self._rest) if ln not in seen]
            self._rewrite(entries, [line for _, line in entries])
            (self.path.parent / REST).unlink()
        elif self.mode == "resume":
            self._keep_as_is()
        return self.done

    def write(self, record: Mapping[str, Any], position: int | None = None) -> None:
        """Append one line and flush it to the operating system; with its input
        `position`, after the kept lines of the positions before it."""
        sink = self._sink
        assert sink is not None, "open() first"
        if position is not None:
            pending = self._pending
            while pending and pending[0][0] < (position, 0, 0):
                sink.write(pending.popleft()[1])
        sink.write(json_line(record))
        sink.flush()

    def close(self) -> None:
        """Copy the kept lines not yet copied, make the file durable, drop `.rest`."""
        sink = self._sink
        if sink is None:
            return
        try:
            while self._pending:
                sink.write(self._pending.popleft()[1])
            sink.flush()
            os.fsync(sink.fileno())
        finally:
            sink.close()
            self._sink = None
        (self.path.parent / REST).unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self.open()


def _replace(path: Path, lines: Iterator[str]) -> None:
    """Write `lines` to `path` through a temporary file, fsynced and renamed into place."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w", encoding="utf-8") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
