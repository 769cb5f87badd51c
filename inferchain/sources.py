"""The items a pipeline reads from the paths a user gives: one rule for `run`, `bench`,
`info --input` and `compare --batch-invariance`.

A path is a file (one item) or a folder (its files of the kinds the pipeline reads,
`Pipeline.input_files`); a pipeline with `item_per_line` reads each non-blank line of each
file as one item instead. Without paths, the recipe's `inputs:`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from inferchain.config import Recipe
from inferchain.errors import ConfigError
from inferchain.pipeline import Pipeline
from inferchain.resume import input_key


def sources_of(recipe: Recipe, given: Sequence[Path] | None) -> list[Path]:
    """The paths given (`--input`), or the recipe's `inputs:`; each must exist."""
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


def load_item(pipeline: Pipeline, item: Item) -> object:
    """The pipeline's item of a file (`load`) or of a line (`load_line`)."""
    return pipeline.load(item.file) if item.line is None else pipeline.load_line(item.text)
