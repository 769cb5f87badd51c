"""FakeAcl's stream callbacks: report threads, subscriptions, `launch_callback`, `process_report`.

As the runtime does it (hicann/runtime src/acl/aclrt_impl/callback.cpp and pyACL's
`WrapAclRtLaunchCallback` / `WrapAclRtProcessReport`): a thread made by
`acl.util.start_thread(fn, args)` is subscribed to streams with `rt.subscribe_report(tid,
stream)`; `rt.launch_callback(fn, user_data, block_type, stream)` puts a callback task in the
stream's queue (0 = ACL_CALLBACK_NO_BLOCK, 1 = ACL_CALLBACK_BLOCK, else 100000; a stream with
no subscribed thread: 107015, ACL_ERROR_RT_STREAM_NO_CB_REG). When the stream reaches it, the
callback is handed to the subscribed thread, which runs `fn(user_data)` inside its
`rt.process_report(timeout_ms)` (timeout -1 = wait for ever, > 0 = milliseconds, 0 or < -1:
100000; a thread subscribed to no stream: 107012, ACL_ERROR_RT_THREAD_SUBSCRIBE; nothing
within the timeout: 507012, ACL_ERROR_RT_REPORT_TIMEOUT). A blocking callback holds its
stream until it returned.

A callback is a stream order point: every task queued before it on its stream is complete when
it runs, so the host may read (`rt.memcpy`) what they wrote, and async copies into host
memory queued before it have landed. Work queued after it is not covered: a callback launched
before the D2H copy it reads sees the 0xFF poison, on every run.

Stricter than the card (107000): a callback that allocates, frees, synchronizes or launches
(`NOT_IN_CALLBACK`), `unsubscribe_report` while callbacks of the stream are not yet processed,
`destroy_stream` of a subscribed stream, `stop_thread` of a thread still subscribed.
`stop_thread` joins the thread: its function must return (the samples clear a flag first).
UNVERIFIED (strict here): the codes of `subscribe_report` for an unknown thread (107000) or
an already subscribed stream (107011, ACL_ERROR_RT_STREAM_SUBSCRIBE). 107015 for a callback on
a stream without a subscription was also seen on hardware by a third party.
"""

from __future__ import annotations

import threading
from typing import Any

from inferchain.testing.fake_acl._calls import (
    INVALID_PARAM,
    RT_PARAM_INVALID,
    RT_REPORT_TIMEOUT,
    RT_STREAM_NO_CB_REG,
    RT_STREAM_SUBSCRIBE,
    RT_THREAD_SUBSCRIBE,
    Fail,
    api,
    as_int,
    pair,
)
from inferchain.testing.fake_acl._core import Namespace, State, synchronized
from inferchain.testing.fake_acl._objects import Report, Reports

CALLBACK_NO_BLOCK, CALLBACK_BLOCK = 0, 1


