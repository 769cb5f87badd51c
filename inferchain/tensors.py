"""Tensor descriptors: what a model declares about each input and output."""

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
