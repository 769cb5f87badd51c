"""The results file of a batch run: one JSON line per item, safe to kill at any moment.

Each line is appended and flushed as its item finishes, so a run that is interrupted or
crashes leaves every finished line intact. An earlier run's file is never truncated unless
asked (`overwrite`); `resume` keeps its results and lets the run skip their inputs.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self, TextIO

from inferchain.closing import Closing
from inferchain.errors import ConfigError

RESULTS = "results.jsonl"
Mode = Literal["new", "overwrite", "resume"]


def input_key(file: str | Path, line: int | None = None) -> str:
    """How an input is recognised across runs: its file's absolute, resolved path, and the
    line number where each line of the file is an item."""
    path = _resolved(os.getcwd(), str(file))
    return path if line is None else f"{path}:{line}"


@functools.lru_cache(maxsize=1024)
def _resolved(cwd: str, file: str) -> str:
    """A file's absolute, resolved path from `cwd` (once per file: each of its lines asks)."""
    return str((Path(cwd) / file).resolve())


class ResultsFile(Closing):
    """`results.jsonl` in an output folder, opened in one of three modes.

    - `new`: the file must not exist yet (or be empty): an earlier run's results are kept;
    - `overwrite`: start a new file, dropping what was there;
    - `resume`: keep the lines with a result, drop error lines and a last line torn by a kill
      (rewritten through a temporary file and an atomic rename), and append after them;
      `done` holds the `input_key` of every input with a result.
    """

    def __init__(self, folder: Path, mode: Mode = "new") -> None:
        self.path = folder / RESULTS
        self.mode = mode
        self.done: set[str] = set()
        self._sink: TextIO | None = None

    def check(self) -> None:
        """ConfigError when the output folder is a file, or when the mode is `new` and an
        earlier run's results are there (its `results.jsonl`, or Parquet shards)."""
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

    def _has_lines(self) -> bool:
        return self.path.is_file() and self.path.stat().st_size > 0

    def open(self) -> Self:
        """Prepare the file as the mode says and open it for appending (once)."""
        if self._sink is not None:
            return self
        self.check()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.mode == "resume" and self._has_lines():
            self._keep_results()
        append = self.mode == "resume"
        self._sink = self.path.open("a" if append else "w", encoding="utf-8")
        return self

    def _keep_results(self) -> None:
        kept: list[str] = []
        dropped = 0
        with self.path.open(encoding="utf-8", errors="replace") as old:
            for line in old:
                record = _parse(line)
                if record is None or "error" in record:
                    dropped += 1
                    continue
                kept.append(line if line.endswith("\n") else line + "\n")
                if isinstance(record.get("file"), str):
                    at = record.get("line")
                    self.done.add(input_key(record["file"], at if isinstance(at, int) else None))
        if dropped:
            temporary = self.path.with_name(self.path.name + ".tmp")
            with temporary.open("w", encoding="utf-8") as new:
                new.writelines(kept)
                new.flush()
                os.fsync(new.fileno())
            os.replace(temporary, self.path)

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one line and flush it to the operating system."""
        assert self._sink is not None, "open() first"
        self._sink.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._sink.flush()

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()
            self._sink = None

    def __enter__(self) -> Self:
        return self.open()


def _parse(line: str) -> dict[str, Any] | None:
    """The record on one line, or None for a line that is torn or not a record."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
