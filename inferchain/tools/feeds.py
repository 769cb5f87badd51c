"""Input feeds from a model's input description: the one generator of random inputs (used by
`bench` for synthetic items and by `compare` for whole batches), arrays from an `.npz` file,
and the check that fits given arrays to a model.

Random values, the same for every caller: floats uniform in [0, 1), uint8 in [0, 255], other
integers in [0, 15], booleans either; a dynamic dim other than the batch dim gets
`DYNAMIC_DIM` unless the caller says otherwise; any other dtype is a ConfigError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferchain.errors import ConfigError, InvalidInput
from inferchain.tensors import TensorDesc

DEFAULT_BATCH = 4  # rows of random inputs when the model's batch dim is dynamic
DYNAMIC_DIM = 32  # size of any other dynamic dim of random inputs (pass arrays otherwise)


def random_inputs(
    descs: Sequence[TensorDesc], *, batch: int | None = None, seed: int = 0
) -> list[np.ndarray]:
    """Seeded random arrays for `descs` (values: see the module docstring). The batch dim
    gets `batch` rows (default: the model's fixed batch, else `DEFAULT_BATCH`); other dynamic
    dims get `DYNAMIC_DIM`."""
    rng = np.random.default_rng(seed)
    rows = _rows(descs, batch)
    arrays = []
    for t in descs:
        shape = tuple(DYNAMIC_DIM if d is None else d for d in t.shape)
        if shape:
            shape = (rows, *shape[1:])
        arrays.append(random_array(shape, t.dtype, rng, t.name))
    return arrays


def _rows(descs: Sequence[TensorDesc], batch: int | None) -> int:
    fixed = [t.shape[0] for t in descs if t.shape and t.shape[0] is not None]
    limit = min(fixed) if fixed else None
    if batch is None:
        return limit or DEFAULT_BATCH
    if limit is not None and batch > limit:
        raise ConfigError(f"batch {batch}: the model takes at most {limit} rows")
    return batch


def random_array(
    shape: tuple[int, ...], dtype: np.dtype[Any], rng: np.random.Generator, name: str = ""
) -> np.ndarray:
    """Random values of `dtype` for input `name` (see the module docstring for the ranges)."""
    kind = dtype.kind
    if kind == "f":
        return rng.random(shape).astype(dtype)
    if kind == "b":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if kind in "iu":
        high = 256 if dtype == np.uint8 else 16
        return rng.integers(0, high, shape).astype(dtype)
    raise ConfigError(f"input {name!r}: no random values for dtype {dtype}; pass arrays instead")


def load_inputs(path: str | Path, descs: Sequence[TensorDesc]) -> list[np.ndarray]:
    """Arrays for `descs` from an `.npz` file: by input name, or `arr_0, arr_1, ...` in input
    order (what `np.savez(path, *arrays)` writes). Extra arrays are ignored."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--inputs {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError, AttributeError) as e:
        raise InvalidInput(f"--inputs {path}: not a readable .npz file ({e})") from None
    positional = {f"arr_{i}": t.name for i, t in enumerate(descs)}
    if not any(t.name in arrays for t in descs) and set(positional) <= set(arrays):
        arrays = {name: arrays[key] for key, name in positional.items()}
    return by_name(arrays, descs, where=str(path))


def by_name(
    arrays: Mapping[str, np.ndarray], descs: Sequence[TensorDesc], where: str = "inputs"
) -> list[np.ndarray]:
    """`arrays` in `descs` order; InvalidInput naming any input that has no array."""
    missing = [t.name for t in descs if t.name not in arrays]
    if missing:
        raise InvalidInput(
            f"{where}: no array for input(s) {', '.join(missing)} (has: {', '.join(arrays)})"
        )
    return [np.asarray(arrays[t.name]) for t in descs]


def fit_inputs(
    descs: Sequence[TensorDesc], arrays: Sequence[np.ndarray], model: str
) -> list[np.ndarray]:
    """`arrays` cast to `descs`' dtypes (same kind only, e.g. float32 -> float16) after a
    check of count, rank and fixed dims; InvalidInput naming the input otherwise."""
    if len(arrays) != len(descs):
        raise InvalidInput(f"model {model} takes {len(descs)} inputs, got {len(arrays)}")
    fitted = []
    for t, a in zip(descs, arrays, strict=True):
        if not _fits(t.shape, a.shape):
            raise InvalidInput(
                f"model {model}: input {t.name!r} expects {t.describe()}, got shape {a.shape}"
            )
        if not np.can_cast(a.dtype, t.dtype, casting="same_kind"):
            raise InvalidInput(
                f"model {model}: input {t.name!r} expects {t.dtype}, got {a.dtype} "
                "(only same-kind casts, e.g. float64 -> float16)"
            )
        fitted.append(np.ascontiguousarray(a, dtype=t.dtype))
    return fitted


def _fits(expected: Sequence[int | None], actual: Sequence[int]) -> bool:
    """Rank equal; fixed dims equal, except a batch (first) dim may be smaller (padded)."""
    if len(expected) != len(actual):
        return False
    for i, (e, n) in enumerate(zip(expected, actual, strict=True)):
        if e is not None and (n > e if i == 0 else n != e):
            return False
    return True
