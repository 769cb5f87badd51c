"""The gears of an acl model and which one a batch runs: batch gears, image-size gears or
dims gears (ATC's `--dynamic_batch_size`, `--dynamic_image_size`, `--dynamic_dims`).

A dims gear fixes every dynamic dim of every input: `mdl.get_input_dynamic_dims` reports
each gear as the inputs' shapes concatenated in input order. A batch takes the gear whose
shapes equal its inputs' shapes, except on each batched input's batch axis, where the gear
may hold more rows (the padding); of those, the one with the fewest rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import attrs

from inferchain.layout import Axis

Shape = tuple[int, ...]


@attrs.frozen
class DimsGear:
    """One dims gear: each data input's shape, and the rows it runs."""

    shapes: tuple[Shape, ...]  # per data input, in input order
    batch: int  # rows on the batch axis of the batched inputs (the static batch: 1)

    @property
    def values(self) -> list[int]:
        """As `set_input_dynamic_dims` takes it: the shapes concatenated."""
        return [d for s in self.shapes for d in s]


def split_dims(dims: Sequence[int], ranks: Sequence[int], axes: Sequence[Axis]) -> DimsGear | None:
    """A gear from its concatenated dims, cut by the inputs' ranks; None where the dims do
    not add up to the ranks, or the batched inputs disagree on the rows."""
    if len(dims) != sum(ranks):
        return None
    shapes, at = [], 0
    for rank in ranks:
        shapes.append(tuple(int(d) for d in dims[at : at + rank]))
        at += rank
    rows = {s[a] for s, a in zip(shapes, axes, strict=True) if a is not None and a < len(s)}
    if len(rows) > 1:
        return None
    return DimsGear(tuple(shapes), rows.pop() if rows else 1)


def pick_dims(
    gears: Sequence[DimsGear], shapes: Sequence[Shape], axes: Sequence[Axis], rows: int
) -> DimsGear | None:
    """The gear with the fewest rows >= `rows` whose shapes equal `shapes` (the batch's
    inputs, `rows` on their batch axes) off the batch axes; None when there is none."""
    best: DimsGear | None = None
    for gear in gears:
        if gear.batch < rows or (best is not None and gear.batch >= best.batch):
            continue
        if all(_fits(g, s, a) for g, s, a in zip(gear.shapes, shapes, axes, strict=True)):
            best = gear
    return best


def _fits(gear: Shape, shape: Shape, axis: Axis) -> bool:
    if len(gear) != len(shape):
        return False
    return all(g == s or k == axis for k, (g, s) in enumerate(zip(gear, shape, strict=True)))


def batch_gear(gears: Sequence[int], rows: int) -> int:
    """The smallest batch gear >= rows (gears sorted, rows <= the largest)."""
    return gears[bisect.bisect_left(gears, rows)]


def with_rows(shape: Shape, axis: int, rows: int) -> Shape:
    """`shape` with `rows` on dim `axis`."""
    return (*shape[:axis], rows, *shape[axis + 1 :])
