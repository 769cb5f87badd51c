"""Batches padded to a model's fixed batch: the one rule the CPU runtimes' sessions share."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from inferchain.layout import Axis


class FixedBatch:
    """Copies a batch's rows into buffers of the model's fixed batch (made once, on each
    input's batch axis; the rows past the batch keep stale values, whose outputs are
    dropped); an unbatched input passes as it is."""

    def __init__(self, rows: int, axes: Sequence[Axis]) -> None:
        self.rows = rows  # the model's fixed batch
        self._axes = tuple(axes)  # per input, the dim of its rows (None: unbatched)
        self._buffers: list[np.ndarray | None] | None = None

    def pad(self, inputs: Sequence[np.ndarray], batch_size: int) -> list[np.ndarray]:
        """`inputs` of `batch_size` rows as inputs of `rows` rows."""
        if self._buffers is None:
            self._buffers = [
                None if axis is None else np.zeros(_with_dim(a.shape, axis, self.rows), a.dtype)
                for a, axis in zip(inputs, self._axes, strict=True)
            ]
        out = []
        for buf, a, axis in zip(self._buffers, inputs, self._axes, strict=True):
            if buf is None or axis is None:
                out.append(a)
                continue
            np.moveaxis(buf, axis, 0)[:batch_size] = np.moveaxis(a, axis, 0)[:batch_size]
            out.append(buf)
        return out


def _with_dim(shape: tuple[int, ...], axis: int, size: int) -> tuple[int, ...]:
    return (*shape[:axis], size, *shape[axis + 1 :])
