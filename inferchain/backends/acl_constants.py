"""Inputs constant over a sequence, kept in device lanes by an acl session (recipe `constant:`).

A decoder's encoder output (the romanizer's `memory`) is the same at every step of a
sequence and for all of its rows (its beams). Fed like any input it would cross to the
device at every step batch; kept here, it crosses once per sequence: at the sequence's
first step its first row is copied from the host staging into the sequence's `home` lane
(`StateRows.home`), and every step of every row of the sequence gathers it from there into
the model's input buffer with a device-to-device copy, on the batch's stream, in the same
window as the carried state (after the wait for the model's previous execution).

Rows of such an input may differ in their first item dim (the "width": `memory` is
f32[rows, src_len, 256], padded to the batch's longest source), so a lane holds the widest
row any gear runs: the uploaded row, then the input's pad value (one device row of it, made
at open) up to that width. A batch of width W reads the first W columns of each lane, which
are the sequence's row padded to W, as the host would have padded it. The lanes cost
`lanes x widest row` of device memory per input.

`memcpy_async` needs 64-byte aligned addresses, so a column (a row, where the width is
fixed) must be a multiple of 64 bytes, and the rows must be on axis 0; an input that is not
(the romanizer's bool `src_mask`, one byte per column) is fed from the host at every step,
as without `constant:` (`plan` says why).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
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
from inferchain.backends.acl_gears import DimsGear
from inferchain.backends.acl_state import ALIGN, runs
from inferchain.layout import Axis
from inferchain.tensors import StateRows

Call = Callable[[int, str], None]  # checks a return code, naming the call


@attrs.define
class Constant:
    """One constant input: its position among the data inputs, the bytes of one column of
    a row (the dims after the width), the columns a lane holds, the pad column values."""

    input: int
    name: str
    col_bytes: int
    width: int  # columns of the widest row any gear runs (the width itself where fixed)
    pad: np.ndarray  # [width, *rest] of the input's pad value, uploaded once at open
    ptr: int = 0  # every lane's row, `width` columns each
    pad_ptr: int = 0  # the pad row on the device

    @property
    def lane_bytes(self) -> int:
        """The bytes of one lane: a row of the widest width."""
        return self.width * self.col_bytes


def plan(
    data: Sequence[Slot],
    indices: Sequence[int],
    axes: Sequence[Axis],
    gears: Sequence[DimsGear],
    batch: int,
    pads: Mapping[str, float | bool],
) -> tuple[list[Constant], list[str]]:
    """The constant inputs `indices` (positions among the data inputs `data`) that can be
    kept on the device, and why each other one cannot."""
    found, why = [], []
    for i in indices:
        slot = data[i]
        dims = slot.dims
        if axes[i] != 0 or len(dims) < 2 or dims[0] not in (-1, batch):
            why.append(f"{slot.name!r}: rows not on axis 0 with a width dim after them")
            continue
        if any(d <= 0 for d in dims[2:]):
            why.append(f"{slot.name!r}: dims {list(dims)} vary past the width")
            continue
        col = math.prod(dims[2:]) * slot.dtype.itemsize
        width = dims[1] if dims[1] > 0 else max((g.shapes[i][1] for g in gears), default=0)
        if width <= 0:
            why.append(f"{slot.name!r}: no gear says how wide its rows get")
            continue
        unit = col if dims[1] < 0 else width * col  # what a batch's row starts at
        if unit % ALIGN:
            why.append(f"{slot.name!r}: a {'column' if dims[1] < 0 else 'row'} is {unit} bytes, "
                       f"not a multiple of {ALIGN}")  # fmt: skip
            continue
        pad = np.full((width, *dims[2:]), pads.get(slot.name, 0.0), slot.dtype)
        found.append(Constant(i, slot.name, col, width, pad))
    return found, why


class DeviceConstants:
    """The device lanes of one session's constant inputs (used on its thread)."""

    def __init__(self, constants: list[Constant], lanes: int) -> None:
        self.constants = constants
        self.lanes = lanes
        self.inputs = {c.input: c for c in constants}

    def allocate(self, acl: Any, model: str) -> None:
        """One device allocation per input, `lanes` rows of its widest; its pad row, copied
        from the host once (the context is current)."""
        rt = acl.rt
        for c in self.constants:
            size = self.lanes * c.lane_bytes
            c.ptr, ret = rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
            check(acl, ret, f"{model}: rt.malloc({size}) for the constant input {c.name!r}")
            c.pad_ptr, ret = rt.malloc(c.lane_bytes, ACL_MEM_MALLOC_HUGE_FIRST)
            check(acl, ret, f"{model}: rt.malloc({c.lane_bytes}) for the pad of {c.name!r}")
            ret = rt.memcpy(
                c.pad_ptr, c.lane_bytes, c.pad.ctypes.data, c.lane_bytes, ACL_MEMCPY_HOST_TO_DEVICE
            )
            check(acl, ret, f"{model}: rt.memcpy (the pad of {c.name!r})")

    def gather(
        self, rt: Any, call: Call, c: Constant, slot: Slot, rows: StateRows, stream: int, cols: int
    ) -> None:
        """Fill input `slot` (device, rows of `cols` columns) with each row's sequence value:
        first the sequences starting here put their first row (in the host staging) into
        their home lane, padded to the lane's width; then every row is copied from its
        home lane."""
        size = cols * c.col_bytes  # one row of the batch
        held = c.lane_bytes  # one lane
        assert slot.host_ptr and cols <= c.width  # data inputs have staging; gears fit
        homes = rows.homes
        for j in np.flatnonzero(rows.fresh & (homes == rows.write)).tolist():
            dst = c.ptr + int(homes[j]) * held
            src = slot.host_ptr + j * size
            ret = rt.memcpy_async(dst, held, src, size, ACL_MEMCPY_HOST_TO_DEVICE, stream)
            call(ret, f"rt.memcpy_async (the constant {c.name!r} of a sequence)")
            if size < held:
                ret = rt.memcpy_async(
                    dst + size, held - size, c.pad_ptr, held - size,
                    ACL_MEMCPY_DEVICE_TO_DEVICE, stream,
                )  # fmt: skip
                call(ret, f"rt.memcpy_async (the pad of {c.name!r})")
        if size == held:  # the batch runs the widest rows: runs of consecutive lanes
            for row, first, count in runs(homes):
                ret = rt.memcpy_async(
                    slot.ptr + row * size, count * size, c.ptr + first * held, count * size,
                    ACL_MEMCPY_DEVICE_TO_DEVICE, stream,
                )  # fmt: skip
                call(ret, f"rt.memcpy_async (constant {c.name!r})")
            return
        for j, home in enumerate(homes.tolist()):
            ret = rt.memcpy_async(
                slot.ptr + j * size, size, c.ptr + home * held, size,
                ACL_MEMCPY_DEVICE_TO_DEVICE, stream,
            )  # fmt: skip
            call(ret, f"rt.memcpy_async (constant {c.name!r})")

    def release(self, acl: Any, attempt: Call) -> None:
        for c in self.constants:
            for ptr in (c.ptr, c.pad_ptr):
                if ptr:
                    attempt(acl.rt.free(ptr), f"rt.free (constant input {c.name!r})")
            c.ptr = c.pad_ptr = 0
