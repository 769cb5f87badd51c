"""A worker's pre-allocated host input buffers, and filling them from a batch's slices.

One set per (stream, shape key), sized for the max batch, made once (kept LRU for dynamic
shapes). A batch that is exactly one slice of unpadded rows needs no buffer at all: its rows
are fed as they are (a view of the caller's array). Otherwise each slice costs one copy per
input, and rows smaller than the shape key are padded in the same step.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from inferchain.core.records import Batch, ShapeKey
from inferchain.tensors import TensorDesc

MAX_SHAPE_BUFFERS = 16  # buffer sets kept for dynamic shapes (LRU), at least


class HostBuffers:
    """Input buffers of one worker (used only on its thread)."""

    def __init__(self, inputs: Sequence[TensorDesc], rows: int, pad_value: float = 0.0) -> None:
        self._dtypes = tuple(t.dtype for t in inputs)
        self._rows = rows  # the max batch
        self.pad_value = pad_value
        self.max_sets = MAX_SHAPE_BUFFERS
        self._sets: OrderedDict[tuple[int, ShapeKey], list[np.ndarray]] = OrderedDict()

    def get(self, stream: int, key: ShapeKey) -> list[np.ndarray]:
        """The buffers for `key` on `stream`, made on first use."""
        found = self._sets.get((stream, key))
        if found is None:
            found = [
                np.empty((self._rows, *shape), dtype)
                for shape, dtype in zip(key, self._dtypes, strict=True)
            ]
            self._sets[(stream, key)] = found
            if len(self._sets) > self.max_sets:
                self._sets.popitem(last=False)
        else:
            self._sets.move_to_end((stream, key))
        return found

    def feed(self, batch: Batch) -> list[np.ndarray]:
        """The batch's input arrays, `batch.rows` rows each, in model input order."""
        slices = batch.slices
        if len(slices) == 1:
            s = slices[0]
            work = s.work
            if not work.batched:
                return list(work.inputs)
            if work.exact == batch.shape_key:
                return [a[s.start : s.stop] for a in work.inputs]
        n = batch.rows
        views = [b[:n] for b in self.get(batch.stream, batch.shape_key)]
        for s in slices:
            work = s.work
            end = s.offset + s.stop - s.start
            padded = work.exact != batch.shape_key
            for view, src, shape in zip(views, work.inputs, work.exact, strict=True):
                rows = view[s.offset : end]
                if padded and shape != view.shape[1:]:
                    rows.fill(self.pad_value)
                    rows[(slice(None), *(slice(0, d) for d in shape))] = src[s.start : s.stop]
                else:
                    rows[...] = src[s.start : s.stop]
        return views

    def clear(self) -> None:
        self._sets.clear()
