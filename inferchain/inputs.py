"""Turning user inputs into one item's arrays, checked against the model's description."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from inferchain.errors import InvalidInput
from inferchain.handover import DeviceTensor
from inferchain.layout import Layout
from inferchain.tensors import Dim, TensorDesc


def _fmt(shape: Sequence[Dim]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def _given(value: object) -> str:
    """What a caller passed, for a message: None, a string, or the type."""
    if value is None:
        return "None"
    if isinstance(value, str | bytes):
        text = repr(value)
        return f"a {type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
    return f"a {type(value).__name__}"


class InputSpec:
    """What one item of a model must look like, and the check run at `submit()`.

    For a batching model an item is each input without its batch dimension (the leading one,
    or the `batch_axis` the recipe gives), and an unbatched input's one value as the model
    declares it; for a model with `max_batch_size: 0` it is the whole input as the model
    declares it. Arrays of another dtype are cast only when numpy calls the cast safe (e.g.
    uint8 -> float32). An input in `handed` (its recipe `from:`, on a backend that keeps it
    on the device) also takes a `DeviceTensor` of exactly its item shape and dtype; rows of
    them travel as an object array of the tensors, one per row.
    """

    def __init__(
        self,
        model: str,
        inputs: Sequence[TensorDesc],
        batching: bool,
        reject_nonfinite: bool = False,
        layout: Layout | None = None,
        handed: Collection[int] = (),
    ) -> None:
        self.model = model
        self.handed = frozenset(handed)  # inputs (indices) that take DeviceTensors
        self.reject_nonfinite = reject_nonfinite  # NaN / inf in a float input -> InvalidInput
        self.names = tuple(t.name for t in inputs)
        self.dtypes = tuple(t.dtype for t in inputs)
        self.batching = batching
        layout = layout or Layout.plain(len(inputs), 0)
        self.shapes = layout.item_shapes(inputs) if batching else tuple(t.shape for t in inputs)
        # unbatched inputs (indices): items share a batch only when their values are equal
        self.unbatched = layout.unbatched if batching else ()
        self._hints = tuple(_axis_hint(t, a) for t, a in zip(inputs, layout.inputs, strict=True))
        self._index = {name: i for i, name in enumerate(self.names)}
        # the common case checked in one comparison: an ndarray of the exact dtype and shape
        self._exact = tuple(
            (dtype, shape) if None not in shape else None
            for dtype, shape in zip(self.dtypes, self.shapes, strict=True)
        )

    def normalize(self, inputs: Any) -> tuple[np.ndarray, ...]:
        """Arrays in the model's input order, each checked; raises `InvalidInput`."""
        if type(inputs) is np.ndarray and len(self.names) == 1:
            exact = self._exact[0]
            if (  # the common case, checked in one comparison
                exact is not None
                and inputs.dtype == exact[0]
                and inputs.shape == exact[1]
                and not self.reject_nonfinite
            ):
                return (inputs,)
            return (self._check(0, inputs),)
        if isinstance(inputs, Mapping):
            arrays = self._from_mapping(inputs)
        elif not isinstance(inputs, Sequence) or isinstance(inputs, str | bytes):
            if len(self.names) != 1:
                one = "a single array" if isinstance(inputs, np.ndarray) else _given(inputs)
                raise InvalidInput(
                    f"model {self.model!r} takes {len(self.names)} inputs "
                    f"{list(self.names)}; got {one}"
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

    def step_item(
        self, inputs: Mapping[str, Any], carried: Mapping[int, np.ndarray]
    ) -> tuple[np.ndarray, ...]:
        """One sequence step's arrays in the model's input order: `inputs` (name -> value)
        checked for the inputs that are not carried, `carried` (index -> value) for the
        others, as they are."""
        if len(inputs) + len(carried) == len(self.names):  # then no name is unknown ...
            try:
                return tuple(
                    carried[i] if i in carried else self._check(i, inputs[name])
                    for i, name in enumerate(self.names)
                )
            except KeyError:  # ... unless one is missing
                pass
        self._check_step_names(inputs, carried)
        raise AssertionError("unreachable: the names were wrong")

    def step_columns(
        self, inputs: Mapping[str, Any], carried: Mapping[int, Any]
    ) -> list[np.ndarray | None]:
        """The inputs of a step of several rows, each checked at once as the rows of one
        array, in the model's input order (None for the `carried` indices)."""
        self._check_step_names(inputs, carried)
        return [
            None if i in carried else self.block(i, np.asarray(inputs[name]))
            for i, name in enumerate(self.names)
        ]

    def _check_step_names(self, inputs: Mapping[str, Any], carried: Mapping[int, Any]) -> None:
        if len(inputs) + len(carried) != len(self.names) or any(
            self._index.get(n, -1) in carried or n not in self._index for n in inputs
        ):
            taken = [n for i, n in enumerate(self.names) if i not in carried]
            unknown = [n for n in inputs if n not in taken]
            missing = [n for n in taken if n not in inputs]
            raise InvalidInput(
                f"model {self.model!r}: a step takes inputs {taken}; "
                f"unknown: {unknown}, missing: {missing}"
            )

    def rows(self, block: np.ndarray) -> np.ndarray:
        """A one-input model's items stacked as the rows of one array, checked at once."""
        return self.block(0, block)

    def block(self, i: int, block: np.ndarray) -> np.ndarray:
        """Items of input `i` stacked as the rows of one array, checked at once."""
        exact = self._exact[i]
        if exact is not None and block.dtype == exact[0] and block.shape[1:] == exact[1]:
            return block
        name, dtype, shape = self.names[i], self.dtypes[i], self.shapes[i]
        where = f"model {self.model!r} input {name!r}"
        if block.dtype == object and block.ndim == 1 and i in self.handed:
            for value in block:  # rows of DeviceTensors (a producer's `map_batches` column)
                if not isinstance(value, DeviceTensor):
                    raise InvalidInput(f"{where}: rows of DeviceTensors, got {_given(value)}")
                self._on_device(i, value, where)
            return block
        if block.ndim != len(shape) + 1 or any(
            d is not None and d != a for d, a in zip(shape, block.shape[1:], strict=True)
        ):
            raise InvalidInput(
                f"{where}: expected rows of shape {_fmt(shape)}, got an array of "
                f"{block.shape[0] if block.ndim else 0} rows of shape {_fmt(block.shape[1:])}"
            )
        block = _safe_cast(block, dtype, where)
        if self.reject_nonfinite and block.dtype.kind in "fc" and not np.isfinite(block).all():
            raise InvalidInput(
                f"{where}: NaN or infinite values (the model's nonfinite policy is reject)"
            )
        return block

    def groups(self, items: Any) -> list[Item]:
        """`items` checked, as the rows of one array per input for each run of consecutive
        items of equal shapes (and equal values of the unbatched inputs); an array whose
        rows are the items is checked at once and kept as it is; for a model with
        `max_batch_size: 0` each item on its own. Raises `InvalidInput`."""
        if isinstance(items, np.ndarray) and self.takes_rows:
            block = self.rows(items)
            return [(block,)] if len(block) else []
        arrays = [self.normalize(item) for item in items]
        if not self.batching:
            return arrays
        unbatched = self.unbatched
        if len(arrays) == 1 and not unbatched:
            return [tuple(a[None] for a in arrays[0])]
        return [stack(arrays[a:b], unbatched) for a, b in runs(arrays, unbatched)]

    @property
    def takes_rows(self) -> bool:
        """True when items may come as the rows of one array (one batched input)."""
        return len(self.names) == 1 and self.batching and not self.unbatched

    def _from_mapping(self, inputs: Mapping[str, Any]) -> list[Any]:
        unknown = [k for k in inputs if k not in self._index]
        missing = [n for n in self.names if n not in inputs]
        if unknown or missing:
            raise InvalidInput(
                f"model {self.model!r} takes inputs {list(self.names)}; "
                f"unknown: {unknown}, missing: {missing}"
            )
        return [inputs[n] for n in self.names]

    def check(self, i: int, value: Any) -> np.ndarray:
        """`value` as input `i` of one item, checked; raises `InvalidInput`."""
        return self._check(i, value)

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
        if isinstance(value, DeviceTensor):
            return self._on_device(i, value, where)
        if isinstance(value, np.ndarray):
            array = _safe_cast(value, dtype, where)
        else:
            array = self._convert(value, dtype, shape, where)
        if array.ndim != len(shape) or any(
            d is not None and d != a for d, a in zip(shape, array.shape, strict=True)
        ):
            raise InvalidInput(
                f"{where}: expected shape {_fmt(shape)}{self._hints[i]}, got {_fmt(array.shape)}"
            )
        return array

    def _on_device(self, i: int, value: DeviceTensor, where: str) -> np.ndarray:
        """A DeviceTensor for input `i`, checked, as a 0-d object array holding it."""
        name, dtype, shape = self.names[i], self.dtypes[i], self.shapes[i]
        got = f"a DeviceTensor of {value.source} ({value.dtype.name}{_fmt(value.shape)})"
        if i not in self.handed:
            raise InvalidInput(
                f"{where} takes host arrays here, got {got}: pass np.asarray(tensor), or "
                f"declare `inputs: {{{name}: {{from: {value.source}}}}}` in the recipe of an "
                "acl backend"
            )
        if value.dtype != dtype or value.shape != tuple(shape):
            raise InvalidInput(f"{where}: expected {dtype.name}{_fmt(shape)}, got {got}")
        if not value.alive:
            raise InvalidInput(
                f"{where}: {got} is no longer on the device (its model's session was closed "
                "or re-loaded)"
            )
        column = np.empty((), object)
        column[()] = value
        return column

    def item_shapes(self, rows: Item) -> tuple[tuple[tuple[int, ...], ...], bool]:
        """The item shape of each input of stacked `rows` (a batching model's), and whether
        any input is a column of DeviceTensors (its item shape is then the tensors')."""
        if not self.handed:
            return tuple(a.shape[1:] for a in rows), False
        shapes, on_device = [], False
        for i, a in enumerate(rows):
            if a.dtype == object and i in self.handed:
                shapes.append(tuple(int(d) for d in self.shapes[i] if d is not None))
                on_device = True
            else:
                shapes.append(a.shape[1:])
        return tuple(shapes), on_device

    @staticmethod
    def _convert(value: Any, dtype: np.dtype[Any], shape: Sequence[Dim], where: str) -> np.ndarray:
        """A value that is not an ndarray (a list, a number) as an array of `dtype`; None,
        strings and anything numpy reads as objects or text are refused."""
        if isinstance(value, np.generic) and value.dtype == dtype:
            return np.asarray(value)  # a numpy scalar of the right type (e.g. np.int64(16000))

        def expected() -> str:  # only formatted for an error
            return f"{where}: expected an array of {dtype.name} of shape {_fmt(shape)}"

        if value is None or isinstance(value, str | bytes):
            raise InvalidInput(f"{expected()}, got {_given(value)}")
        try:
            raw = np.asarray(value)
            if raw.dtype.kind in "OSUV":
                raise InvalidInput(
                    f"{expected()}, got {_given(value)} that numpy reads as "
                    f"{raw.dtype.name} (not numbers)"
                )
            return np.asarray(raw, dtype=dtype)
        except (TypeError, ValueError) as e:
            raise InvalidInput(f"{expected()}, got {_given(value)}: {e}") from None


def _axis_hint(t: TensorDesc, axis: int | None) -> str:
    """For a shape error: where an item's shape comes from, when it is not plain."""
    if axis is None:
        return f" (unbatched: the value for the whole batch, {t.describe()})"
    if axis:
        return f" (the model's {t.describe()} without its batch axis {axis})"
    return ""


Item = tuple[np.ndarray, ...]  # one item's arrays, in model input order


def runs(items: Sequence[Item], unbatched: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Ranges [start, stop) of consecutive items whose arrays have equal shapes, and equal
    values of the unbatched inputs at the indices `unbatched`."""
    out: list[tuple[int, int]] = []
    start = 0
    last: object = None
    for i, item in enumerate(items):
        s: object = tuple(a.shape for a in item)
        if unbatched:
            s = (s, unbatched_values(item, unbatched))
        if s != last:
            if i:
                out.append((start, i))
            start, last = i, s
    if items:
        out.append((start, len(items)))
    return out


UnbatchedValue = tuple[tuple[int, ...], bytes]  # an unbatched input's value: shape, bytes
UnbatchedValues = tuple[UnbatchedValue, ...]


def unbatched_value(value: np.ndarray) -> UnbatchedValue:
    """One unbatched input's value in a form that compares and hashes."""
    return (value.shape, value.tobytes())


def unbatched_values(item: Item, unbatched: Sequence[int]) -> UnbatchedValues:
    """The values of an item's unbatched inputs (at the indices `unbatched`)."""
    return tuple(unbatched_value(item[i]) for i in unbatched)


def rows_unbatched_values(rows: Item, unbatched: Sequence[int]) -> UnbatchedValues | None:
    """The values of the unbatched inputs of rows stacked for one batch (equal in every
    row), for `ShapePolicy.keys`; None for a model without such inputs."""
    return unbatched_values(tuple(a[0] for a in rows), unbatched) if unbatched else None


def stack(items: Sequence[Item], unbatched: Sequence[int] = ()) -> Item:
    """Same-shape items as one array per input, item i in row i (a view for one item). An
    unbatched input, equal in every item, is the first item's value seen in every row (a
    read-only view, no copy)."""
    if len(items) == 1:
        return tuple(a[None] for a in items[0])
    if not unbatched:
        return tuple(np.stack(column) for column in zip(*items, strict=True))
    n = len(items)
    return tuple(
        np.broadcast_to(column[0], (n, *column[0].shape)) if i in unbatched else np.stack(column)
        for i, column in enumerate(zip(*items, strict=True))
    )


def _safe_cast(array: np.ndarray, dtype: np.dtype[Any], where: str) -> np.ndarray:
    """`array` as `dtype` where numpy calls the cast safe; InvalidInput naming `where` else."""
    if array.dtype == dtype:
        return array
    if not np.can_cast(array.dtype, dtype, "safe"):
        raise InvalidInput(
            f"{where}: expected dtype {dtype.name}, got {array.dtype.name} "
            "(only safe casts are applied)"
        )
    return array.astype(dtype)
