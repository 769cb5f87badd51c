"""FakeAcl models "compiled" for a recipe, as ATC would compile them from the recipe's shapes.

Per model (`FakeAcl.for_recipe`), from its ONNX inputs and the recipe:
- `max_batch_size: 0` (no batching): the static batch 1 (a fixed ONNX batch stays as it is);
- `shapes: {strategy: buckets}`: dims gears (`--input_shape` with -1 + `--dynamic_dims`), one
  per batch gear and bucket: each input's shape is the bucket's item shape with the batch
  gear inserted at the input's `batch_axis` (an unbatched input: the item shape alone), and
  the gear gives the values of the ONNX dims that are not fixed;
- otherwise batch gears (`--dynamic_batch_size`) 1, 2, 4, ... up to and including
  `max_batch_size`, unless the ONNX batch is fixed (then the model is static).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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


def compile_options(recipe: Recipe) -> dict[str, CompileOptions]:
    """How each of the recipe's model files is compiled, by path."""
    return {m.path: _options(m) for m in recipe.models}


def _onnx_inputs(path: str) -> list[tuple[str, list[Any]]]:
    import onnxruntime as ort  # lazily, as fake_acl._model does

    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])
    return [(a.name, list(a.shape)) for a in session.get_inputs()]


def _fixed(d: Any) -> bool:
    return isinstance(d, int) and d > 0


def _options(model: ModelConfig) -> CompileOptions:
    inputs = _onnx_inputs(model.path)
    batches = batch_gears(model.max_batch_size) if model.max_batch_size > 0 else (1,)
    shapes = model.shapes
    if shapes.strategy == "buckets" and shapes.buckets:
        return CompileOptions(dynamic_dims=_dims_gears(model, inputs, batches, shapes.buckets))
    if all(shape and _fixed(shape[0]) for _, shape in inputs):
        return CompileOptions()  # the ONNX batch is fixed: static
    if model.max_batch_size <= 0:
        return CompileOptions(batch=1)
    return CompileOptions(dynamic_batch=batches)


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
