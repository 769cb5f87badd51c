"""FakeAcl's `acl.rt`: devices, per-thread contexts, streams with their own threads, memory.

A stream is a worker thread draining a task queue: `execute_async` / `memcpy_async` /
`record_event` / `stream_wait_event` enqueue, `synchronize_stream` waits until the queue is
empty and returns the first error a task raised since the last synchronize. Async copies
take `bytes / copy_bandwidth` seconds on the stream's thread, one at a time per direction
and device (the copy engines), and are recorded in `State.slices`.
"""

from __future__ import annotations

import ctypes
import threading
import time

from inferchain.testing.fake_acl._calls import (
    INVALID_PARAM,
    RT_ADDR_UNALIGNED,
    RT_EVENT_TIMESTAMP_INVALID,
    RT_INVALID_DEVICEID,
    RT_PARAM_INVALID,
    Fail,
    api,
    as_int,
    lookup,
    pair,
)
from inferchain.testing.fake_acl._core import Slice, State, synchronized
from inferchain.testing.fake_acl._memory import (
    CopyPlan,
    check_host_access,
    is_device_pointer,
    plan_copy,
)
from inferchain.testing.fake_acl._objects import Context, Event, Landing, Record, Stream, Task
from inferchain.testing.fake_acl._order import Accesses, Clock, merge
from inferchain.testing.fake_acl._report import CallbackRt

ACL_HOST = 1  # run mode: the host drives a separate device


def wait_until(deadline: float) -> None:
    """Simulated device time: sleep (GIL released) until `deadline` (perf_counter)."""
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


ALIGN_ASYNC = 64  # memcpy_async: both addresses aligned so (else ACL_ERROR_RT_ADDR_UNALIGNED)


def _waiter(reached: threading.Event) -> Task:
    """A stream task that blocks its stream until `reached` (an event record) is set."""

    def wait() -> None:
        reached.wait()

    return wait


def _no_time(code: int, args: tuple[object, ...]) -> tuple[float, int]:
    return 0.0, code


