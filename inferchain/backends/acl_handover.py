"""Model outputs kept in device memory for a later model (recipe `from:`), on acl.

Producer side, `HandoverPool`: per handed output of a session, `batches` device blocks, each
the model's max batch of that output, allocated at load, one `rt.malloc` a block (so that
stream work on one block is never ordered against another's). A launched batch leases a free
block; after the execute, one device-to-device copy puts the batch's rows there instead of
the device-to-host copy, and `collect` returns one `DeviceTensor` a row, all keeping the
lease. The block is free again once the lease is gone, i.e. once the last of its tensors is
(Python's reference counting), never before. A consumer's launch *pins* the blocks it reads
and the synchronization of its stream unpins them: closing the pool (its session closing or
re-loading) frees every block that is not pinned, and the unpin that releases a pinned one
frees it, so no block is freed while a copy from it may still run. With every block leased,
a batch's output goes to the host as before (a plain array; logged once).

Consumer side, `gather`: an input whose rows are DeviceTensors is filled with one
device-to-device copy per run of consecutive rows of one block, on the batch's stream.

`memcpy_async` needs 64-byte aligned addresses, so a handed row must be a multiple of 64
bytes; an output whose rows are not goes to the host as before (`plan` says why).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from inferchain.backends.acl_api import (
    ACL_MEM_MALLOC_HUGE_FIRST,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_SUCCESS,
    check,
)
from inferchain.backends.acl_buffers import Slot
from inferchain.backends.acl_state import ALIGN, row_bytes
from inferchain.errors import BackendError
from inferchain.handover import DeviceTensor
from inferchain.logs import get_logger

log = get_logger(__name__)

Call = Callable[[int, str], None]  # checks a return code, naming the call


def plan(slot: Slot, batch: int, axis: int) -> tuple[int, str]:
    """The bytes of one row of output `slot` (rows on `axis`, `batch` rows) if it can be
    handed over on the device, else 0 and why not."""
    rows = row_bytes(slot, batch, axis) if axis == 0 else None
    if rows is None:
        return 0, f"{slot.name!r} has no fixed rows on axis 0 (dims {list(slot.dims)})"
    size = rows[1]
    if size % ALIGN:
        return 0, f"a row of {slot.name!r} is {size} bytes, not a multiple of {ALIGN}"
    return size, ""


@attrs.define(eq=False)
class _Block:
    ptr: int  # device memory; 0 once freed
    pins: int = 0  # consumer batches in flight that read it


class HandoverPool:
    """The device blocks of one handed output of one session."""

    def __init__(
        self,
        acl: Any,
        device: int,
        source: str,
        slot: Slot,
        rows: int,
        size: int,
        count: int,
        make_current: Callable[[], int],
    ) -> None:
        self.acl = acl
        self.device = device
        self.source = source  # "MODEL.OUTPUT"
        self.row_bytes = size
        self.block_bytes = rows * size
        self.shape = tuple(int(d) for d in slot.dims[1:])  # an item's
        self.dtype = slot.dtype
        self._count = count
        self._make_current = make_current  # the producer's context on the calling thread
        self._blocks: list[_Block] = []
        self._free: deque[int] = deque()  # appended to from any thread (a lease's end)
        self._lock = threading.Lock()  # pins, closing, reading on the host
        self._closed = False
        self._warned = False

    @property
    def alive(self) -> bool:
        return not self._closed

    def allocate(self, model: str) -> None:
        """`count` blocks, one device allocation each."""
        for _ in range(self._count):
            ptr, ret = self.acl.rt.malloc(self.block_bytes, ACL_MEM_MALLOC_HUGE_FIRST)
            check(self.acl, ret, f"{model}: rt.malloc({self.block_bytes}) for {self.source}")
            self._blocks.append(_Block(ptr))
            self._free.append(len(self._blocks) - 1)

    def lease(self) -> Lease | None:
        """A free block for one batch (the session's thread), None when every one is held."""
        if self._closed:
            return None
        try:
            index = self._free.popleft()
        except IndexError:
            if not self._warned:
                self._warned = True
                log.warning(
                    "acl_handover_full",
                    output=self.source,
                    batches=self._count,
                    detail="every block is held by tensors not yet consumed: batches go "
                    "through the host until one is free (raise the input's `batches`)",
                )
            return None
        return Lease(self, index)

    def give_back(self, index: int) -> None:
        """The lease of block `index` is gone (any thread)."""
        if not self._closed:
            self._free.append(index)

    def ptr(self, index: int) -> int:
        return self._blocks[index].ptr

    def pin(self, index: int) -> bool:
        """Keep block `index` from being freed until `unpin`; False once closed."""
        with self._lock:
            if self._closed:
                return False
            self._blocks[index].pins += 1
            return True

    def unpin(self, index: int) -> int:
        """A consumer's reads of block `index` are done; frees it where the pool closed
        meanwhile and this was the last pin (the return code of `rt.free`)."""
        with self._lock:
            block = self._blocks[index]
            block.pins -= 1
            if not (self._closed and block.pins == 0 and block.ptr):
                return ACL_SUCCESS
            ptr, block.ptr = block.ptr, 0
            ret: int = self.acl.rt.free(ptr)
            return ret

    def fetch(self, index: int, row: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A host copy of one row of block `index` (any thread: it makes the producer's
        context current there)."""
        with self._lock:
            if self._closed:
                raise BackendError(
                    f"{self.source}: the DeviceTensor is gone (its session was closed or "
                    "re-loaded)",
                    name="ACL_HANDOVER_RELEASED",
                )
            check(self.acl, self._make_current(), f"{self.source}: rt.set_context")
            out = np.empty(shape, dtype)
            n = out.nbytes
            src = self._blocks[index].ptr + row * self.row_bytes
            ret = self.acl.rt.memcpy(out.ctypes.data, n, src, n, ACL_MEMCPY_DEVICE_TO_HOST)
            check(self.acl, ret, f"{self.source}: rt.memcpy (a DeviceTensor to the host)")
        return out

    def tensors(self, lease: Lease, rows: int) -> np.ndarray:
        """One DeviceTensor per row of the batch in `lease`'s block, as an object array."""
        column = np.empty(rows, object)
        for r in range(rows):
            column[r] = DeviceTensor(self.source, self.shape, self.dtype, lease, r)
        return column

    def close(self, attempt: Call) -> None:
        """Free every block no consumer has pinned (after the session's streams are
        synchronized); the others go at their last unpin."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._free.clear()
            for block in self._blocks:
                if block.pins == 0 and block.ptr:
                    attempt(self.acl.rt.free(block.ptr), f"rt.free ({self.source} block)")
                    block.ptr = 0


class Lease:
    """One block of a pool, leased for one batch's rows; given back once it is gone (or
    `release`d where no tensor was made of it)."""

    __slots__ = ("_index", "pool")

    def __init__(self, pool: HandoverPool, index: int) -> None:
        self.pool = pool
        self._index = index

    @property
    def alive(self) -> bool:
        return self.pool.alive

    @property
    def ptr(self) -> int:
        return self.pool.ptr(self._index)

    def fetch(self, row: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return self.pool.fetch(self._index, row, shape, dtype)

    def pin(self) -> bool:
        return self.pool.pin(self._index)

    def unpin(self) -> int:
        return self.pool.unpin(self._index)

    def release(self) -> None:
        if self._index >= 0:
            self.pool.give_back(self._index)
            self._index = -1

    def __del__(self) -> None:
        self.release()


def scatter(rt: Any, call: Call, lease: Lease, slot: Slot, count: int, stream: int) -> None:
    """Copy the batch's `count` bytes of output `slot` (device) into the leased block."""
    assert count <= lease.pool.block_bytes  # rows <= the model's batch
    ret = rt.memcpy_async(
        lease.ptr, lease.pool.block_bytes, slot.ptr, count, ACL_MEMCPY_DEVICE_TO_DEVICE, stream
    )
    call(ret, f"rt.memcpy_async (output {slot.name!r} kept on the device)")


def _checked(column: np.ndarray, slot: Slot, acl: Any, device: int, model: str) -> list[Lease]:
    """Each row's lease, after checking it is a DeviceTensor of this device of the input's
    item shape and dtype (`BackendError` naming the model, input, expected and actual)."""
    item = slot.dims[1:]
    leases = []
    for t in column:
        holder = t.holder if isinstance(t, DeviceTensor) else None
        if not isinstance(holder, Lease) or holder.pool.acl is not acl:
            raise BackendError(
                f"{model}: input {slot.name!r} got {t!r}, not a DeviceTensor of this acl "
                "runtime's models",
                name="ACL_HANDOVER_FOREIGN",
            )
        assert isinstance(t, DeviceTensor)
        fits = len(t.shape) == len(item) and all(
            d < 0 or d == s for d, s in zip(item, t.shape, strict=True)
        )
        if not fits or t.dtype != slot.dtype or holder.pool.device != device:
            raise BackendError(
                f"{model}: input {slot.name!r} expects {slot.dtype.name}{list(item)} rows on "
                f"device {device}, got {t!r} on device {holder.pool.device}",
                name="ACL_HANDOVER_MISMATCH",
            )
        leases.append(holder)
    return leases


def gather(
    acl: Any,
    call: Call,
    column: np.ndarray,
    slot: Slot,
    stream: int,
    device: int,
    model: str,
    pinned: list[Lease],
) -> None:
    """Fill input `slot` (device, rows on axis 0) with the rows of `column` (DeviceTensors):
    pin their blocks (added to `pinned`, unpinned once the stream is synchronized), then one
    device-to-device copy per run of consecutive rows of one block."""
    leases = _checked(column, slot, acl, device, model)
    for lease in {id(x): x for x in leases}.values():
        if not lease.pin():
            raise BackendError(
                f"{model}: input {slot.name!r}: a DeviceTensor of {lease.pool.source} is gone "
                "(its session was closed or re-loaded after it was made)",
                name="ACL_HANDOVER_RELEASED",
            )
        pinned.append(lease)
    size = leases[0].pool.row_bytes
    for start, count in _runs(column, leases):
        at = start * size
        src = leases[start].ptr + column[start].row * size
        ret = acl.rt.memcpy_async(
            slot.ptr + at, slot.size - at, src, count * size, ACL_MEMCPY_DEVICE_TO_DEVICE, stream
        )
        call(ret, f"rt.memcpy_async (input {slot.name!r} from {leases[start].pool.source})")


def _runs(column: np.ndarray, leases: Sequence[Lease]) -> list[tuple[int, int]]:
    """(first row, rows) of each run of rows that are consecutive rows of one block."""
    runs: list[tuple[int, int]] = []
    for r in range(len(column)):
        if runs:
            start, count = runs[-1]
            if leases[r] is leases[start] and column[r].row == column[start].row + count:
                runs[-1] = (start, count + 1)
                continue
        runs.append((r, 1))
    return runs


def unpin(leases: Sequence[Lease], model: str) -> None:
    """The reads of a synchronized stream are done: unpin their blocks."""
    for lease in leases:
        ret = lease.unpin()
        if ret != ACL_SUCCESS:
            log.warning("acl_handover_free_failed", model=model, output=lease.pool.source, code=ret)
