"""A worker's pre-allocated host input buffers, and filling them from a batch's slices.

One set per (stream, shape key), sized for the max batch, made once (kept LRU for dynamic
shapes). A batch that is exactly one slice of unpadded rows needs no buffer at all: its rows
are fed as they are (a view of the caller's array). Otherwise each slice costs one copy per
input, and rows smaller than the shape key are padded in the same step.

Works keep every input's rows on axis 0. An input whose model keeps them on another axis
(`batch_axis`) has a flat buffer instead, viewed per batch in the model's layout with just
the batch's rows, so it is contiguous; the slices are copied straight into it through that
view's rows (one copy, as for axis 0). An unbatched input is fed its one value. An input
whose rows are DeviceTensors (an earlier model's output kept on the device) is fed the
tensors, an object array, for the session to copy on the device.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from inferchain.core.records import Run, Slice
from inferchain.layout import Axis, rows_first
from inferchain.shapes import ShapeKey
from inferchain.tensors import TensorDesc

MAX_SHAPE_BUFFERS = 16  # buffer sets kept for dynamic shapes (LRU), at least


def pad_values(value: float | Sequence[float | bool], n: int) -> tuple[float | bool, ...]:
    """One pad value per input, from one for all or one each."""
    if isinstance(value, int | float):
        return (value,) * n
    values = tuple(value)
    if len(values) != n:
        raise ValueError(f"{len(values)} pad values for {n} inputs")
    return values


class HostBuffers:
    """Input buffers of one worker (used only on its thread)."""

    def __init__(
        self,
        inputs: Sequence[TensorDesc],
        rows: int,
        pad_value: float | Sequence[float | bool] = 0.0,
        axes: Sequence[Axis] | None = None,
    ) -> None:
        """`pad_value`: what padded rows hold, one value for all inputs or one per input."""
        self._dtypes = tuple(t.dtype for t in inputs)
        self._rows = rows  # the max batch
        self.pad_values = pad_values(pad_value, len(inputs))
        self.max_sets = MAX_SHAPE_BUFFERS
        self._sets: OrderedDict[tuple[int, ShapeKey], list[np.ndarray]] = OrderedDict()
        # per input, the model's dim of its rows (None: unbatched); all 0 unless told
        self._axes: tuple[Axis, ...] = tuple(axes) if axes is not None else (0,) * len(inputs)
        self.plain = all(a == 0 for a in self._axes)  # fed as stacked: no layout work

    def get(self, stream: int, key: ShapeKey) -> list[np.ndarray]:
        """The buffers for `key` on `stream`, made on first use: [max batch, *item shape]
        for an input with rows on axis 0, flat for one with another batch axis, the value's
        shape for an unbatched input."""
        found = self._sets.get((stream, key))
        if found is None:
            found = [
                self._make(shape, dtype, axis)
                for shape, dtype, axis in zip(key, self._dtypes, self._axes, strict=True)
            ]
            self._sets[(stream, key)] = found
            if len(self._sets) > self.max_sets:
                self._sets.popitem(last=False)
        else:
            self._sets.move_to_end((stream, key))
        return found

    def _make(self, shape: tuple[int, ...], dtype: np.dtype[np.generic], axis: Axis) -> np.ndarray:
        if axis == 0:
            return np.empty((self._rows, *shape), dtype)
        if axis is None:
            return np.empty(shape, dtype)
        return np.empty(self._rows * math.prod(shape), dtype)

    def feed(self, batch: Run) -> list[np.ndarray]:
        """The input arrays of `batch` (a run of one batch) in model input order and layout:
        `batch.rows` rows on each input's batch axis, an unbatched input's one value."""
        slices = batch.slices
        if len(slices) == 1:
            s = slices[0]
            work = s.work
            if not work.batched:
                return list(work.inputs)
            if self.plain and work.exact == batch.shape_key:
                return [a[s.start : s.stop] for a in work.inputs]
        if not self.plain:
            return self._feed_laid_out(batch)
        n = batch.rows
        views = [b[:n] for b in self.get(batch.stream, batch.shape_key)]
        for i, (view, shape) in enumerate(zip(views, batch.shape_key, strict=True)):
            if slices[0].work.inputs[i].dtype == object:
                views[i] = _handles(slices, i)
            else:
                self._fill(view, slices, i, shape)
        return views

    def _feed_laid_out(self, batch: Run) -> list[np.ndarray]:
        """`feed` for a model with another batch axis or an unbatched input."""
        n = batch.rows
        slices = batch.slices
        first = slices[0]
        exact = len(slices) == 1 and first.work.exact == batch.shape_key
        buffers = self.get(batch.stream, batch.shape_key)
        fed = []
        for i, (buffer, shape, axis) in enumerate(
            zip(buffers, batch.shape_key, self._axes, strict=True)
        ):
            if axis is None:  # every row has the same value: the first one's
                fed.append(first.work.inputs[i][first.start, ...])
            elif axis == 0 and exact:
                fed.append(first.work.inputs[i][first.start : first.stop])
            elif axis == 0 and first.work.inputs[i].dtype == object:
                fed.append(_handles(slices, i))
            elif axis == 0:
                rows = buffer[:n]
                self._fill(rows, slices, i, shape)
                fed.append(rows)
            else:
                laid_out = buffer[: n * math.prod(shape)].reshape(*shape[:axis], n, *shape[axis:])
                self._fill(rows_first(laid_out, axis), slices, i, shape)
                fed.append(laid_out)
        return fed

    def _fill(
        self, rows: np.ndarray, slices: Sequence[Slice], i: int, shape: tuple[int, ...]
    ) -> None:
        """Copy input `i` of each slice into its rows of `rows` (the batch's rows on axis 0),
        padding rows smaller than the batch's item `shape` with the input's pad value."""
        for s in slices:
            work = s.work
            dest = rows[s.offset : s.offset + s.stop - s.start]
            src = work.inputs[i][s.start : s.stop]
            small = work.exact[i]
            if small != shape:
                dest.fill(self.pad_values[i])
                dest[(slice(None), *(slice(0, d) for d in small))] = src
            else:
                dest[...] = src

    def zeros(self, stream: int, key: ShapeKey) -> list[np.ndarray]:
        """Zeros for a whole max batch of `key` in the model's layout, in the buffers of
        `key` on `stream` (made now if new): what a warm-up runs."""
        fed = []
        for buffer, shape, axis in zip(self.get(stream, key), key, self._axes, strict=True):
            buffer.fill(0)
            if axis is None or axis == 0:
                fed.append(buffer)
            else:
                fed.append(buffer.reshape(*shape[:axis], self._rows, *shape[axis:]))
        return fed

    def clear(self) -> None:
        self._sets.clear()


def _handles(slices: Sequence[Slice], i: int) -> np.ndarray:
    """Input `i` of the slices when its rows are DeviceTensors (an object array, one per
    row, see `inferchain.handover`): the tensors themselves, in batch order, for the
    session to copy on the device."""
    return np.concatenate([s.work.inputs[i][s.start : s.stop] for s in slices])