class CallbackRt(Namespace):
    """The callback half of `acl.rt` (mixed into FakeRt)."""

    @api("rt.subscribe_report", "Kk")
    def subscribe_report(self, thread_id: int, stream: int) -> int:
        st = self._state
        tid, handle = as_int(thread_id, "thread_id"), as_int(stream, "stream")
        with st.lock:
            s = st.require_stream(handle, same_context=False)
            if tid not in st.threads:
                raise Fail(RT_PARAM_INVALID, f"thread {tid} was not made by acl.util.start_thread")
            if handle in st.subscribed:
                raise Fail(
                    RT_STREAM_SUBSCRIBE,
                    f"stream {handle:#x} is already subscribed to thread {st.subscribed[handle]}",
                )
            st.subscribed[s.handle] = tid
            st.reports.setdefault(tid, Reports())
        return 0

    @api("rt.unsubscribe_report", "Kk")
    def unsubscribe_report(self, thread_id: int, stream: int) -> int:
        st = self._state
        tid, handle = as_int(thread_id, "thread_id"), as_int(stream, "stream")
        with st.lock:
            if st.subscribed.get(handle) != tid:
                raise Fail(RT_PARAM_INVALID, f"stream {handle:#x} is not subscribed to {tid}")
            s = st.streams.get(handle)
            if s is not None and s.callbacks:  # stricter than the card
                raise Fail(
                    RT_PARAM_INVALID,
                    f"stream {handle:#x} has {s.callbacks} callbacks not yet processed "
                    "(synchronize_stream first)",
                )
            del st.subscribed[handle]
        return 0

    @api("rt.launch_callback", "OOik")
    def launch_callback(self, fn: Any, user_data: Any, block_type: int, stream: int) -> int:
        if not callable(fn):
            raise TypeError("parameter must be callable")  # pyACL's CHECK_NULL(PyCallable_Check)
        if block_type not in (CALLBACK_NO_BLOCK, CALLBACK_BLOCK):
            raise Fail(INVALID_PARAM, f"block_type {block_type} is neither 0 nor 1")
        st = self._state
        with st.lock:
            s = st.require_stream(as_int(stream, "stream"))
            tid = st.subscribed.get(s.handle)
            if tid is None:
                raise Fail(
                    RT_STREAM_NO_CB_REG,
                    f"stream {s.handle:#x} has no subscribed thread (subscribe_report first)",
                )
            reports = st.reports[tid]
            clock = s.clock({})
            report = Report(fn, user_data, s, clock)
            s.callbacks += 1

            def reach() -> None:
                reports.post(report)
                if block_type == CALLBACK_BLOCK:
                    report.done.wait()

            seq = s.submit(reach)
            clock[s.handle] = seq
        return 0

    @api("rt.process_report", "i")
    def process_report(self, timeout: int) -> int:
        if timeout < -1 or timeout == 0:
            raise Fail(INVALID_PARAM, f"timeout {timeout}: -1 (for ever) or > 0 ms")
        st = self._state
        tid = threading.get_native_id()
        with st.lock:
            reports = st.reports.get(tid)
            if reports is None or tid not in st.subscribed.values():
                raise Fail(RT_THREAD_SUBSCRIBE, f"thread {tid} is subscribed to no stream")
        taken = reports.take(None if timeout == -1 else timeout / 1000.0)
        if not taken:
            raise Fail(RT_REPORT_TIMEOUT, f"no callback within {timeout} ms")
        for report in taken:
            _run(st, report)
        return 0


def _run(st: State, report: Report) -> None:
    """Run one callback on the calling (report) thread: the work before it is complete."""
    synchronized(st, report.clock)
    st.in_callback = True
    try:
        report.fn(report.user_data)
    except Exception as e:  # pyACL's LaunchCallFunc logs a failed callback and goes on
        with st.lock:
            st.callback_errors.append(e)
    finally:
        st.in_callback = False
        with st.lock:
            report.stream.callbacks -= 1
        report.done.set()


class ThreadUtil(Namespace):
    """`acl.util.start_thread` / `stop_thread` (mixed into FakeUtil)."""

    @api("util.start_thread", "OO", pair)
    def start_thread(self, fn: Any, args_list: Any) -> tuple[int, int]:
        if not callable(fn):
            raise TypeError("parameter must be callable")
        st = self._state
        started = threading.Event()
        ident: list[int] = []

        def main() -> None:
            ident.append(threading.get_native_id())
            started.set()
            fn(args_list)

        thread = threading.Thread(target=main, name="fake-acl-report-thread", daemon=True)
        thread.start()
        started.wait()
        with st.lock:
            st.threads[ident[0]] = thread
        return ident[0], 0

    @api("util.stop_thread", "K")
    def stop_thread(self, thread_id: int) -> int:
        st = self._state
        tid = as_int(thread_id, "thread_id")
        with st.lock:
            thread = st.threads.get(tid)
            if thread is None:
                raise Fail(INVALID_PARAM, f"thread {tid} was not made by acl.util.start_thread")
            if tid in st.subscribed.values():  # stricter: unsubscribe_report first
                raise Fail(RT_PARAM_INVALID, f"thread {tid} is still subscribed to a stream")
        thread.join()
        with st.lock:
            del st.threads[tid]
            st.reports.pop(tid, None)
        return 0
