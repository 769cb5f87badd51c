"""FakeAcl's memory: a simulated device address space and real (ctypes) host allocations.

Device pointers are ints at or above 2**48, beyond any user-space host address, so a host
pointer can never be mistaken for a device one. Addresses are never reused: a freed pointer
stays invalid. Fresh device memory is filled with 0xFF bytes (NaN as float) because real
device memory is uninitialised.
"""

from __future__ import annotations

import bisect
import ctypes
from collections import Counter
from collections.abc import Iterable

import attrs
import numpy as np

from inferchain.testing._fake_acl_core import (
    INVALID_PARAM,
    RT_MEMORY_ALLOCATION,
    RT_PARAM_INVALID,
    Fail,
)

DEVICE_BASE = 1 << 48
_DEVICE_SPAN = 1 << 40  # address range per device
_ALIGN = 512
_GUARD = 4096  # gap between allocations, so an overrun never lands in a neighbour
_GARBAGE = 0xFF

HOST_TO_HOST, HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE = 0, 1, 2, 3
POLICIES = (0, 1, 2)  # HUGE_FIRST, HUGE_ONLY, NORMAL_ONLY


@attrs.define(eq=False)
class Allocation:
    base: int  # device address
    size: int  # bytes
    device: int
    data: bytearray
    address: int  # the real host address backing `data`

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
        self.busy: Counter[int] = Counter()  # base -> pending stream tasks that use it

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

    def free(self, ptr: int) -> None:
        alloc = self._allocs.get(ptr)
        if alloc is None:
            raise Fail(RT_PARAM_INVALID, f"{ptr:#x} is not the start of a live device allocation")
        if self.busy[ptr]:
            raise Fail(RT_PARAM_INVALID, f"{ptr:#x} is in use by a task still pending on a stream")
        del self._allocs[ptr]
        self._bases.remove(ptr)
        self._used[alloc.device] -= alloc.size

    def hold(self, bases: Iterable[int]) -> None:
        """Mark allocations as used by a pending stream task."""
        self.busy.update(bases)

    def release(self, bases: Iterable[int]) -> None:
        for base in bases:
            self.busy[base] -= 1
            if self.busy[base] <= 0:
                del self.busy[base]

    def check_idle(self, allocs: Iterable[Allocation], what: str) -> None:
        """Refuse host-synchronous access to memory a pending stream task uses (a race)."""
        for alloc in allocs:
            if self.busy[alloc.base]:
                raise Fail(
                    RT_PARAM_INVALID,
                    f"{what}: {alloc.base:#x} is in use by a task still pending on a stream "
                    "(synchronize the stream first)",
                )

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


class HostMemory:
    """`rt.malloc_host` memory: real host bytes, kept alive until `rt.free_host`."""

    def __init__(self) -> None:
        self._allocs: dict[int, ctypes.Array[ctypes.c_char]] = {}

    def __len__(self) -> int:
        return len(self._allocs)

    def malloc(self, size: int) -> int:
        buf = ctypes.create_string_buffer(size)
        address = ctypes.addressof(buf)
        self._allocs[address] = buf
        return address

    def free(self, ptr: int) -> None:
        if self._allocs.pop(ptr, None) is None:
            raise Fail(RT_PARAM_INVALID, f"{ptr:#x} is not a live rt.malloc_host allocation")


def plan_copy(
    memory: DeviceMemory, dst: int, dst_max: int, src: int, count: int, kind: int
) -> tuple[int, int, tuple[Allocation, ...]]:
    """Check one `rt.memcpy`: (real dst address, real src address, device allocations used).

    Hold on to the allocations until the copy is done: they keep the bytes alive.

    Rules: no NULL pointer, `count <= dst_max`, each side is device memory exactly when the
    kind says so, and device ranges (dst_max included) lie inside one live allocation.
    """
    if dst == 0 or src == 0:
        raise Fail(INVALID_PARAM, "memcpy with a NULL pointer")
    if count < 0 or dst_max < 0:
        raise Fail(INVALID_PARAM, f"memcpy with negative size (count={count}, dst_max={dst_max})")
    if count > dst_max:
        raise Fail(INVALID_PARAM, f"memcpy count {count} > dst_max {dst_max}")
    if kind not in (HOST_TO_HOST, HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE):
        raise Fail(INVALID_PARAM, f"unknown memcpy kind {kind}")
    dst_on_device = kind in (HOST_TO_DEVICE, DEVICE_TO_DEVICE)
    src_on_device = kind in (DEVICE_TO_HOST, DEVICE_TO_DEVICE)
    allocs: list[Allocation] = []
    addresses: list[int] = []
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
            allocs.append(alloc)
            addresses.append(alloc.address + offset)
        else:
            addresses.append(ptr)
    return addresses[0], addresses[1], tuple(allocs)