class FakeRt(CallbackRt):
    """`acl.rt` (its callback calls are in `fake_acl._report`)."""

    # -- devices and contexts -------------------------------------------------------------

    def _device(self, device_id: object) -> int:
        device = as_int(device_id, "device_id")
        if not 0 <= device < self._state.device_count:
            raise Fail(RT_INVALID_DEVICEID, f"device {device} (have {self._state.device_count})")
        return device

    @api("rt.set_device", "i")
    def set_device(self, device_id: int) -> int:
        st = self._state
        device = self._device(device_id)
        with st.lock:
            st.device_refs[device] += 1
            if device not in st.default_contexts:
                st.default_contexts[device] = Context(st.new_handle(), device, implicit=True)
            if st.current is None:
                st.current = st.default_contexts[device]
        return 0

    @api("rt.reset_device", "i")
    def reset_device(self, device_id: int) -> int:
        st = self._state
        device = self._device(device_id)
        with st.lock:
            if st.device_refs[device] == 0:
                raise Fail(RT_INVALID_DEVICEID, f"device {device} was not set")
            if st.device_refs[device] == 1:
                live = _live_on_device(st, device)
                if live:
                    raise Fail(RT_PARAM_INVALID, f"device {device} still has live {live}")
                st.default_contexts.pop(device).alive = False
            st.device_refs[device] -= 1
            if not st.device_refs[device]:
                del st.device_refs[device]
        return 0

    @api("rt.create_context", "i", pair)
    def create_context(self, device_id: int) -> tuple[int, int]:
        st = self._state
        device = self._device(device_id)
        with st.lock:
            if not st.device_refs[device]:
                raise Fail(RT_INVALID_DEVICEID, f"device {device} is not set (rt.set_device first)")
            ctx = Context(st.new_handle(), device)
            st.contexts[ctx.handle] = ctx
        st.current = ctx
        return ctx.handle, 0

    @api("rt.destroy_context", "k")
    def destroy_context(self, context: int) -> int:
        st = self._state
        handle = as_int(context, "context")
        with st.lock:
            ctx = st.contexts.get(handle)
            if ctx is None:
                raise Fail(RT_PARAM_INVALID, f"unknown context {handle:#x}")
            users = _users_of(st, ctx)
            if users:  # stricter than the card, which releases them with the context
                raise Fail(RT_PARAM_INVALID, f"context {handle:#x} still has live {users}")
            streams = [s for s in st.streams.values() if s.context is ctx]
            for stream in streams:  # as the runtime does: the context's streams go with it
                del st.streams[stream.handle]
            ctx.alive = False
            del st.contexts[handle]
        for stream in streams:
            stream.stop()
        return 0

    @api("rt.set_context", "k")
    def set_context(self, context: int) -> int:
        st = self._state
        handle = as_int(context, "context")
        if handle == 0:
            raise Fail(INVALID_PARAM, "set_context(NULL)")
        ctx = st.contexts.get(handle)
        if ctx is None:
            raise Fail(RT_PARAM_INVALID, f"unknown context {handle:#x}")
        st.current = ctx
        return 0

    @api("rt.get_context", "", pair)
    def get_context(self) -> tuple[int, int]:
        return self._state.require_context().handle, 0

    @api("rt.get_run_mode", "", pair)
    def get_run_mode(self) -> tuple[int, int]:
        """Answered before `init` too: `aclrtGetRunModeImpl` (hicann/runtime
        src/acl/aclrt_impl/device.cpp) asks `rtGetRunMode` directly."""
        return ACL_HOST, 0

    @api("rt.get_device_count", "", pair)
    def get_device_count(self) -> tuple[int, int]:
        return self._state.device_count, 0

    # -- streams and events ---------------------------------------------------------------

    @api("rt.create_stream", "", pair)
    def create_stream(self) -> tuple[int, int]:
        st = self._state
        ctx = st.require_context()
        with st.lock:
            stream = Stream(st.new_handle(), ctx)
            st.streams[stream.handle] = stream
        return stream.handle, 0

    @api("rt.destroy_stream", "k")
    def destroy_stream(self, stream: int) -> int:
        st = self._state
        with st.lock:
            s = st.require_stream(as_int(stream, "stream"))
            if s.handle in st.subscribed:  # stricter than the card
                raise Fail(
                    RT_PARAM_INVALID,
                    f"stream {s.handle:#x} is subscribed to a report thread "
                    "(unsubscribe_report first)",
                )
            if st.host_clock.get(s.handle, 0) < s.seq:  # stricter than the card
                raise Fail(
                    RT_PARAM_INVALID,
                    f"stream {s.handle:#x} has work the host has not synchronized "
                    "(synchronize_stream first)",
                )
            del st.streams[s.handle]
        s.stop()
        return 0

    @api("rt.synchronize_stream", "k")
    def synchronize_stream(self, stream: int) -> int:
        st = self._state
        with st.lock:  # any thread, any context: the runtime switches to the stream's
            s = st.require_stream(as_int(stream, "stream"), same_context=False)
            clock = s.clock({})
            clock[s.handle] = s.seq
        error = s.synchronize()  # waits without the state lock: other threads go on
        synchronized(st, clock)
        if error is not None:
            raise error
        return 0

    @api("rt.create_event", "", pair)
    def create_event(self) -> tuple[int, int]:
        st = self._state
        ctx = st.require_context()
        with st.lock:
            event = Event(st.new_handle(), ctx)
            st.events[event.handle] = event
        return event.handle, 0

    def _event(self, event: object) -> Event:
        return lookup(self._state.events, event, "event", RT_PARAM_INVALID)

    @api("rt.record_event", "kk")
    def record_event(self, event: int, stream: int) -> int:
        st = self._state
        with st.lock:
            ev = self._event(event)
            s = st.require_stream(as_int(stream, "stream"))
            record = Record(s.handle, 0, {})

            def reach() -> None:
                record.stamp = time.perf_counter()
                record.reached.set()

            record.seq = s.submit(reach)
            record.clock = s.clock({})
            record.clock[s.handle] = record.seq
            ev.record = record
        return 0

    @api("rt.stream_wait_event", "kk")
    def stream_wait_event(self, stream: int, event: int) -> int:
        st = self._state
        with st.lock:
            s = st.require_stream(as_int(stream, "stream"))
            record = self._event(event).record
            if record is None:  # never recorded: nothing to wait for
                return 0
            merge(s.after, record.clock)
            s.submit(_waiter(record.reached))
        return 0

    @api("rt.synchronize_event", "k")
    def synchronize_event(self, event: int) -> int:
        record = self._event(event).record
        if record is not None:
            record.reached.wait()
            synchronized(self._state, record.clock)
        return 0

    @api("rt.event_elapsed_time", "kk", _no_time)
    def event_elapsed_time(self, start: int, end: int) -> tuple[float, int]:
        st = self._state
        records = [self._event(start).record, self._event(end).record]
        with st.lock:
            for r in records:
                if r is None or st.host_clock.get(r.stream, 0) < r.seq:
                    raise Fail(
                        RT_EVENT_TIMESTAMP_INVALID,
                        "event_elapsed_time: an event was not recorded or not synchronized",
                    )
        first, last = records
        assert first is not None and last is not None
        return (last.stamp - first.stamp) * 1000.0, 0

    @api("rt.destroy_event", "k")
    def destroy_event(self, event: int) -> int:
        st = self._state
        with st.lock:
            ev = self._event(event)
            r = ev.record
            if r is not None and st.host_clock.get(r.stream, 0) < r.seq:  # stricter
                raise Fail(RT_PARAM_INVALID, f"event {ev.handle:#x} is recorded and not reached")
            del st.events[ev.handle]
        return 0

    # -- memory ---------------------------------------------------------------------------

    @api("rt.malloc", "ki", pair)
    def malloc(self, size: int, policy: int) -> tuple[int, int]:
        st = self._state
        nbytes = as_int(size, "size")  # an unknown policy falls back to the default
        ctx = st.require_context()
        if nbytes == 0:
            raise Fail(INVALID_PARAM, "malloc size must be > 0")
        with st.lock:
            return st.memory.malloc(ctx.device, nbytes), 0

    @api("rt.free", "k")
    def free(self, dev_ptr: int) -> int:
        st = self._state
        with st.lock:  # no current context needed: the pointer names its device
            st.memory.free(as_int(dev_ptr, "dev_ptr"), st.host_clock)
        return 0

    @api("rt.malloc_host", "k", pair)
    def malloc_host(self, size: int) -> tuple[int, int]:
        st = self._state
        nbytes = as_int(size, "size")
        st.require_context()
        if nbytes == 0:
            raise Fail(INVALID_PARAM, "malloc_host size must be > 0")
        with st.lock:
            return st.host.malloc(nbytes), 0

    @api("rt.free_host", "k")
    def free_host(self, host_ptr: int) -> int:
        with self._state.lock:
            self._state.host.free(as_int(host_ptr, "host_ptr"))
        return 0

    @api("rt.memcpy", "kkkki")
    def memcpy(self, dst: int, dst_max: int, src: int, count: int, kind: int) -> int:
        st = self._state
        st.require_context()
        with st.lock:
            plan = plan_copy(st.memory, dst, dst_max, src, count, kind)
            if plan.src_alloc is not None:
                check_host_access([plan.src_alloc], st.host_clock, write=False, what="memcpy")
            if plan.dst_alloc is not None:
                check_host_access([plan.dst_alloc], st.host_clock, write=True, what="memcpy")
            st.count_copy(plan.direction, plan.count)
        ctypes.memmove(plan.dst, plan.src, plan.count)
        return 0

    @api("rt.memcpy_async", "kkkkik")
    def memcpy_async(
        self, dst: int, dst_max: int, src: int, count: int, kind: int, stream: int
    ) -> int:
        st = self._state
        if dst % ALIGN_ASYNC or src % ALIGN_ASYNC:
            raise Fail(
                RT_ADDR_UNALIGNED,
                f"memcpy_async needs {ALIGN_ASYNC}-byte aligned addresses "
                f"(dst {dst:#x}, src {src:#x})",
            )
        with st.lock:
            s = st.require_stream(as_int(stream, "stream"))
            plan = plan_copy(st.memory, dst, dst_max, src, count, kind)
            clock = s.clock(st.host_clock)
            for alloc, write in ((plan.src_alloc, False), (plan.dst_alloc, True)):
                if alloc is not None:
                    _check_stream_access(alloc.accesses, clock, s, write, alloc.base)
            st.count_copy(plan.direction, plan.count)
            landing = None
            if plan.direction.endswith("2h"):
                ctypes.memset(plan.dst, 0xFF, plan.count)  # poison until the host syncs
                landing = Landing(s.handle, 0, plan.dst)
            seq = s.submit(self._copy_task(s, plan, landing))
            for alloc, write in ((plan.src_alloc, False), (plan.dst_alloc, True)):
                if alloc is not None:
                    alloc.accesses.note(s.handle, seq, write=write)
            if landing is not None:
                landing.seq = seq
                st.landings.append(landing)
        return 0

    def _copy_task(self, s: Stream, plan: CopyPlan, landing: Landing | None) -> Task:
        st = self._state

        def copy() -> None:
            with st.engine(s.context.device, plan.direction):
                start = time.perf_counter()
                if landing is not None:
                    landing.data = ctypes.string_at(plan.src, plan.count)
                else:
                    ctypes.memmove(plan.dst, plan.src, plan.count)
                if st.copy_bandwidth:
                    wait_until(start + plan.count / st.copy_bandwidth)
                end = time.perf_counter()
            with st.lock:
                st.slices.append(Slice(s.handle, plan.direction, start, end))

        return copy

    @api("rt.memset", "kkik")
    def memset(self, dev_ptr: int, max_count: int, value: int, count: int) -> int:
        st = self._state
        ptr, limit, n = as_int(dev_ptr, "dev_ptr"), as_int(max_count, "max"), as_int(count, "count")
        st.require_context()
        if n > limit:
            raise Fail(RT_PARAM_INVALID, f"memset count {n} > max {limit}")
        if not is_device_pointer(ptr):
            raise Fail(RT_PARAM_INVALID, f"{ptr:#x} is not device memory")
        with st.lock:
            alloc, offset = st.memory.find(ptr, limit)
            check_host_access([alloc], st.host_clock, write=True, what="memset")
        ctypes.memset(alloc.address + offset, as_int(value, "value") & 0xFF, n)
        return 0


