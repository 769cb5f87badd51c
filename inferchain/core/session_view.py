"""What a worker knows of its loaded session's tensors: how a batch of a run is fed, how its
outputs are checked (rows on each output's batch axis, never trusted as declared) and how many
input elements it runs (padding included).

Made on the worker's thread when the session loads (again after a re-load), used there or on
the thread of an inline run, one run at a time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from inferchain.backends.base import Session
from inferchain.config import ModelConfig
from inferchain.core.buffers import HostBuffers
from inferchain.core.records import Run, Slice
from inferchain.layout import Layout, rows_first
from inferchain.output_rows import check_rows
from inferchain.shapes import ShapeKey
from inferchain.tensors import TensorDesc


class SessionView:
    """One loaded session's inputs, outputs and buffers, as a worker feeds and reads them."""

    def __init__(self, model: ModelConfig, session: Session, pad: float | Sequence[float]) -> None:
        self.model = model
        self.session = session
        self.batching = model.max_batch_size > 0
        layout = Layout.of(model, session.inputs, session.outputs)
        self.layout = layout
        self.moved_outputs = layout.moved_outputs  # (output, its batch axis) where not 0
        # what `collect` returns and where each keeps its rows (checked on every batch)
        self.returned: tuple[tuple[TensorDesc, ...], tuple[int, ...]] = (
            session.outputs,
            layout.outputs,
        )
        self.rows_first = all(a == 0 for a in layout.outputs)  # every output: rows on axis 0
        # ... and the session returns new arrays of exactly the rows asked for (checked)
        self.plain_rows = (
            self.batching
            and self.rows_first
            and not self.moved_outputs
            and not session.reuses_outputs
        )
        # rows an output may hold beyond a batch's own: the session's fixed batch, or the
        # rows a deterministic model pads every batch to
        self.padded_batch = model.pads_to(session.max_batch_size)
        self.buffers = HostBuffers(session.inputs, model.batch_rows, pad, layout.inputs)
        self._sizes: dict[ShapeKey, int] = {}  # elements of one row, per item shape key
        self._runs: dict[tuple[ShapeKey, int, int], tuple[int, int]] = {}  # `elements`, memoised

    def keep_state_on_device(self, carried: Sequence[int]) -> None:
        """The session keeps the outputs `carried` (indices) in its device state: `collect`
        returns only the others."""
        kept = [i for i in range(len(self.session.outputs)) if i not in carried]
        axes = tuple(self.layout.outputs[i] for i in kept)
        self.returned = (tuple(self.session.outputs[i] for i in kept), axes)
        self.moved_outputs = tuple((k, a) for k, a in enumerate(axes) if a != 0)
        self.plain_rows = self.plain_rows and not self.moved_outputs

    # -- feeding ----------------------------------------------------------------------------

    def feed(self, run: Run, i: int) -> list[np.ndarray]:
        """Batch `i` of `run` as the session's inputs, in the model's layout: a view of the
        caller's rows where they are exactly a batch, else copied (and padded) into the
        stream's buffers."""
        slices = run.slices
        if len(slices) == 1:  # the common case: consecutive rows of one work, as they are
            s = slices[0]
            work = s.work
            if self.buffers.plain and work.exact == run.shape_key and work.batched:
                start = s.start + i * run.size - s.offset
                stop = min(start + run.size, s.stop)
                inputs = work.inputs
                if len(inputs) == 1:
                    return [inputs[0][start:stop]]
                return [a[start:stop] for a in inputs]
        if run.rows <= run.size:  # the run is one batch
            return self.buffers.feed(run)
        lo = i * run.size
        hi = min(lo + run.size, run.rows)
        if len(slices) == 1:  # the common case: consecutive rows of one work
            s = slices[0]
            work = s.work
            start = s.start + lo - s.offset
            if self.buffers.plain and work.exact == run.shape_key:
                return [a[start : start + hi - lo] for a in work.inputs]
            part: tuple[Slice, ...] = (Slice(work, start, start + hi - lo, 0),)
        else:  # the slices' parts in rows [lo, hi) of the run, placed from the batch's row 0
            part = tuple(
                Slice(s.work, s.start + a - s.offset, s.start + b - s.offset, a - lo)
                for s in slices
                if (a := max(lo, s.offset)) < (b := min(hi, s.offset + s.stop - s.start))
            )
        return self.buffers.feed(run._replace(slices=part, rows=hi - lo))

    # -- reading outputs --------------------------------------------------------------------

    def outputs(self, outputs: Sequence[np.ndarray], n: int) -> tuple[np.ndarray, ...]:
        """The first `n` rows of each output, on axis 0 (a model that does not batch: the
        outputs whole); `OutputMismatch` where an output does not hold them."""
        if self.plain_rows:  # the common case, checked in one loop
            for o in outputs:
                if o.ndim == 0 or len(o) != n:
                    break
            else:
                return tuple(outputs)
        if not self.batching:
            return tuple(outputs)
        session = self.session
        descs, axes = self.returned
        padded = self.padded_batch
        if self.rows_first:  # the common case, checked without a call
            for o in outputs:
                if o.ndim == 0 or (len(o) != n and len(o) != padded):
                    check_rows(self.model.name, descs, axes, outputs, n, padded)  # raises
        else:
            check_rows(self.model.name, descs, axes, outputs, n, padded)
        if self.moved_outputs:
            moved = list(outputs)
            for i, axis in self.moved_outputs:  # a view: rows first, no copy
                moved[i] = rows_first(moved[i], axis)
            outputs = moved
        if session.reuses_outputs:
            return tuple(np.array(o[:n]) for o in outputs)
        if len(outputs) == 1 and len(outputs[0]) == n:  # the common case, without a loop
            return (outputs[0],)
        return tuple(o if len(o) == n else o[:n] for o in outputs)

    # -- elements run -----------------------------------------------------------------------

    def elements(self, run: Run) -> tuple[int, int]:
        """Input elements the model ran for `run` (its batched inputs, padding included),
        and of those padding: rows up to the session's padded batch, dims up to the key."""
        key, slices = run.shape_key, run.slices
        if len(slices) == 1 and slices[0].work.exact == key:  # rows padded at most
            memo = (key, run.rows, run.size)
            found = self._runs.get(memo)
            if found is not None:
                return found
            full, last = divmod(run.rows, run.size)
            ran, pad = self.padding(key, run.size)
            ran, pad = ran * full, pad * full
            if last:
                more, more_pad = self.padding(key, last)
                ran, pad = ran + more, pad + more_pad
            if len(self._runs) < 1024:
                self._runs[memo] = ran, pad
            return ran, pad
        if not self.batching:
            return 0, 0
        ran_rows = self.session.padded_rows(run.rows)
        per_row = self.row_elements(key)
        useful = sum(s.rows * self.row_elements(s.work.exact) for s in slices)
        return ran_rows * per_row, ran_rows * per_row - useful

    def padding(self, key: ShapeKey, rows: int) -> tuple[int, int]:
        """`elements` of a batch of `rows` rows of exactly the item shapes `key`."""
        if not self.batching:
            return 0, 0
        ran = self.session.padded_rows(rows)
        per_row = self.row_elements(key)
        return ran * per_row, (ran - rows) * per_row

    def row_elements(self, key: ShapeKey) -> int:
        """Elements of one row of the batched inputs of item shapes `key` (memoised)."""
        found = self._sizes.get(key)
        if found is None:
            axes = self.layout.inputs
            found = sum(math.prod(s) for s, a in zip(key, axes, strict=True) if a is not None)
            if len(self._sizes) < 1024:
                self._sizes[key] = found
        return found
