"""Synthetic items for `bench`: random values in the shapes a model's real items have.

Values come from `inferchain.tools.feeds.random_array` (the one generator of random inputs).
Shapes, per model: a recipe with shape buckets (`shapes: {buckets: ...}`, or the one shape
of `fixed`) gets items of each bucket's shape in turn, so no item is padded into a bucket
far larger than itself; otherwise the model's own shape, with each dynamic dim other than
the batch dim set to `dynamic_dim` (32 by default). Then the padding and the speed are those
of synthetic shapes, and `bench` says so: `bench --pipeline --input PATH` measures real ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from inferchain.layout import Axis, Layout, item_shape
from inferchain.offline import OfflineInference
from inferchain.tensors import ModelInfo, TensorDesc
from inferchain.tools.feeds import DYNAMIC_DIM, random_array

POOL = 64  # distinct synthetic items per model, cycled through
Shapes = tuple[tuple[int, ...], ...]  # one item shape per model input
Items = list[tuple[np.ndarray, ...]]


def synthetic_shape(
    desc: TensorDesc, batching: bool, dynamic_dim: int = DYNAMIC_DIM, axis: Axis = 0
) -> tuple[int, ...]:
    """One item's shape: the model's, without the batch dim (on `axis`; None: unbatched,
    all of it) when batching; dynamic dims filled (a non-batching model's dynamic leading
    dim gets 1)."""
    if batching:
        dims = list(item_shape(desc.shape, axis))
    else:
        dims = list(desc.shape)
        if dims and dims[0] is None:
            dims[0] = 1
    return tuple(dynamic_dim if d is None else d for d in dims)


def synthetic_items(
    info: ModelInfo,
    count: int = POOL,
    *,
    dynamic_dim: int = DYNAMIC_DIM,
    seed: int = 0,
    layout: Layout | None = None,
    shapes: Sequence[Shapes] = (),
) -> Items:
    """`count` distinct random items for the model described by `info`, whose inputs hold
    their rows where `layout` says (default: axis 0): item `i` of shapes `shapes[i % len]`
    where shapes are given, else of the model's shape with `dynamic_dim` in its dynamic dims."""
    rng = np.random.default_rng(seed)
    batching = info.max_batch_size > 0
    axes = (layout or Layout.plain(len(info.inputs), 0)).inputs
    if not shapes:
        shapes = [
            tuple(
                synthetic_shape(t, batching, dynamic_dim, a)
                for t, a in zip(info.inputs, axes, strict=True)
            )
        ]
    return [
        tuple(
            random_array(s, t.dtype, rng, t.name)
            for s, t in zip(shapes[i % len(shapes)], info.inputs, strict=True)
        )
        for i in range(count)
    ]


def model_pool(oi: OfflineInference, model: str, dynamic_dim: int) -> tuple[Items, str | None]:
    """A model's synthetic items, and what to say of their shapes (None: the model's own,
    all fixed)."""
    info, policy = oi.model_info(model), oi.shape_policy(model)
    item_shapes = policy.layout.item_shapes(info.inputs)
    if all(d is not None for shape in item_shapes for d in shape):
        return synthetic_items(info, layout=policy.layout), None
    buckets = [tuple(tuple(int(d) for d in s) for s in key) for key in policy.buckets]
    if buckets:
        items = synthetic_items(info, layout=policy.layout, shapes=buckets)
        return items, f"items of the recipe's {len(buckets)} bucket shape(s) in turn, unpadded"
    items = synthetic_items(info, dynamic_dim=dynamic_dim, layout=policy.layout)
    return items, (
        f"dynamic dims set to {dynamic_dim} (--dynamic-dim): speed and padding are those of "
        "synthetic shapes; `bench --pipeline --input PATH` measures the recipe's own items"
    )
