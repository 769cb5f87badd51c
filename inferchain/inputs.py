"""Turning user inputs into one item's arrays, checked against the model's description."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inferchain.errors import InvalidInput
from inferchain.tensors import Dim, TensorDesc


def _fmt(shape: Sequence[Dim]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


class InputSpec:
    """What one item of a model must look like, and the check run at `submit()`.

    For a batching model an item is each input without the leading batch dimension; for a
    model with `max_batch_size: 0` it is the whole input as the model declares it. Arrays of
    another dtype are cast only when numpy calls the cast safe (e.g. uint8 -> float32).
    """

    def __init__(
        self,
        model: str,
        inputs: Sequence[TensorDesc],
        batching: bool,
        reject_nonfinite: bool = False,
    ) -> None:
        self.model = model
        self.reject_nonfinite = reject_nonfinite  # NaN / inf in a float input -> InvalidInput
        self.names = tuple(t.name for t in inputs)
        self.dtypes = tuple(t.dtype for t in inputs)
        self.batching = batching
        self.shapes = tuple(t.item_shape() if batching else t.shape for t in inputs)
        self._index = {name: i for i, name in enumerate(self.names)}
        # the common case checked in one comparison: an ndarray of the exact dtype and shape
        self._exact = tuple(
            (dtype, shape) if None not in shape else None
            for dtype, shape in zip(self.dtypes, self.shapes, strict=True)
        )

    def normalize(self, inputs: Any) -> tuple[np.ndarray, ...]:
        """Arrays in the model's input order, each checked; raises `InvalidInput`."""
        if type(inputs) is np.ndarray and len(self.names) == 1:
            return (self._check(0, inputs),)
        if isinstance(inputs, Mapping):
            arrays = self._from_mapping(inputs)
        elif isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
            if len(self.names) != 1:
                raise InvalidInput(
                    f"model {self.model!r} takes {len(self.names)} inputs "
                    f"{list(self.names)}; got a single array"
                )
            arrays = [inputs]
        else:
            if len(inputs) != len(self.names):
                raise InvalidInput(
                    f"model {self.model!r} takes {len(self.names)} inputs "
                    f"{list(self.names)}; got a sequence of {len(inputs)}"
                )
            arrays = list(inputs)
        return tuple(self._check(i, a) for i, a in enumerate(arrays))

    def rows(self, block: np.ndarray) -> np.ndarray:
        """A one-input model's items stacked as the rows of one array, checked at once."""
        exact = self._exact[0]
        if exact is not None and block.dtype == exact[0] and block.shape[1:] == exact[1]:
            return block
        name, dtype, shape = self.names[0], self.dtypes[0], self.shapes[0]
        where = f"model {self.model!r} input {name!r}"
        if block.ndim != len(shape) + 1 or any(
            d is not None and d != a for d, a in zip(shape, block.shape[1:], strict=True)
        ):
            raise InvalidInput(
                f"{where}: expected rows of shape {_fmt(shape)}, got an array of "
                f"{block.shape[0] if block.ndim else 0} rows of shape {_fmt(block.shape[1:])}"
            )
        if block.dtype != dtype:
            if not np.can_cast(block.dtype, dtype, "safe"):
                raise InvalidInput(
                    f"{where}: expected dtype {dtype.name}, got {block.dtype.name} "
                    "(only safe casts are applied)"
                )
            block = block.astype(dtype)
        if self.reject_nonfinite and block.dtype.kind in "fc" and not np.isfinite(block).all():
            raise InvalidInput(
                f"{where}: NaN or infinite values (the model's nonfinite policy is reject)"
            )
        return block

    @property
    def takes_rows(self) -> bool:
        """True when items may come as the rows of one array (one batched input)."""
        return len(self.names) == 1 and self.batching

    def _from_mapping(self, inputs: Mapping[str, Any]) -> list[Any]:
        unknown = [k for k in inputs if k not in self._index]
        missing = [n for n in self.names if n not in inputs]
        if unknown or missing:
            raise InvalidInput(
                f"model {self.model!r} takes inputs {list(self.names)}; "
                f"unknown: {unknown}, missing: {missing}"
            )
        return [inputs[n] for n in self.names]

    def _check(self, i: int, value: Any) -> np.ndarray:
        array = self._check_layout(i, value)
        if self.reject_nonfinite and array.dtype.kind in "fc" and not np.isfinite(array).all():
            bad = int(array.size - np.count_nonzero(np.isfinite(array)))
            raise InvalidInput(
                f"model {self.model!r} input {self.names[i]!r}: {bad} NaN or infinite values "
                "(the model's nonfinite policy is reject)"
            )
        return array

    def _check_layout(self, i: int, value: Any) -> np.ndarray:
        exact = self._exact[i]
        if (
            exact is not None
            and type(value) is np.ndarray
            and value.dtype == exact[0]
            and value.shape == exact[1]
        ):
            return value
        name, dtype, shape = self.names[i], self.dtypes[i], self.shapes[i]
        where = f"model {self.model!r} input {name!r}"
        if isinstance(value, np.ndarray):
            array = value
            if array.dtype != dtype:
                if not np.can_cast(array.dtype, dtype, "safe"):
                    raise InvalidInput(
                        f"{where}: expected dtype {dtype.name}, got {array.dtype.name} "
                        "(only safe casts are applied)"
                    )
                array = array.astype(dtype)
        else:
            try:
                array = np.asarray(value, dtype=dtype)
            except (TypeError, ValueError) as e:
                raise InvalidInput(f"{where}: cannot convert to {dtype.name}: {e}") from None
        if array.ndim != len(shape) or any(
            d is not None and d != a for d, a in zip(shape, array.shape, strict=True)
        ):
            raise InvalidInput(f"{where}: expected shape {_fmt(shape)}, got {_fmt(array.shape)}")
        return array


Item = tuple[np.ndarray, ...]  # one item's arrays, in model input order


def runs(items: Sequence[Item]) -> list[tuple[int, int]]:
    """Ranges [start, stop) of consecutive items whose arrays have equal shapes."""
    out: list[tuple[int, int]] = []
    start = 0
    shapes = None
    for i, item in enumerate(items):
        s = tuple(a.shape for a in item)
        if s != shapes:
            if i:
                out.append((start, i))
            start, shapes = i, s
    if items:
        out.append((start, len(items)))
    return out


def stack(items: Sequence[Item]) -> Item:
    """Same-shape items as one array per input, item i in row i (a view for one item)."""
    if len(items) == 1:
        return tuple(a[None] for a in items[0])
    return tuple(np.stack(column) for column in zip(*items, strict=True))
