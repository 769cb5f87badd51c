"""Shape strategies: which batch a request joins, and padding into shape buckets.

- `dynamic`: run items as they are; only identical shapes share a batch.
- `fixed`: pad every item to one shape (the model's static shape, or the one bucket given).
- `buckets`: a list of shapes ("gears"); an item goes to the smallest bucket that holds it,
  padded with `pad_value`; outputs that follow the input are cropped back (`crop_outputs`).
- `auto`: the first `sample` items run as `dynamic`; then `num_buckets` buckets are derived
  from them, minimising padded elements, and used from then on.
- `longest`: items of any shapes share a batch, padded to the longest of its rows in each
  dim (the batch's envelope); outputs keep the padded shape unless `crop_outputs` says.

Padded rows hold the input's `pad` (recipe `inputs: {NAME: {pad: ...}}`), else `pad_value`.

A `deterministic` model pads each item to a shape that is a function of the item alone: its
own shape (`dynamic`, a static model), its one shape (`fixed`) or its bucket (`buckets`;
with `dynamic`, `longest` or `auto`, the `buckets` given are used as `buckets`). `longest`
and `auto` without `buckets` depend on what shares a batch or came first: refused.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from inferchain.config import ModelConfig
from inferchain.errors import ConfigError, InvalidInput
from inferchain.inputs import InputSpec, rows_unbatched_values
from inferchain.layout import Layout
from inferchain.logs import get_logger
from inferchain.tensors import TensorDesc

log = get_logger(__name__)

Shape = tuple[int, ...]
ShapeKey = tuple[Shape, ...]  # one item shape per model input
_KEYS_KEPT = 64  # (item shapes, unbatched values) whose keys `keys()` remembers


_BATCH_SHAPED = ("longest", "auto")  # strategies whose item shapes depend on other items


def _deterministic_strategy(model: ModelConfig, strategy: str) -> str:
    """The strategy of a deterministic model: `buckets` where buckets are given to a
    strategy that would otherwise keep or share shapes (`dynamic`, `longest`, `auto`)."""
    if model.shapes.buckets and strategy in ("dynamic", *_BATCH_SHAPED):
        return "buckets"
    return strategy


def fits(shapes: ShapeKey, bucket: ShapeKey) -> bool:
    """True when every input fits inside the bucket's shape (same rank, dims <=)."""
    return all(
        len(s) == len(b) and all(x <= y for x, y in zip(s, b, strict=True))
        for s, b in zip(shapes, bucket, strict=True)
    )


def size(key: ShapeKey) -> int:
    """Elements of one item in `key`, all inputs together."""
    return sum(math.prod(s) for s in key)


def smallest_fit(shapes: ShapeKey, buckets: Sequence[ShapeKey]) -> ShapeKey | None:
    """The bucket with the fewest elements that holds `shapes`, or None."""
    best = None
    for bucket in buckets:
        if fits(shapes, bucket) and (best is None or size(bucket) < size(best)):
            best = bucket
    return best


def envelope(keys: Sequence[ShapeKey]) -> ShapeKey:
    """The smallest key that holds every key given (element-wise max)."""
    return tuple(
        tuple(max(dims) for dims in zip(*shapes, strict=True)) for shapes in zip(*keys, strict=True)
    )


def derive_buckets(sample: Sequence[ShapeKey], num_buckets: int) -> list[ShapeKey]:
    """At most `num_buckets` buckets holding every sampled key, with few padded elements.

    Keys are ordered by size and cut into contiguous groups by dynamic programming over the
    padding of each group's envelope: optimal when one dimension varies, a good heuristic
    when several do.
    """
    distinct = sorted(set(sample), key=lambda k: (size(k), k))
    counts = {k: 0 for k in distinct}
    for k in sample:
        counts[k] += 1
    n = len(distinct)
    k_max = min(num_buckets, n)

    def waste(i: int, j: int) -> int:  # padding when distinct[i:j] share one bucket
        env = size(envelope(distinct[i:j]))
        return sum(counts[k] * (env - size(k)) for k in distinct[i:j])

    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k_max + 1)]
    cut = [[0] * (n + 1) for _ in range(k_max + 1)]
    best[0][0] = 0
    for b in range(1, k_max + 1):
        for j in range(1, n + 1):
            for i in range(b - 1, j):
                cost = best[b - 1][i] + waste(i, j)
                if cost < best[b][j]:
                    best[b][j], cut[b][j] = cost, i
    b = min(range(1, k_max + 1), key=lambda b: best[b][n])
    buckets, j = [], n
    while b:
        i = cut[b][j]
        buckets.append(envelope(distinct[i:j]))
        j, b = i, b - 1
    return sorted(buckets, key=size)


