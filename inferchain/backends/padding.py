"""Batches padded to a model's fixed batch: the one rule the CPU runtimes' sessions share.

The fixed batch is the model file's own (a static batch dim), or for a `deterministic`
model its `max_batch_size`: every batch then runs at that many rows, so a row's outputs
never depend on how many rows share its batch (`ModelConfig.pads_to`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from inferchain.layout import Axis

_SHAPES_KEPT = 8  # buffers kept for this many item shapes (a model's buckets), then renewed


class FixedBatch:
    """A model's fixed batch (`limit`; None: it takes any batch): a smaller batch's rows are
    copied into buffers of the fixed batch (made once per item shape, e.g. per bucket, on
    each input's batch axis; the rows past the batch keep stale values, whose outputs are
    dropped); an unbatched input passes as it is."""

    def __init__(self, limit: int | None, axes: Sequence[Axis]) -> None:
        self.limit = limit  # the model's fixed batch, or None
        self._axes = tuple(axes)  # per input, the dim of its rows (None: unbatched)
        self._buffers: dict[tuple[object, ...], list[np.ndarray | None]] = {}

    def padded_rows(self, rows: int) -> int:
        """The rows a batch of `rows` runs as (`Session.padded_rows`)."""
        return max(rows, self.limit or 0)

    def pad(self, inputs: Sequence[np.ndarray], batch_size: int) -> Sequence[np.ndarray]:
        """`inputs` of `batch_size` rows as the model takes them: as they are, or in
        buffers of `limit` rows."""
        if self.limit is None or batch_size >= self.limit:
            return inputs
        key = tuple((a.shape if axis is None else _with_dim(a.shape, axis, 0), a.dtype)
                    for a, axis in zip(inputs, self._axes, strict=True))  # fmt: skip
        buffers = self._buffers.get(key)
        if buffers is None:
            if len(self._buffers) >= _SHAPES_KEPT:
                self._buffers.clear()
            buffers = self._buffers[key] = [
                None if axis is None else np.zeros(_with_dim(a.shape, axis, self.limit), a.dtype)
                for a, axis in zip(inputs, self._axes, strict=True)
            ]
        out = []
        for buf, a, axis in zip(buffers, inputs, self._axes, strict=True):
            if buf is None or axis is None:
                out.append(a)
                continue
            np.moveaxis(buf, axis, 0)[:batch_size] = np.moveaxis(a, axis, 0)[:batch_size]
            out.append(buf)
        return out


def _with_dim(shape: tuple[int, ...], axis: int, size: int) -> tuple[int, ...]:
    return (*shape[:axis], size, *shape[axis + 1 :])
