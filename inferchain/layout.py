"""Where a model keeps the rows of a batch: each input's batch axis, or none (unbatched).

Inside inferchain the rows are always on axis 0: an item is each input without its batch
dimension, a Work stacks its items on axis 0 and the engine cuts outputs by rows on axis 0.
A model may keep the rows on another axis (silero-vad's `state` is f32[2, B, 128]) or take
an input once for the whole batch (its `sr`, a scalar). A recipe says so per model:

    inputs: {state: {batch_axis: 1}, sr: {batched: false}}
    outputs: {stateN: {batch_axis: 1}}

`Layout.of` checks those keys against the loaded model. The worker moves each batch into
the model's layout when it feeds the session and the outputs' rows back to axis 0 before it
posts them, so nothing above it knows of batch axes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from inferchain.config import ModelConfig
from inferchain.errors import ConfigError
from inferchain.tensors import Dim, TensorDesc

Axis = int | None  # the model's dim that holds the rows; None: unbatched (one value per batch)


def item_shape(shape: Sequence[Dim], axis: Axis) -> tuple[Dim, ...]:
    """One item's shape: `shape` without dim `axis`; an unbatched input's whole shape."""
    if axis is None:
        return tuple(shape)
    return (*shape[:axis], *shape[axis + 1 :])


@attrs.frozen
class Layout:
    """Per model input and output, the dim that holds the rows of a batch."""

    inputs: tuple[Axis, ...]  # per model input, in input order; None: unbatched
    outputs: tuple[int, ...]  # per model output, in output order

    @classmethod
    def plain(cls, num_inputs: int, num_outputs: int) -> Layout:
        """Rows on axis 0 of every input and output."""
        return cls((0,) * num_inputs, (0,) * num_outputs)

    @classmethod
    def of(
        cls, model: ModelConfig, inputs: Sequence[TensorDesc], outputs: Sequence[TensorDesc]
    ) -> Layout:
        """The layout `model`'s `inputs` / `outputs` keys give its loaded IO.

        `ConfigError` for a name the model does not have, or a batch axis beyond the dims
        of its input or output. A model that does not batch (`max_batch_size: 0`) takes its
        inputs whole: its layout is plain.
        """
        where = f"model {model.name!r}"
        declared_in = {n: (c.batch_axis if c.batched else None) for n, c in model.inputs.items()}
        declared_out = {n: c.batch_axis for n, c in model.outputs.items()}
        for out, name in model.state.items():  # a carried output has its input's batch axis
            carried = model.inputs.get(name)
            if out not in declared_out and carried is not None and carried.batched:
                declared_out[out] = carried.batch_axis
        in_axes = _axes(where, "inputs", declared_in, inputs)
        out_axes = _axes(where, "outputs", declared_out, outputs)
        if model.max_batch_size == 0:
            return cls.plain(len(inputs), len(outputs))
        for t, axis in zip(inputs, in_axes, strict=True):
            _check_input_axis(where, t, axis)
        for t, axis in zip(outputs, out_axes, strict=True):
            _check_output_axis(where, t, axis)
        return cls(in_axes, tuple(0 if a is None else a for a in out_axes))

    def check_batchable(self, model: str, inputs: Sequence[TensorDesc]) -> None:
        """`ConfigError` for an input left batched that has no dims: a scalar cannot hold
        the rows of a batch. (Not part of `of`: a model file may leave an input's rank out,
        which reads the same, and `inferchain info` describes such a model all the same.)"""
        for t, axis in zip(inputs, self.inputs, strict=True):
            if axis is not None and not t.shape:
                raise ConfigError(
                    f"model {model!r}: input {t.name!r} has no dims ({t.describe()}: a scalar, "
                    "or the model file does not give its rank), so it cannot hold the rows of "
                    f"a batch: declare it `inputs: {{{t.name}: {{batched: false}}}}` (one value "
                    "per batch) or give the model max_batch_size: 0"
                )

    @property
    def unbatched(self) -> tuple[int, ...]:
        """Indices of the unbatched inputs (one value for a whole batch)."""
        return tuple(i for i, a in enumerate(self.inputs) if a is None)

    @property
    def moved_outputs(self) -> tuple[tuple[int, int], ...]:
        """(index, batch axis) of each output whose rows are not on axis 0."""
        return tuple((i, a) for i, a in enumerate(self.outputs) if a != 0)

    def item_shapes(self, inputs: Sequence[TensorDesc]) -> tuple[tuple[Dim, ...], ...]:
        """Per input, one item's shape: the model's without its batch axis."""
        return tuple(item_shape(t.shape, a) for t, a in zip(inputs, self.inputs, strict=True))

    def batch_limit(self, inputs: Sequence[TensorDesc]) -> int | None:
        """The most rows the model's fixed batch dims take (the smallest of them); None
        when every batched input's batch dim is dynamic."""
        fixed: list[int] = []
        for t, a in zip(inputs, self.inputs, strict=True):
            dim = t.shape[a] if a is not None and a < len(t.shape) else None
            if dim is not None:
                fixed.append(dim)
        return min(fixed) if fixed else None


def _axes(
    where: str, key: str, declared: Mapping[str, Axis], descs: Sequence[TensorDesc]
) -> tuple[Axis, ...]:
    """Per tensor of `descs`, its declared axis (default 0); every declared name must be one
    of the model's."""
    names = [t.name for t in descs]
    for name in declared:
        if name not in names:
            raise ConfigError(
                f"{where}: key '{key}.{name}' names no {key[:-1]} of the loaded model "
                f"(its {key}: {', '.join(names)})"
            )
    return tuple(declared.get(name, 0) for name in names)


def _check_input_axis(where: str, t: TensorDesc, axis: Axis) -> None:
    rank = len(t.shape)  # 0 with axis 0: see `Layout.check_batchable`
    if axis is None or axis < rank or axis == rank == 0:
        return
    raise ConfigError(
        f"{where}: key 'inputs.{t.name}.batch_axis' is {axis}, but input {t.name!r} has "
        f"{rank} dims ({t.describe()})"
    )


def _check_output_axis(where: str, t: TensorDesc, axis: Axis) -> None:
    rank = len(t.shape)  # 0 may mean the model file does not say: nothing to check then
    if axis is not None and 0 < rank <= axis:
        raise ConfigError(
            f"{where}: key 'outputs.{t.name}.batch_axis' is {axis}, but output {t.name!r} has "
            f"{rank} dims ({t.describe()})"
        )


def rows_first(array: np.ndarray, axis: int) -> np.ndarray:
    """A view of `array` with its dim `axis` moved first (`np.moveaxis(array, axis, 0)`,
    without its argument checks: this runs for every batch)."""
    if axis == 0:
        return array
    return array.transpose((axis, *range(axis), *range(axis + 1, array.ndim)))
