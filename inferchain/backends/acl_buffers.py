"""One set of device buffers with its own stream, events and host staging: an acl session
holds K of them so that the copies of one batch overlap the compute of another.

Everything here is allocated once at load (`BufferSet.allocate`) and released once at close
(`BufferSet.release`); nothing is allocated per batch.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from inferchain.backends.acl_api import ACL_MEM_MALLOC_HUGE_FIRST, check, null_error
from inferchain.errors import BackendError

if TYPE_CHECKING:
    from inferchain.backends.acl_handover import Lease

EVENTS = ("start", "copied", "computed", "done")  # recorded in this order per batch
Attempt = Callable[[int, str], None]  # records a failed release step, goes on


def ignore(ret: int, what: str) -> None:
    """An `Attempt` that records nothing (a release on a path that is failing already)."""


@attrs.define
class Slot:
    """One input or output of the model as its desc reports it, plus this set's memory."""

    size: int  # bytes, from get_*_size_by_index
    dtype: np.dtype[Any]
    dims: tuple[int, ...]  # as the desc reports them; -1 = follows the gear
    name: str
    ptr: int = 0  # device memory; 0 = not allocated
    buffer: int = 0  # aclDataBuffer; 0 = not created
    host_ptr: int = 0  # rt.malloc_host staging (data inputs and outputs); 0 = none
    host: np.ndarray | None = None  # uint8 view of the staging, `size` bytes

    def fresh(self) -> Slot:
        """The same description without memory, for another set."""
        return Slot(self.size, self.dtype, self.dims, self.name)


@attrs.define
class Launched:
    """A batch launched on a set and not yet collected."""

    rows: int
    shapes: list[tuple[int, ...]]  # of each output, as collect returns it
    counts: list[int]  # bytes copied back per output
    on_device: frozenset[int] = frozenset()  # outputs not copied back (sequence state)


@attrs.define
class BufferSet:
    """Device inputs/outputs (two datasets), host staging, a stream and its events."""

    index: int
    in_slots: list[Slot]
    out_slots: list[Slot]
    staged: list[bool]  # per input: has host staging (every input but the gear input)
    stream: int = 0
    in_dataset: int = 0
    out_dataset: int = 0
    events: dict[str, int] = attrs.Factory(dict)
    gear: object = None  # the gear last set in this set's input dataset
    launched: Launched | None = None
    # hand-overs (`acl_handover`) of the batch on this set, settled once its stream is
    # synchronized: per handed output, the block its rows went to; the blocks it read
    leases: dict[int, Lease] = attrs.Factory(dict)
    pinned: list[Lease] = attrs.Factory(list)

    def allocate(self, acl: Any, model: str) -> None:
        """Make the stream, events, datasets, device buffers and host staging."""
        rt = acl.rt
        self.stream = value_of(acl, rt.create_stream(), f"{model}: rt.create_stream")
        for name in EVENTS:
            self.events[name] = value_of(acl, rt.create_event(), f"{model}: rt.create_event")
        self.in_dataset = _dataset(acl, model)
        _fill(acl, model, self.in_dataset, self.in_slots, "input")
        self.out_dataset = _dataset(acl, model)
        _fill(acl, model, self.out_dataset, self.out_slots, "output")
        staged = [s for s, on in zip(self.in_slots, self.staged, strict=True) if on]
        for slot in (*staged, *self.out_slots):
            what = f"{model}: rt.malloc_host({slot.size}) for {slot.name!r}"
            slot.host_ptr = value_of(acl, rt.malloc_host(slot.size), what)
            raw = (ctypes.c_uint8 * slot.size).from_address(slot.host_ptr)
            slot.host = np.ctypeslib.as_array(raw)

    def release(self, acl: Any, attempt: Attempt) -> None:
        """Free buffers and datasets, host staging and events (not the stream: streams go
        after every set's memory, see `AclSession._release`)."""
        for slots, dataset in (
            (self.in_slots, self.in_dataset),
            (self.out_slots, self.out_dataset),
        ):
            for slot in slots:
                if slot.buffer:
                    ptr = acl.get_data_buffer_addr(slot.buffer) or slot.ptr
                    attempt(acl.rt.free(ptr), "rt.free")
                    attempt(acl.destroy_data_buffer(slot.buffer), "destroy_data_buffer")
                elif slot.ptr:  # allocated, but create_data_buffer failed
                    attempt(acl.rt.free(slot.ptr), "rt.free")
                slot.ptr = slot.buffer = 0
            if dataset:
                attempt(acl.mdl.destroy_dataset(dataset), "mdl.destroy_dataset")
        self.in_dataset = self.out_dataset = 0
        for slot in (*self.in_slots, *self.out_slots):
            slot.host = None
            if slot.host_ptr:
                attempt(acl.rt.free_host(slot.host_ptr), "rt.free_host")
                slot.host_ptr = 0
        for event in self.events.values():
            attempt(acl.rt.destroy_event(event), "rt.destroy_event")
        self.events.clear()
        self.launched = None


def make_sets(
    count: int, in_slots: Sequence[Slot], out_slots: Sequence[Slot], gear_input: str
) -> list[BufferSet]:
    """`count` sets for a model with these inputs and outputs (nothing allocated yet)."""
    staged = [s.name != gear_input for s in in_slots]
    return [
        BufferSet(i, [s.fresh() for s in in_slots], [s.fresh() for s in out_slots], staged)
        for i in range(count)
    ]


def set_bytes(in_slots: Sequence[Slot], out_slots: Sequence[Slot]) -> int:
    """Device bytes one set holds (what each stream beyond the first costs)."""
    return sum(s.size for s in (*in_slots, *out_slots))


def value_of(acl: Any, result: tuple[Any, int], what: str) -> Any:
    """The value of a pyACL call that returns (value, ret), `ret` checked."""
    value, ret = result
    check(acl, ret, what)
    return value


def _dataset(acl: Any, model: str) -> int:
    dataset = int(acl.mdl.create_dataset())
    if not dataset:
        raise null_error(acl, f"{model}: mdl.create_dataset")
    return dataset


def _fill(acl: Any, model: str, dataset: int, slots: list[Slot], kind: str) -> None:
    """Allocate each slot's device memory (HUGE_FIRST) and add it to `dataset`."""
    rt, mdl = acl.rt, acl.mdl
    for i, slot in enumerate(slots):
        if slot.size <= 0:
            raise BackendError(f"{model}: {kind} {slot.name!r} has size 0")
        what = f"{model}: rt.malloc({slot.size}) for {kind} {slot.name!r}"
        slot.ptr = value_of(acl, rt.malloc(slot.size, ACL_MEM_MALLOC_HUGE_FIRST), what)
        slot.buffer = acl.create_data_buffer(slot.ptr, slot.size)
        if not slot.buffer:
            raise null_error(acl, f"{model}: create_data_buffer ({kind} {i})")
        value_of(
            acl, mdl.add_dataset_buffer(dataset, slot.buffer), f"{model}: mdl.add_dataset_buffer"
        )
