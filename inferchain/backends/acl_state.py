"""Sequence state kept in device memory by an acl session (`AclSession.open_state`).

Each carried input has one device allocation of `lanes` rows, made once. A batch of steps
(`StateRows`) gathers its rows' state from there into the model's input buffer, and after
the execute scatters the carried outputs back, both with device-to-device copies on the
batch's stream, one copy per run of consecutive lanes (not per row). A sequence's first step
takes its state from the host row instead (the initial value, one host-to-device copy per
run). The state never goes to the host between steps: the carried outputs are not copied
back.

A carried input whose rows are on another batch axis (silero-vad's `state`, f32[2, B, 128]:
axis 1) has `outer` blocks of rows (2 there): the lanes are laid out as [outer, lanes, row]
and the model's buffer as [outer, gear rows, row], so a run of consecutive lanes is one copy
per block.

`memcpy_async` needs 64-byte aligned addresses, so a carried row must be a multiple of 64
bytes; a model whose rows are not keeps its state on the host (`plan` says why).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from inferchain.backends.acl_api import (
    ACL_MEM_MALLOC_HUGE_FIRST,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_HOST_TO_DEVICE,
    check,
)
from inferchain.backends.acl_buffers import Slot
from inferchain.tensors import StateRows

ALIGN = 64  # bytes: memcpy_async's address alignment
Call = Callable[[int, str], None]  # checks a return code, naming the call


@attrs.define
class Carried:
    """One state pair: input `input` of the model's inputs (its position among all of
    them) takes output `output` of the step before; `ptr` holds every lane's row."""

    input: int
    output: int
    row_bytes: int
    outer: int = 1  # blocks of rows: the product of the dims before the batch axis
    ptr: int = 0


def row_bytes(slot: Slot, batch: int, axis: int = 0) -> tuple[int, int] | None:
    """(blocks, bytes of one row) of `slot` with its rows on dim `axis` at the model's
    batch, None when its dims do not say (no batch dim, or a dim that follows a gear)."""
    dims = slot.dims
    if len(dims) <= axis or dims[axis] not in (-1, batch):
        return None
    if any(d <= 0 for k, d in enumerate(dims) if k != axis):
        return None
    return math.prod(dims[:axis]), math.prod(dims[axis + 1 :]) * slot.dtype.itemsize


def plan(
    in_slots: Sequence[Slot],
    out_slots: Sequence[Slot],
    pairs: Sequence[tuple[int, int]],
    batch: int,
    axes: Sequence[tuple[int, int]] = (),
) -> tuple[list[Carried], str]:
    """The carried pairs (input position, output index) as device state, or no pairs and
    why they cannot be. `axes`: per pair, the batch axis of the input and of the output
    (default 0 and 0)."""
    carried = []
    for k, (i, o) in enumerate(pairs):
        src, dst = in_slots[i], out_slots[o]
        in_axis, out_axis = axes[k] if axes else (0, 0)
        rows = row_bytes(src, batch, in_axis)
        if rows is None or row_bytes(dst, batch, out_axis) != rows or src.dtype != dst.dtype:
            return [], f"{dst.name!r} -> {src.name!r} are not rows of one shape and dtype"
        outer, size = rows
        if size % ALIGN:
            return [], f"a row of {src.name!r} is {size} bytes, not a multiple of {ALIGN}"
        carried.append(Carried(i, o, size, outer))
    return carried, ""


def runs(src: np.ndarray, split: np.ndarray | None = None) -> list[tuple[int, int, int]]:
    """(first row, its `src` value, rows) of each run of rows whose `src` values go up by
    one, cut also where `split` changes."""
    n = len(src)
    if n == 0:
        return []
    cut = np.diff(src) != 1
    if split is not None:
        cut |= np.diff(split.astype(np.int8)) != 0
    starts = np.flatnonzero(cut) + 1
    first = np.concatenate(([0], starts))
    count = np.diff(np.concatenate((first, [n])))
    return list(zip(first.tolist(), src[first].tolist(), count.tolist(), strict=True))


class DeviceState:
    """The device lanes of one session's carried inputs (used on its thread)."""

    def __init__(self, carried: list[Carried], lanes: int) -> None:
        self.carried = carried
        self.lanes = lanes
        self.inputs = {c.input: c for c in carried}
        self.outputs = frozenset(c.output for c in carried)

    def allocate(self, acl: Any, model: str) -> None:
        """One device allocation per carried input, `lanes` rows each."""
        for c in self.carried:
            size = c.outer * self.lanes * c.row_bytes
            ptr, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
            check(acl, ret, f"{model}: rt.malloc({size}) for the state of input {c.input}")
            c.ptr = ptr

    def gather(
        self,
        rt: Any,
        call: Call,
        c: Carried,
        slot: Slot,
        rows: StateRows,
        stream: int,
        run: int,
    ) -> None:
        """Fill input `slot` (device, `run` rows per block) with the batch rows' state:
        from the device lanes, or, for a first step, from the host staging (where the host
        row was put, in the same layout)."""
        n = len(rows.read)
        size = c.row_bytes
        assert slot.host_ptr  # data inputs have staging
        src = np.where(rows.fresh, np.arange(n), rows.read)
        for row, first, count in runs(src, rows.fresh):
            nbytes = count * size
            for block in range(c.outer):
                at = (block * run + row) * size
                dst = slot.ptr + at
                if rows.fresh[row]:
                    ret = rt.memcpy_async(
                        dst, nbytes, slot.host_ptr + at, nbytes, ACL_MEMCPY_HOST_TO_DEVICE, stream
                    )
                    call(ret, f"rt.memcpy_async (initial state of {slot.name!r})")
                else:
                    held = c.ptr + (block * self.lanes + first) * size
                    ret = rt.memcpy_async(
                        dst, nbytes, held, nbytes, ACL_MEMCPY_DEVICE_TO_DEVICE, stream
                    )
                    call(ret, f"rt.memcpy_async (state of {slot.name!r})")

    def scatter(
        self,
        rt: Any,
        call: Call,
        c: Carried,
        slot: Slot,
        rows: StateRows,
        stream: int,
        run: int,
    ) -> None:
        """Copy carried output `slot` (device, `run` rows per block) of the batch's rows
        into their lanes."""
        size = c.row_bytes
        for row, first, count in runs(rows.write):
            nbytes = count * size
            for block in range(c.outer):
                ret = rt.memcpy_async(
                    c.ptr + (block * self.lanes + first) * size,
                    nbytes,
                    slot.ptr + (block * run + row) * size,
                    nbytes,
                    ACL_MEMCPY_DEVICE_TO_DEVICE,
                    stream,
                )
                call(ret, f"rt.memcpy_async (state from {slot.name!r})")

    def release(self, acl: Any, attempt: Call) -> None:
        for c in self.carried:
            if c.ptr:
                attempt(acl.rt.free(c.ptr), "rt.free (sequence state)")
                c.ptr = 0
