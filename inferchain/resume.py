"""What makes a batch run resumable: inputs keyed by what cannot change, lossless records.

An input is recognised by `input_key`: its file's resolved path (and the line, where each
line is an item), the same from any working directory. A record is one JSON line
(`json_line`): file names that are not UTF-8 (bytes Python holds as lone surrogates, the
`os.fsdecode` / `surrogateescape` way) are written as `\\udcXX` escapes, which read back
(`parse_line`) as the same string, so `os.fsencode` gives the name's bytes again. On a
resume, the records kept are matched back to input positions (`match_positions`): in
input order, one record per position, a file given twice (or two links to it) twice.
"""

from __future__ import annotations

import bisect
import functools
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def input_key(file: str | Path, line: int | None = None) -> str:
    """How an input is recognised across runs: its file's absolute, resolved path, and the
    line number where each line of the file is an item."""
    path = _resolved(os.getcwd(), str(file))
    return path if line is None else f"{path}:{line}"


@functools.lru_cache(maxsize=1024)
def _resolved(cwd: str, file: str) -> str:
    """A file's absolute, resolved path from `cwd` (once per file: each of its lines asks)."""
    return str((Path(cwd) / file).resolve())


def json_line(record: Mapping[str, Any]) -> str:
    """`record` as one line of UTF-8 JSON (ending in a newline), non-ASCII text as it is
    and lone surrogates (undecodable bytes of a file name) as `\\uXXXX` escapes."""
    text = json.dumps(record, ensure_ascii=False)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n"


def parse_line(raw: bytes) -> dict[str, Any] | None:
    """The record on one raw line, or None unless it is whole: UTF-8, a JSON object, and
    ending in a newline (a last line a kill cut short, or one that lost its newline, is not)."""
    if not raw.endswith(b"\n"):
        return None
    try:
        record = json.loads(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
        return None
    return record if isinstance(record, dict) else None


def record_key(record: Mapping[str, Any]) -> str | None:
    """The input a record is of: its `key`, or (records without one) its `file` and `line`
    resolved from here; None when it names no file."""
    key = record.get("key")
    if isinstance(key, str):
        return key
    file = record.get("file")
    if not isinstance(file, str):
        return None
    line = record.get("line")
    return input_key(file, line if isinstance(line, int) else None)


def match_positions(found: Sequence[str | None], inputs: Sequence[str]) -> list[int | None]:
    """For each record kept (its key, in the order written), the input position it is the
    record of: the first position of its key after the previous record's (records are
    written in input order), else the first of its key not yet matched (a file written out
    of order), else None (not an input of this run). No position is matched twice."""
    free: dict[str, list[int]] = {}  # key -> its positions not yet matched, ascending
    for position, key in enumerate(inputs):
        free.setdefault(key, []).append(position)
    matched: list[int | None] = []
    last = -1
    for name in found:
        positions = free.get(name) if name is not None else None
        if not positions:
            matched.append(None)
            continue
        at = bisect.bisect_right(positions, last)
        position = positions.pop(at if at < len(positions) else 0)
        last = max(last, position)
        matched.append(position)
    return matched
