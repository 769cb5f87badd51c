"""The rows a model's batches really held, kept as it ran them: the steps of a stateful
model for `inferchain compare --batch-invariance` (each step row is a function of its
inputs, the carried state among them, so it can run again in other batches)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inferchain.backends.base import Backend, Session
from inferchain.config import ModelConfig
from inferchain.layout import Layout

Row = dict[str, Any]  # input name -> one row's array (an unbatched input: its value)


class RecordingBackend(Backend):
    """`inner`, whose sessions of the models in `kept` keep up to `limit` rows each of the
    batches they run, in the order run (input name -> row, as `submit` takes an item)."""

    def __init__(self, inner: Backend, models: Sequence[str], limit: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.thread_affine = inner.thread_affine
        self.kept: dict[str, list[Row]] = {m: [] for m in models}
        self.limit = limit

    def load(self, model: ModelConfig, device: int) -> Session:
        session = self.inner.load(model, device)
        if model.name not in self.kept:
            return session
        layout = Layout.of(model, session.inputs, session.outputs)
        return RecordingSession(session, layout.inputs, self.kept[model.name], self.limit)

    def close(self) -> None:
        self.inner.close()


class RecordingSession(Session):
    """A session that keeps the rows of the batches it runs (see `RecordingBackend`)."""

    def __init__(
        self, inner: Session, axes: Sequence[int | None], kept: list[Row], limit: int
    ) -> None:
        self.inner = inner
        self.inputs, self.outputs = inner.inputs, inner.outputs
        self.max_batch_size = inner.max_batch_size
        self.reuses_outputs = inner.reuses_outputs
        self._axes = tuple(axes)
        self._kept = kept
        self._limit = limit
        self._seen = 0  # rows run so far
        self._rng = np.random.default_rng(0)

    def run(self, inputs: Sequence[np.ndarray], batch_size: int) -> list[np.ndarray]:
        self._keep(inputs, batch_size)
        return self.inner.run(inputs, batch_size)

    def padded_rows(self, rows: int) -> int:
        return self.inner.padded_rows(rows)

    def _keep(self, inputs: Sequence[np.ndarray], rows: int) -> None:
        """A uniform sample of `limit` rows of all the batches run so far (reservoir
        sampling, seeded): rows of the whole job, not only its first batches."""
        names = [t.name for t in self.inputs]
        columns = [
            None if axis is None else np.moveaxis(np.asarray(a), axis, 0)[:rows]
            for a, axis in zip(inputs, self._axes, strict=True)
        ]
        for j in range(rows):
            self._seen += 1
            at = len(self._kept)
            if at >= self._limit:
                at = int(self._rng.integers(self._seen))
                if at >= self._limit:
                    continue
            row = {
                name: np.array(a) if c is None else np.array(c[j])
                for name, a, c in zip(names, inputs, columns, strict=True)
            }
            if at == len(self._kept):
                self._kept.append(row)
            else:
                self._kept[at] = row

    def close(self) -> None:
        self.inner.close()
