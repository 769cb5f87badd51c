"""FakeAcl's `acl.rt`: devices, per-thread contexts, streams with their own threads, memory.

A stream is a worker thread draining a task queue: `execute_async` / `memcpy_async` /
`record_event` enqueue, `synchronize_stream` waits until the queue is empty and returns the
first error a task raised since the last synchronize.
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from collections.abc import Callable

import attrs

from inferchain.testing._fake_acl_core import (
    INTERNAL_ERROR,
    INVALID_PARAM,
    RT_INVALID_DEVICEID,
    RT_PARAM_INVALID,
    Fail,
    Namespace,
    State,
    api,
    as_int,
    lookup,
    pair,
)
from inferchain.testing._fake_acl_memory import POLICIES, is_device_pointer, plan_copy

ACL_HOST = 1  # run mode: the host drives a separate device


@attrs.define(eq=False)
class Context:
    handle: int
    device: int
    implicit: bool = False  # the device's default context, made by set_device
    alive: bool = True


Task = Callable[[], None]  # raises Fail to report an asynchronous error


class Stream:
    """A device queue: its own thread runs the tasks in order."""

    def __init__(self, handle: int, context: Context) -> None:
        self.handle = handle
        self.context = context
        self.pending = 0  # tasks enqueued and not finished
        self._tasks: deque[Task] = deque()
        self._cond = threading.Condition()
        self._error: Fail | None = None
        self._stopping = False
        self._thread = threading.Thread(
            target=self._loop, name=f"fake-acl-stream-{handle:#x}", daemon=True
        )
        self._thread.start()

    def submit(self, task: Task) -> None:
        with self._cond:
            self._tasks.append(task)
            self.pending += 1
            self._cond.notify_all()

    def synchronize(self) -> Fail | None:
        """Wait for every queued task; the first asynchronous error since the last call."""
        with self._cond:
            self._cond.wait_for(lambda: self.pending == 0)
            error, self._error = self._error, None
            return error

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._tasks or self._stopping)
                if not self._tasks:
                    return
                task = self._tasks.popleft()
            error: Fail | None = None
            try:
                task()
            except Fail as e:
                error = e
            except Exception as e:  # a bug in a task must not kill the stream thread
                error = Fail(INTERNAL_ERROR, f"{type(e).__name__}: {e}")
            with self._cond:
                if error is not None and self._error is None:
                    self._error = error
                self.pending -= 1
                self._cond.notify_all()


class Event:
    def __init__(self, handle: int, context: Context) -> None:
        self.handle = handle
        self.context = context
        self.done = threading.Event()
        self.done.set()  # never recorded: synchronizing returns at once


class FakeRt(Namespace):
    """`acl.rt`."""

    # -- devices and contexts -------------------------------------------------------------

    def _device(self, device_id: object) -> int:
        device = as_int(device_id, "device_id")
        if not 0 <= device < self._state.device_count:
            raise Fail(RT_INVALID_DEVICEID, f"device {device} (have {self._state.device_count})")
        return device

    @api("rt.set_device")
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

    @api("rt.reset_device")
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

    @api("rt.create_context", pair)
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

    @api("rt.destroy_context")
    def destroy_context(self, context: int) -> int:
        st = self._state
        handle = as_int(context, "context")
        with st.lock:
            ctx = st.contexts.get(handle)
            if ctx is None:
                raise Fail(RT_PARAM_INVALID, f"unknown context {handle:#x}")
            users = _users_of(st, ctx)
            if users:
                raise Fail(RT_PARAM_INVALID, f"context {handle:#x} still has live {users}")
            ctx.alive = False
            del st.contexts[handle]
        return 0

    @api("rt.set_context")
    def set_context(self, context: int) -> int:
        st = self._state
        handle = as_int(context, "context")
        ctx = st.contexts.get(handle)
        if ctx is None:
            raise Fail(RT_PARAM_INVALID, f"unknown context {handle:#x}")
        st.current = ctx
        return 0

    @api("rt.get_context", pair)
    def get_context(self) -> tuple[int, int]:
        return self._state.require_context().handle, 0

    @api("rt.get_run_mode", pair)
    def get_run_mode(self) -> tuple[int, int]:
        return ACL_HOST, 0

    @api("rt.get_device_count", pair)
    def get_device_count(self) -> tuple[int, int]:
        return self._state.device_count, 0

    # -- streams and events ---------------------------------------------------------------

    @api("rt.create_stream", pair)
    def create_stream(self) -> tuple[int, int]:
        st = self._state
        ctx = st.require_context()
        with st.lock:
            stream = Stream(st.new_handle(), ctx)
            st.streams[stream.handle] = stream
        return stream.handle, 0

    @api("rt.destroy_stream")
    def destroy_stream(self, stream: int) -> int:
        st = self._state
        with st.lock:
            s = st.require_stream(as_int(stream, "stream"))
            if s.pending:
                raise Fail(RT_PARAM_INVALID, f"stream {s.handle:#x} has {s.pending} pending tasks")
            del st.streams[s.handle]
        s.stop()
        return 0

    @api("rt.synchronize_stream")
    def synchronize_stream(self, stream: int) -> int:
        s = self._state.require_stream(as_int(stream, "stream"))
        error = s.synchronize()  # waits without the state lock: other threads go on
        if error is not None:
            raise error
        return 0

    @api("rt.create_event", pair)
    def create_event(self) -> tuple[int, int]:
        st = self._state
        ctx = st.require_context()
        with st.lock:
            event = Event(st.new_handle(), ctx)
            st.events[event.handle] = event
        return event.handle, 0

    def _event(self, event: object) -> Event:
        return lookup(self._state.events, event, "event", RT_PARAM_INVALID)

    @api("rt.record_event")
    def record_event(self, event: int, stream: int) -> int:
        ev = self._event(event)
        s = self._state.require_stream(as_int(stream, "stream"))
        ev.done.clear()
        s.submit(ev.done.set)
        return 0

    @api("rt.synchronize_event")
    def synchronize_event(self, event: int) -> int:
        self._event(event).done.wait()
        return 0

    @api("rt.destroy_event")
    def destroy_event(self, event: int) -> int:
        st = self._state
        with st.lock:
            ev = self._event(event)
            if not ev.done.is_set():
                raise Fail(RT_PARAM_INVALID, f"event {ev.handle:#x} is recorded and not reached")
            del st.events[ev.handle]
        return 0

    # -- memory ---------------------------------------------------------------------------

    @api("rt.malloc", pair)
    def malloc(self, size: int, policy: int) -> tuple[int, int]:
        st = self._state
        nbytes, policy = as_int(size, "size"), as_int(policy, "policy")
        ctx = st.require_context()
        if nbytes <= 0:
            raise Fail(INVALID_PARAM, f"malloc size must be > 0, got {nbytes}")
        if policy not in POLICIES:
            raise Fail(INVALID_PARAM, f"unknown malloc policy {policy}")
        with st.lock:
            return st.memory.malloc(ctx.device, nbytes), 0

    @api("rt.free")
    def free(self, dev_ptr: int) -> int:
        st = self._state
        ptr = as_int(dev_ptr, "dev_ptr")
        st.require_context()
        with st.lock:
            st.memory.free(ptr)
        return 0

    @api("rt.malloc_host", pair)
    def malloc_host(self, size: int) -> tuple[int, int]:
        st = self._state
        nbytes = as_int(size, "size")
        st.require_context()
        if nbytes <= 0:
            raise Fail(INVALID_PARAM, f"malloc_host size must be > 0, got {nbytes}")
        with st.lock:
            return st.host.malloc(nbytes), 0

    @api("rt.free_host")
    def free_host(self, host_ptr: int) -> int:
        with self._state.lock:
            self._state.host.free(as_int(host_ptr, "host_ptr"))
        return 0

    @api("rt.memcpy")
    def memcpy(self, dst: int, dst_max: int, src: int, count: int, kind: int) -> int:
        st = self._state
        st.require_context()
        d, dmax, n = as_int(dst, "dst"), as_int(dst_max, "dest_max"), as_int(count, "count")
        with st.lock:
            real_dst, real_src, allocs = plan_copy(
                st.memory, d, dmax, as_int(src, "src"), n, as_int(kind, "kind")
            )
            st.memory.check_idle(allocs, "memcpy")
        ctypes.memmove(real_dst, real_src, n)
        del allocs  # kept the device bytes alive during the copy
        return 0

    @api("rt.memcpy_async")
    def memcpy_async(
        self, dst: int, dst_max: int, src: int, count: int, kind: int, stream: int
    ) -> int:
        st = self._state
        d, dmax, n = as_int(dst, "dst"), as_int(dst_max, "dest_max"), as_int(count, "count")
        with st.lock:
            s = st.require_stream(as_int(stream, "stream"))
            real_dst, real_src, allocs = plan_copy(
                st.memory, d, dmax, as_int(src, "src"), n, as_int(kind, "kind")
            )
            bases = [a.base for a in allocs]
            st.memory.hold(bases)  # rt.free refuses them until the copy has run

        def copy() -> None:
            ctypes.memmove(real_dst, real_src, n)
            with st.lock:
                st.memory.release(bases)

        s.submit(copy)
        return 0

    @api("rt.memset")
    def memset(self, dev_ptr: int, max_count: int, value: int, count: int) -> int:
        st = self._state
        ptr, limit, n = as_int(dev_ptr, "dev_ptr"), as_int(max_count, "max"), as_int(count, "count")
        st.require_context()
        if n > limit:
            raise Fail(INVALID_PARAM, f"memset count {n} > max {limit}")
        if not is_device_pointer(ptr):
            raise Fail(RT_PARAM_INVALID, f"{ptr:#x} is not device memory")
        with st.lock:
            alloc, offset = st.memory.find(ptr, limit)
            st.memory.check_idle([alloc], "memset")
        ctypes.memset(alloc.address + offset, as_int(value, "value") & 0xFF, n)
        return 0


def _users_of(st: State, ctx: Context) -> str:
    """What still lives in `ctx` (empty when nothing), for destroy_context's refusal."""
    counts = {
        "streams": sum(1 for s in st.streams.values() if s.context is ctx),
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
