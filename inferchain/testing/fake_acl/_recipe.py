"""FakeAcl models "compiled" for a recipe, as ATC would compile them from the recipe's shapes.

Per model (`FakeAcl.for_recipe`), from its ONNX inputs and the recipe:
- `max_batch_size: 0` (no batching): the static batch 1 (a fixed ONNX batch stays as it is);
- `shapes: {strategy: buckets}` (or `fixed` with its bucket): dims gears (`--input_shape`
  with -1 + `--dynamic_dims`), one per batch gear and bucket: each input's shape is the
  bucket's item shape with the batch gear inserted at the input's `batch_axis` (an unbatched
  input: the item shape alone), and the gear gives the values of the ONNX dims that are not
  fixed;
- a model whose rows are not all on axis 0 (a `batch_axis`, an unbatched input): dims gears
  as above from its ONNX item shapes, where those are fixed (ATC's dynamic batch puts the
  batch on axis 0 only);
- otherwise batch gears (`--dynamic_batch_size`) 1, 2, 4, ... up to and including
  `max_batch_size`, unless the ONNX batch is fixed (then the model is static).

What a recipe does not say, the one compiling the model does: `shapes={model: [bucket, ...]}`
gives the item shapes of a model's gears (the recipe's bucket form: per input, its item
shape), for dims the ONNX file leaves open and the recipe pads to no bucket (a variable
length, a chunk size); `batches={model: [b, ...]}` replaces the batch gears 1, 2, 4, ...;
`probe={model: {input: value}}` sets what an input holds in the fake's runs that find the
output dims (a model that branches on it, like silero-vad on its sampling rate).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from inferchain.testing.fake_acl._model import CompileOptions

if TYPE_CHECKING:
    from inferchain.config import ModelConfig, Recipe


def batch_gears(max_batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, ... below `max_batch_size`, and `max_batch_size` itself."""
    gears, b = [], 1
    while b < max_batch_size:
        gears.append(b)
        b *= 2
    return (*gears, max_batch_size)


def compile_options(
    recipe: Recipe,
    shapes: Mapping[str, Sequence[Any]] | None = None,
    batches: Mapping[str, Sequence[int]] | None = None,
    probe: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, CompileOptions]:
    """How each of the recipe's model files is compiled, by path (`shapes`, `batches`,
    `probe`: by model name, see the module docstring)."""
    shapes, batches, probe = shapes or {}, batches or {}, probe or {}
    names = {m.name for m in recipe.models}
    for name in (*shapes, *batches, *probe):
        if name not in names:
            raise ValueError(f"for_recipe: the recipe has no model {name!r} (it has {names})")
    return {
        m.path: attrs.evolve(
            _options(m, shapes.get(m.name), batches.get(m.name)), probe=probe.get(m.name, {})
        )
        for m in recipe.models
    }


def _onnx_inputs(path: str) -> list[tuple[str, list[Any]]]:
    import onnxruntime as ort  # lazily, as fake_acl._model does

    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])
    return [(a.name, list(a.shape)) for a in session.get_inputs()]


def _fixed(d: Any) -> bool:
    return isinstance(d, int) and d > 0


def _options(
    model: ModelConfig, buckets: Sequence[Any] | None, gears: Sequence[int] | None
) -> CompileOptions:
    inputs = _onnx_inputs(model.path)
    batches: Sequence[int] = (1,)
    if model.max_batch_size > 0:
        batches = tuple(gears) if gears else batch_gears(model.max_batch_size)
    shapes = model.shapes
    if not buckets and shapes.strategy in ("buckets", "fixed") and shapes.buckets:
        buckets = shapes.buckets
    if not buckets and model.max_batch_size > 0 and not _plain(model, inputs):
        own = _item_shapes(model, inputs)
        buckets = [own] if own is not None else None
    if buckets:
        return CompileOptions(dynamic_dims=_dims_gears(model, inputs, batches, buckets))
    if all(shape and _fixed(shape[0]) for _, shape in inputs):
        return CompileOptions()  # the ONNX batch is fixed: static
    if model.max_batch_size <= 0:
        return CompileOptions(batch=1)
    return CompileOptions(dynamic_batch=batches)


def _plain(model: ModelConfig, inputs: list[tuple[str, list[Any]]]) -> bool:
    """Every input batched on axis 0."""
    configs = [model.inputs.get(name) for name, _ in inputs]
    return all(c is None or (c.batched and c.batch_axis == 0) for c in configs)


def _item_shapes(model: ModelConfig, inputs: list[tuple[str, list[Any]]]) -> list[Any] | None:
    """Each input's item shape from the ONNX file, None unless every dim off the batch axes
    is fixed."""
    items = []
    for name, shape in inputs:
        config = model.inputs.get(name)
        axis = (config.batch_axis if config.batched else None) if config is not None else 0
        item = [d for k, d in enumerate(shape) if k != axis]
        if not all(_fixed(d) for d in item):
            return None
        items.append(item)
    return items


def _dims_gears(
    model: ModelConfig,
    inputs: list[tuple[str, list[Any]]],
    batches: Sequence[int],
    buckets: Sequence[Any],
) -> list[tuple[int, ...]]:
    gears = []
    for b in batches:
        for raw in buckets:
            items = [raw] if len(inputs) == 1 and all(isinstance(d, int) for d in raw) else raw
            values: list[int] = []
            for (name, onnx_shape), item in zip(inputs, items, strict=True):
                config = model.inputs.get(name)
                full = [int(d) for d in item]
                if config is None or config.batched:
                    full.insert(config.batch_axis if config is not None else 0, b)
                values += [d for d, o in zip(full, onnx_shape, strict=True) if not _fixed(o)]
            gears.append(tuple(values))
    return gears
