"""What a recipe's pipeline reads from input files (`inferchain info RECIPE --input PATH`).

The pipeline runs in an OfflineInference of the recipe started without warm-up (its
`__init__` may ask for a model's description), and describes what its `load` makes of each
file (`Pipeline.describe_load`: for an image pipeline, the file's format, mode and size and
the pixels its reader gives: shape, dtype, channel order, alpha and EXIF handling).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from inferchain.config import Recipe
from inferchain.offline import OfflineInference
from inferchain.sources import input_files, input_items


def describe_inputs(recipe: Recipe, sources: Sequence[Path]) -> list[str]:
    """One line per input: what the recipe's pipeline reads from it."""
    cold = attrs.evolve(recipe, models=tuple(attrs.evolve(m, warmup=False) for m in recipe.models))
    with OfflineInference(cold) as oi:
        pipeline = oi.pipeline
        items = input_items(input_files(sources, pipeline), pipeline)
        lines = []
        for item in items:
            if item.line is None:
                lines.append(pipeline.describe_load(item.file))
            else:
                lines.append(f"{item.file}:{item.line}: {pipeline.load_line(item.text)!r}")
        return lines
