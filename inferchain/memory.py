"""The memory budget table: model size, buffers for the max batch, instances, budget.

`memory_budget_mb` of a model covers its static memory (model file and pre-allocated batch
buffers, one set per stream, per instance) plus the input bytes of its admitted (READY or
RUNNING) requests.
`init()` refuses a model whose static memory alone exceeds the budget; the Scheduler admits
requests only while the rest fits.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import attrs

from inferchain.config import ModelConfig
from inferchain.errors import ConfigError
from inferchain.layout import Axis, Layout, item_shape
from inferchain.tensors import TensorDesc

MB = 2**20


def tensor_bytes(desc: TensorDesc, rows: int, axis: Axis = 0) -> int | None:
    """Bytes of `desc` with its batch dim (on `axis`) set to `rows`, or of its one value when
    unbatched (`axis` None); None if another dim is dynamic."""
    dims = item_shape(desc.shape, axis) if desc.shape else ()
    if any(d is None for d in dims):
        return None
    per_batch = 1 if axis is None else rows
    return per_batch * math.prod(d for d in dims if d is not None) * desc.dtype.itemsize


@attrs.frozen
class MemoryPlan:
    """One model's row of the memory budget table; sizes in bytes."""

    model: str
    model_bytes: int  # size of the model file
    buffer_bytes: int  # input + output buffers for the max batch, one instance (static dims)
    dynamic: bool  # some dims are dynamic: their buffers are made per shape on first use
    max_batch: int
    instances: int
    budget_bytes: int | None  # memory_budget_mb, or None for no budget
    streams: int = 1  # buffer sets per instance: each stream beyond the first costs buffer_bytes
    state_bytes: int = 0  # a stateful model's state lanes (max_sequences rows of each carried
    # input), once for the model: host memory, or an acl session's device memory

    @property
    def static_bytes(self) -> int:
        per_instance = self.model_bytes + self.buffer_bytes * self.streams
        return per_instance * self.instances + self.state_bytes

    @property
    def request_bytes(self) -> int | None:
        """What is left for admitted requests' inputs, or None without a budget."""
        return None if self.budget_bytes is None else self.budget_bytes - self.static_bytes

    def check(self, host_bytes: int | None = None) -> None:
        """Raise `ConfigError` when the static memory alone does not fit the budget, or the
        memory of this machine (`host_bytes`, default `host_memory()`): before anything of
        the size is allocated."""
        problem = self.problem(host_bytes)
        if problem is not None:
            raise ConfigError(problem)

    def problem(self, host_bytes: int | None = None) -> str | None:
        """Why `check` would refuse this plan (the keys and the bytes), or None."""
        need = (
            f"model {self.model!r} needs {self.static_bytes} bytes ({self.static_bytes / MB:.1f}"
            f" MB: model {self.model_bytes / MB:.1f} MB + buffers for max_batch_size "
            f"{self.max_batch} {self.buffer_bytes / MB:.1f} MB x {self.streams} streams, x "
            f"{self.instances} instances"
        )
        if self.state_bytes:
            need += f", + state lanes for max_sequences {self.state_bytes / MB:.1f} MB"
        if self.budget_bytes is not None and self.static_bytes > self.budget_bytes:
            return f"{need}) but memory_budget_mb is {self.budget_bytes / MB:.1f}"
        host = host_memory() if host_bytes is None else host_bytes
        if self.static_bytes > host:
            return f"{need}) but this machine has {host} bytes ({host / MB:.1f} MB) of memory"
        return None

    def to_dict(self) -> dict[str, object]:
        return {**attrs.asdict(self), "static_bytes": self.static_bytes}


def host_memory() -> int:
    """Bytes of physical memory of this machine (no plan may need more)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):  # not known here: nothing is refused for it
        return 2**63


def plan(
    model: ModelConfig,
    inputs: Sequence[TensorDesc],
    outputs: Sequence[TensorDesc],
    buckets: Sequence[tuple[tuple[int, ...], ...]] = (),
    layout: Layout | None = None,
) -> MemoryPlan:
    """The memory plan of `model` given its IO description, its shape buckets and where its
    inputs and outputs hold their rows (default: axis 0).

    With buckets, the input buffers of every bucket count (they are all allocated at init).
    """
    rows = model.batch_rows
    layout = layout or Layout.plain(len(inputs), len(outputs))
    out_sizes = [tensor_bytes(t, rows, a) for t, a in zip(outputs, layout.outputs, strict=True)]
    if buckets:
        itemsizes = [t.dtype.itemsize for t in inputs]
        input_bytes = sum(
            (1 if axis is None else rows) * math.prod(shape) * itemsize
            for key in buckets
            for shape, itemsize, axis in zip(key, itemsizes, layout.inputs, strict=True)
        )
        sizes = [input_bytes, *out_sizes]
        dynamic = any(s is None for s in sizes) or model.shapes.strategy == "auto"
    else:
        in_sizes = [tensor_bytes(t, rows, a) for t, a in zip(inputs, layout.inputs, strict=True)]
        sizes = [*in_sizes, *out_sizes]
        dynamic = any(s is None for s in sizes)
    budget = model.memory_budget_mb
    carried = set(model.state.values())
    state_bytes = sum(
        tensor_bytes(t, model.max_sequences, a) or 0
        for t, a in zip(inputs, layout.inputs, strict=True)
        if t.name in carried and a is not None
    )
    return MemoryPlan(
        model=model.name,
        model_bytes=os.path.getsize(model.path) if os.path.exists(model.path) else 0,
        buffer_bytes=sum(s for s in sizes if s is not None),
        dynamic=dynamic,
        max_batch=model.max_batch_size,
        instances=model.instances,
        budget_bytes=None if budget is None else int(budget * MB),
        streams=model.streams or 1,
        state_bytes=state_bytes,
    )
