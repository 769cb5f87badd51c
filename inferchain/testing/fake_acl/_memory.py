"""FakeAcl's memory: a simulated device address space and real (ctypes) host allocations.

Device pointers are ints at or above 2**48, beyond any user-space host address, so a host
pointer can never be mistaken for a device one. Addresses are never reused: a freed pointer
stays invalid. Fresh device memory is filled with 0xFF bytes (NaN as float) because real
device memory is uninitialised. Each allocation keeps its `Accesses` (see `fake_acl._order`)
so host and stream accesses can be checked against pending stream work.
"""

from __future__ import annotations

import bisect
import ctypes
from collections.abc import Iterable, Mapping

import attrs
import numpy as np

from inferchain.testing.fake_acl._calls import (
    INVALID_PARAM,
    RT_MEMORY_ALLOCATION,
    RT_PARAM_INVALID,
    Fail,
)
from inferchain.testing.fake_acl._order import Accesses

DEVICE_BASE = 1 << 48
_DEVICE_SPAN = 1 << 40  # address range per device
_ALIGN = 512
_HOST_ALIGN = 64  # rt.malloc_host memory is aligned as memcpy_async needs
_GUARD = 4096  # gap between allocations, so an overrun never lands in a neighbour
_GARBAGE = 0xFF

HOST_TO_HOST, HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE, DEFAULT = 0, 1, 2, 3, 4


@attrs.define(eq=False)
class Allocation:
    base: int  # device address
    size: int  # bytes
    device: int
    data: bytearray
    address: int  # the real host address backing `data`
    accesses: Accesses = attrs.Factory(Accesses)  # pending stream work on it

    def view(self, offset: int, count: int) -> np.ndarray:
        return np.frombuffer(self.data, dtype=np.uint8, count=count, offset=offset)


def is_device_pointer(ptr: int) -> bool:
    return ptr >= DEVICE_BASE


class DeviceMemory:
    """All devices' memory: `rt.malloc` / `rt.free` and pointer resolution for copies."""

    def __init__(self, device_count: int, capacity: int) -> None:
        self.capacity = capacity  # bytes per device
        self._next = [DEVICE_BASE + d * _DEVICE_SPAN for d in range(device_count)]
        self._used = [0] * device_count
        self._bases: list[int] = []  # sorted
        self._allocs: dict[int, Allocation] = {}

    def __len__(self) -> int:
        return len(self._allocs)

    def bytes_in_use(self, device: int) -> int:
        return self._used[device]

    def on_device(self, device: int) -> int:
        return sum(1 for a in self._allocs.values() if a.device == device)

    def malloc(self, device: int, size: int) -> int:
        if self._used[device] + size > self.capacity:
            raise Fail(
                RT_MEMORY_ALLOCATION,
                f"device {device} out of memory: {size} bytes requested, "
                f"{self.capacity - self._used[device]} free",
            )
        base = self._next[device]
        self._next[device] = base + (size + _ALIGN - 1) // _ALIGN * _ALIGN + _GUARD
        data = bytearray(size)
        address = ctypes.addressof((ctypes.c_char * size).from_buffer(data))
        ctypes.memset(address, _GARBAGE, size)
        self._allocs[base] = Allocation(base, size, device, data, address)
        bisect.insort(self._bases, base)
        self._used[device] += size
        return base

    def free(self, ptr: int, host_clock: Mapping[int, int]) -> None:
        alloc = self._allocs.get(ptr)
        if alloc is None:
            raise Fail(RT_PARAM_INVALID, f"{ptr:#x} is not the start of a live device allocation")
        check_host_access([alloc], host_clock, write=True, what="free")
        del self._allocs[ptr]
        self._bases.remove(ptr)
        self._used[alloc.device] -= alloc.size

    def find(self, ptr: int, count: int) -> tuple[Allocation, int]:
        """The allocation holding [ptr, ptr + count) and the offset of ptr in it."""
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i >= 0:
            alloc = self._allocs[self._bases[i]]
            offset = ptr - alloc.base
            if offset + count <= alloc.size:
                return alloc, offset
        raise Fail(
            RT_PARAM_INVALID, f"device range [{ptr:#x}, +{count}) is not inside a live allocation"
        )

    def read(self, ptr: int, count: int) -> np.ndarray:
        alloc, offset = self.find(ptr, count)
        return alloc.view(offset, count)

    def write(self, ptr: int, data: bytes | np.ndarray) -> None:
        raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
        flat = raw.reshape(-1).view(np.uint8)
        alloc, offset = self.find(ptr, flat.size)
        alloc.view(offset, flat.size)[:] = flat


