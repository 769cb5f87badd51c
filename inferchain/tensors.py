"""The records both sides of the backend interface read: what a model declares about each
input and output (`TensorDesc`, `ModelInfo`), and where a batch's sequence state lives on the
device (`StateRows`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

Dim = int | None  # None marks a dynamic dimension


def _as_dtype(value: Any) -> np.dtype[Any]:
    dtype: np.dtype[Any] = np.dtype(value)
    return dtype


def _as_shape(value: Sequence[Dim]) -> tuple[Dim, ...]:
    return tuple(None if d is None or int(d) < 0 else int(d) for d in value)


@attrs.frozen
class TensorDesc:
    """One input or output of a model as the backend reports it.

    `shape` includes the batch dimension when the model has one; `None` marks a dynamic dim.
    """

    name: str
    shape: tuple[Dim, ...] = attrs.field(converter=_as_shape)
    dtype: np.dtype[Any] = attrs.field(converter=_as_dtype)

    @property
    def is_static(self) -> bool:
        """True when every dimension is fixed."""
        return all(d is not None for d in self.shape)

    def item_shape(self) -> tuple[Dim, ...]:
        """The shape of one item: the model's shape without the leading batch dimension."""
        return self.shape[1:]

    def describe(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype.name}[{dims}]"

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype.name}


@attrs.frozen
class ModelInfo:
    """The IO description of a loaded model, as `OfflineInference.model_info()` returns it."""

    name: str
    inputs: tuple[TensorDesc, ...]
    outputs: tuple[TensorDesc, ...]
    max_batch_size: int  # 0: the model does not batch; items are whole model inputs
    instances: int
    metadata: Mapping[str, str] = attrs.field(factory=dict)  # e.g. ONNX custom metadata

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "max_batch_size": self.max_batch_size,
            "instances": self.instances,
            "metadata": dict(self.metadata),
        }


@attrs.frozen(eq=False)
class StateRows:
    """Where the carried state of a batch of sequence steps lives, for a session that keeps
    it in device lanes (`Session.open_state`): per batch row, the lane its state is read
    from, the lane its carried outputs go to, and whether it is a sequence's first step
    (its state is then the host input row: the initial value), and the first lane of its
    sequence (`home`: where the sequence's constant inputs are kept, one copy for all its
    rows; None: each row's own `write` lane)."""

    read: np.ndarray  # intp, one per row (a reorder reads another row's lane)
    write: np.ndarray  # intp, one per row
    fresh: np.ndarray  # bool, one per row
    home: np.ndarray | None = None  # intp, one per row: its sequence's first lane

    @property
    def homes(self) -> np.ndarray:
        """Per row, the lane that holds its sequence's constant inputs."""
        return self.write if self.home is None else self.home

    def part(self, start: int, stop: int) -> StateRows:
        """The rows `start:stop` (a batch that holds part of a work)."""
        if start == 0 and stop == len(self.read):
            return self
        cut = slice(start, stop)
        home = None if self.home is None else self.home[cut]
        return StateRows(self.read[cut], self.write[cut], self.fresh[cut], home)

    @staticmethod
    def join(parts: Sequence[StateRows]) -> StateRows:
        """One batch's rows from its works' parts, in order."""
        if len(parts) == 1:
            return parts[0]
        return StateRows(
            np.concatenate([p.read for p in parts]),
            np.concatenate([p.write for p in parts]),
            np.concatenate([p.fresh for p in parts]),
            np.concatenate([p.homes for p in parts]),
        )

    def stepped(self) -> StateRows:
        """The same rows at their next step: each reads the lane it wrote, none is fresh."""
        return StateRows(self.write, self.write, np.zeros(len(self.write), bool), self.home)
