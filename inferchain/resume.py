"""What makes a batch run resumable: inputs keyed by what cannot change, lossless records.

An input is recognised by `input_key`: its file's resolved path (and the line, where each
line is an item), the same from any working directory. A record is one JSON line
(`json_line`): file names that are not UTF-8 (bytes Python holds as lone surrogates, the
`os.fsdecode` / `surrogateescape` way) are written as `\\udcXX` escapes, which read back
(`parse_line`) as the same string, so `os.fsencode` gives the name's bytes again. On a
resume, the records kept are matched back to input positions (`match_positions`): in
input order, one record per position, a file given twice (or two links to it) twice.

Byte for byte also needs each row's outputs to be the ones it had: `batches_formed_anew`
names the models whose batches a resume forms anew (so a row may share its batch with
others than in a run straight through), which `inferchain run --resume` warns about.
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

from inferchain.config import Recipe

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


def batches_formed_anew(recipe: Recipe) -> list[str]:
    """The models of `recipe` whose rows a resumed job may run beside other rows than a run
    straight through did, with other bytes: all but those that run every batch at one
    shape (`deterministic`), those measured not to depend on what shares a batch
    (`batch_invariant`), those whose batches are a function of input positions (`batching:
    fill`, anchored by the pipeline) and those that run each item alone at its own shape
    (at most one row a batch, no `longest` or `auto` padding, no state)."""
    return [
        m.name
        for m in recipe.models
        if not m.deterministic
        and not m.batch_invariant
        and m.batching != "fill"
        and (m.batch_rows > 1 or m.state or m.shapes.strategy in ("longest", "auto"))
    ]


def resume_warning(model: str) -> str:
    """The one line `run --resume` prints for a model of `batches_formed_anew`."""
    return (
        f"warning: --resume: model {model!r} is not deterministic: its resumed rows run in "
        "other batches than a run straight through, and where its outputs depend on what "
        "shares a batch (`inferchain compare --batch-invariance`) their last digits may "
        "differ; for byte-identical results run with --deterministic or set "
        "`deterministic: true`"
    )