def padding_waste(sample: Sequence[ShapeKey], buckets: Sequence[ShapeKey]) -> float:
    """Share of padded elements when `sample` runs in `buckets` (0 = none)."""
    padded = sum(size(smallest_fit(k, buckets) or k) for k in sample)
    return 1.0 - sum(size(k) for k in sample) / padded if padded else 0.0


@attrs.frozen
class Crop:
    """Output `output` follows input `input`: out item dim -> in item dim (no batch dims)."""

    output: int
    input: int
    dims: Mapping[int, int]


class ShapePolicy:
    """One model's strategy: the batch key of each item; buckets; what to crop back."""

    def __init__(
        self,
        model: ModelConfig,
        inputs: Sequence[TensorDesc],
        outputs: Sequence[TensorDesc],
        layout: Layout | None = None,
    ) -> None:
        config = model.shapes
        self.model = model.name
        # a model that does not batch takes whole inputs: each shape is its own batch
        self.strategy = config.strategy if model.max_batch_size > 0 else "dynamic"
        if model.deterministic:
            self.strategy = _deterministic_strategy(model, self.strategy)
        self.pad_values: tuple[float | bool, ...] = tuple(
            config.pad_value if c is None or c.pad is None else c.pad
            for c in (model.inputs.get(t.name) for t in inputs)
        )
        self.longest = self.strategy == "longest"  # batches padded to their own envelope
        self.num_buckets = config.num_buckets
        self._sample_size = config.sample
        # where each input and output holds its rows; items are inputs without that axis
        self.layout = layout or Layout.of(model, inputs, outputs)
        self._item_shapes = self.layout.item_shapes(inputs)
        self._lock = threading.Lock()
        self._sample: list[ShapeKey] = []
        self._keys: dict[tuple[ShapeKey, Hashable], tuple[ShapeKey, Hashable]] = {}  # keys()
        static = model.max_batch_size > 0 and all(None not in s for s in self._item_shapes)
        if model.deterministic and not static and self.strategy in _BATCH_SHAPED:
            raise ConfigError(
                f"model {model.name!r}: deterministic: true pads each item to a shape of its "
                f"own, and shapes strategy {self.strategy!r} pads it to what shares its batch "
                "(or came first): give `shapes.buckets`, the shapes items are padded to"
            )
        self.buckets: list[ShapeKey] = self._buckets(config.buckets, static, len(inputs))
        # every item's key is its own shapes: nothing is ever padded, nor keys derived later
        self.keeps_shapes = static or self.strategy == "dynamic"
        self.crops = tuple(self._crop(c, inputs, outputs) for c in config.crop_outputs or ())

    def _buckets(self, raw: Sequence[Any] | None, static: bool, n_inputs: int) -> list[ShapeKey]:
        if static:
            return [tuple(tuple(int(d) for d in s if d is not None) for s in self._item_shapes)]
        if self.strategy in ("dynamic", "auto", "longest"):
            return []
        if not raw:
            raise ConfigError(
                f"model {self.model!r}: shapes strategy {self.strategy!r} needs `buckets`"
            )
        buckets = [self._bucket(b, n_inputs) for b in raw]
        if self.strategy == "fixed" and len(buckets) != 1:
            raise ConfigError(f"model {self.model!r}: strategy fixed takes one shape in `buckets`")
        return sorted(buckets, key=size)

    def _bucket(self, raw: Any, n_inputs: int) -> ShapeKey:
        shapes = [raw] if n_inputs == 1 and all(isinstance(d, int) for d in raw) else list(raw)
        key = tuple(tuple(int(d) for d in s) for s in shapes)
        if len(key) != n_inputs or any(
            len(s) != len(m) or any(d is not None and d != x for d, x in zip(m, s, strict=True))
            for s, m in zip(key, self._item_shapes, strict=True)
        ):
            raise ConfigError(
                f"model {self.model!r}: bucket {raw!r} does not match the item shapes "
                f"{self._item_shapes} of the model's inputs"
            )
        return key

    def _crop(self, raw: Any, inputs: Sequence[TensorDesc], outputs: Sequence[TensorDesc]) -> Crop:
        try:
            out = [t.name for t in outputs].index(raw["output"])
            inp = [t.name for t in inputs].index(raw["input"])
            dims = {int(k): int(v) for k, v in dict(raw["dims"]).items()}
        except (KeyError, ValueError, TypeError) as e:
            raise ConfigError(
                f"model {self.model!r}: crop_outputs entry {raw!r} must be "
                "{output: NAME, input: NAME, dims: {OUT_DIM: IN_DIM}} with the model's names"
            ) from e
        return Crop(out, inp, dims)

    @property
    def settled(self) -> bool:
        """`key_of` gives the same key for the same shapes from now on (an `auto` policy
        still sampling shapes is not settled)."""
        return self.strategy != "auto" or bool(self.buckets)

    def keys(self, exact: ShapeKey, values: Hashable = None) -> tuple[ShapeKey, Hashable]:
        """The shape key of rows of item shapes `exact` (`key_of`), and what rows must
        share to run in one batch: their group (`group_of`) and, for a model with
        unbatched inputs, those inputs' values (`inputs.rows_unbatched_values`)."""
        found = self._keys.get((exact, values))
        if found is not None:
            return found
        key = self.key_of(exact)
        group = self.group_of(key)
        found = key, group if values is None else (group, values)
        if self.settled and len(self._keys) < _KEYS_KEPT:  # the same from now on
            self._keys[(exact, values)] = found
        return found

    def keys_of_rows(
        self, inputs: Sequence[np.ndarray], spec: InputSpec
    ) -> tuple[ShapeKey, ShapeKey, Hashable]:
        """For rows stacked as one array per input (`spec`'s model): their item shapes (of
        a column of DeviceTensors: the tensors'), their shape key and what they must share
        to run in one batch (`keys`). A model without
        batching (`max_batch_size: 0`) takes its inputs whole: each is its own key."""
        if not spec.batching:
            exact = tuple(a.shape for a in inputs)
            return exact, exact, exact
        exact, on_device = spec.item_shapes(tuple(inputs))
        unbatched = spec.unbatched
        values = rows_unbatched_values(tuple(inputs), unbatched) if unbatched else None
        key, joins = self.keys(exact, values)
        if on_device:  # an input is a column of DeviceTensors: such rows batch only together
            joins = ("device", joins)
        return exact, key, joins

    def group_of(self, key: ShapeKey) -> Hashable:
        """What items of batch key `key` must share to run in one batch: the key itself, or
        for `longest` only the ranks (the batch is padded to its envelope)."""
        return tuple(len(s) for s in key) if self.longest else key

    def key(self, arrays: Sequence[np.ndarray]) -> ShapeKey:
        """The batch key of one item; `InvalidInput` when no bucket holds it."""
        return self.key_of(tuple(a.shape for a in arrays))

    def key_of(self, exact: ShapeKey) -> ShapeKey:
        """The batch key of items of shapes `exact`; `InvalidInput` when no bucket holds it."""
        buckets = self.buckets
        if not buckets:
            if self.strategy == "auto":
                self._observe(exact)
            return exact
        if len(buckets) == 1 and buckets[0] == exact:
            return exact
        bucket = smallest_fit(exact, buckets)
        if bucket is None:
            raise InvalidInput(
                f"model {self.model!r}: item shapes {list(exact)} fit none of the buckets "
                f"{[list(b) for b in buckets]}"
            )
        return bucket

    def _observe(self, exact: ShapeKey) -> None:
        with self._lock:
            if self.buckets or len(self._sample) >= self._sample_size:
                return
            self._sample.append(exact)
            if len(self._sample) < self._sample_size:
                return
            buckets = derive_buckets(self._sample, self.num_buckets)
            log.info(
                "auto_buckets",
                model=self.model,
                buckets=[list(map(list, b)) for b in buckets],
                sample=len(self._sample),
                padding_waste=round(padding_waste(self._sample, buckets), 4),
                one_bucket_waste=round(padding_waste(self._sample, [envelope(self._sample)]), 4),
            )
            self.buckets = buckets

    def warm_keys(self) -> list[ShapeKey]:
        """The shapes known at init, each warmed up once at the max batch."""
        return list(self.buckets)


def crop_rows(
    outputs: Sequence[np.ndarray], exact: Sequence[tuple[int, ...]], crops: Sequence[Crop]
) -> list[np.ndarray]:
    """Rows of outputs with the dims that follow an input cut back to the rows' own item
    shapes `exact` (the rows were padded to a larger bucket). Views, no copy."""
    out = list(outputs)
    for c in crops:
        index: list[slice] = [slice(None)] * out[c.output].ndim
        for out_dim, in_dim in c.dims.items():
            index[out_dim + 1] = slice(0, exact[c.input][in_dim])
        out[c.output] = out[c.output][tuple(index)]
    return out