def _check_stream_access(
    accesses: Accesses, clock: Clock, stream: Stream, write: bool, base: int
) -> None:
    """Refuse stream work racing other streams' unsynchronized work on the same memory
    (stricter than the card, where the two would race)."""
    racing = accesses.conflicts(clock, write=write, own=stream.handle)
    if racing:
        others = ", ".join(f"{h:#x}" for h in racing)
        raise Fail(
            RT_PARAM_INVALID,
            f"device memory {base:#x} is used by work on stream {others} that stream "
            f"{stream.handle:#x} is not ordered after (stream_wait_event or a host sync first)",
        )


def _users_of(st: State, ctx: Context) -> str:
    """What still lives in `ctx` (empty when nothing), for destroy_context's refusal."""
    counts = {
        "events": sum(1 for e in st.events.values() if e.context is ctx),
        "models": sum(1 for m in st.models.values() if m.context is ctx),
    }
    return ", ".join(f"{n} {what}" for what, n in counts.items() if n)


def _live_on_device(st: State, device: int) -> str:
    """What still lives on `device`, for the last reset_device's refusal."""
    counts = {
        "contexts": sum(1 for c in st.contexts.values() if c.device == device),
        "streams": sum(1 for s in st.streams.values() if s.context.device == device),
        "models": sum(1 for m in st.models.values() if m.context.device == device),
        "device allocations": st.memory.on_device(device),
    }
    return ", ".join(f"{n} {what}" for what, n in counts.items() if n)