def check_host_access(
    allocs: Iterable[Allocation], host_clock: Mapping[int, int], *, write: bool, what: str
) -> None:
    """Refuse a host-synchronous access that races stream work the host has not synchronized
    (stricter than the card, which would read stale bytes or corrupt the pending task)."""
    for alloc in allocs:
        racing = alloc.accesses.conflicts(host_clock, write=write)
        if racing:
            streams = ", ".join(f"{h:#x}" for h in racing)
            raise Fail(
                RT_PARAM_INVALID,
                f"{what}: device memory {alloc.base:#x} is used by work on stream {streams} "
                "that the host has not synchronized (synchronize_stream / synchronize_event "
                "first)",
            )


class HostMemory:
    """`rt.malloc_host` memory: real host bytes, 64-byte aligned, alive until `rt.free_host`."""

    def __init__(self) -> None:
        self._allocs: dict[int, ctypes.Array[ctypes.c_char]] = {}

    def __len__(self) -> int:
        return len(self._allocs)

    def malloc(self, size: int) -> int:
        buf = ctypes.create_string_buffer(size + _HOST_ALIGN)
        address = -(-ctypes.addressof(buf) // _HOST_ALIGN) * _HOST_ALIGN
        self._allocs[address] = buf
        return address

    def free(self, ptr: int) -> None:
        if self._allocs.pop(ptr, None) is None:
            raise Fail(RT_PARAM_INVALID, f"{ptr:#x} is not a live rt.malloc_host allocation")


@attrs.frozen
class CopyPlan:
    """One checked copy: real addresses and the device allocations on each side."""

    dst: int  # real address to write
    src: int  # real address to read
    count: int  # bytes
    dst_alloc: Allocation | None  # device side, if any
    src_alloc: Allocation | None
    direction: str  # "h2h", "h2d", "d2h" or "d2d"


def plan_copy(
    memory: DeviceMemory, dst: int, dst_max: int, src: int, count: int, kind: int
) -> CopyPlan:
    """Check one `rt.memcpy` / `rt.memcpy_async`.

    Rules: no NULL pointer (100000), a known kind (100000), `count <= dst_max` (107000), each
    side is device memory exactly when the kind says so (kind 4, ACL_MEMCPY_DEFAULT, infers
    it from the pointers), and device ranges (dst_max included) lie inside one live
    allocation (107000).
    """
    if dst == 0 or src == 0:
        raise Fail(INVALID_PARAM, "memcpy with a NULL pointer")
    if kind not in (HOST_TO_HOST, HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE, DEFAULT):
        raise Fail(INVALID_PARAM, f"unknown memcpy kind {kind}")
    if count > dst_max:
        raise Fail(RT_PARAM_INVALID, f"memcpy count {count} > dst_max {dst_max}")
    if kind == DEFAULT:
        dst_on_device, src_on_device = is_device_pointer(dst), is_device_pointer(src)
    else:
        dst_on_device = kind in (HOST_TO_DEVICE, DEVICE_TO_DEVICE)
        src_on_device = kind in (DEVICE_TO_HOST, DEVICE_TO_DEVICE)
    sides: list[tuple[int, Allocation | None]] = []
    for ptr, size, on_device, side in (
        (dst, dst_max, dst_on_device, "dst"),
        (src, count, src_on_device, "src"),
    ):
        if on_device != is_device_pointer(ptr):
            where = "device" if on_device else "host"
            raise Fail(
                RT_PARAM_INVALID, f"memcpy kind {kind}: {side} {ptr:#x} is not {where} memory"
            )
        if on_device:
            alloc, offset = memory.find(ptr, size)
            sides.append((alloc.address + offset, alloc))
        else:
            sides.append((ptr, None))
    (real_dst, dst_alloc), (real_src, src_alloc) = sides
    direction = ("d" if src_on_device else "h") + "2" + ("d" if dst_on_device else "h")
    return CopyPlan(real_dst, real_src, count, dst_alloc, src_alloc, direction)
