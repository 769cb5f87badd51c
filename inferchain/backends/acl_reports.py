"""Batch completion by stream callback (recipe `completion: callback`): one report thread per
acl session, as Huawei's asynchronous samples complete their batches.

A batch's last task on its stream is `rt.launch_callback`. The runtime hands the callback to
the session's report thread (made with `acl.util.start_thread`, subscribed to each of the
session's streams with `rt.subscribe_report`), which runs it inside `rt.process_report`
once everything before it on the stream is done: the D2H copies have landed. `collect`
then waits for that callback (a `threading.Event` it sets) instead of calling
`rt.synchronize_stream`. The callback only sets the event: it allocates, frees,
synchronizes and launches nothing, as the runtime requires.

The thread waits in `process_report(-1)` (no timeout, so an idle session polls nothing). It
is stopped by one more callback, blocking (its stream holds until it ran), that tells its
loop to return; then each stream is unsubscribed and the thread joined
(`acl.util.stop_thread`). A `process_report` that fails has run no callback: the loop calls
it again, so a batch fails only when a callback of its own cannot be run; after
`MAX_REPORT_FAILURES` failures in a row the loop ends and every waiting `collect` wakes
with a `BackendError` naming the code. A fault while starting (a `subscribe_report` that
fails) ends the thread and undoes the subscriptions before `start` raises.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from inferchain.backends.acl_api import ACL_SUCCESS, acl_error, check
from inferchain.errors import BackendError
from inferchain.logs import get_logger

log = get_logger(__name__)

ACL_CALLBACK_NO_BLOCK, ACL_CALLBACK_BLOCK = 0, 1
MAX_REPORT_FAILURES = 3  # process_report failing this many times in a row ends the thread
Attempt = Callable[[int, str], None]  # records a failed release step, goes on


class Reports:
    """A session's report thread and one completion event per buffer set (its stream)."""

    def __init__(self, acl: Any, model: str, streams: Sequence[int]) -> None:
        self._acl = acl
        self._model = model
        self._streams = list(streams)  # per buffer set
        self._done = [threading.Event() for _ in self._streams]
        self._ready = threading.Event()  # subscribed (or given up): the loop may start
        self._stopping = False
        self._failed = 0  # the code process_report failed with; 0 = it did not
        self._subscribed: list[int] = []
        self._ended = threading.Event()  # the loop returned
        self.thread = 0  # acl.util.start_thread's id; 0 = none

    def start(self) -> None:
        """Start the thread and subscribe it to every stream (the context is current); on
        a failure, end the thread and undo what was subscribed, then raise."""
        acl = self._acl
        tid, ret = acl.util.start_thread(self._loop, [])
        check(acl, ret, f"{self._model}: acl.util.start_thread")
        self.thread = tid
        try:
            for stream in self._streams:
                ret = acl.rt.subscribe_report(tid, stream)
                check(acl, ret, f"{self._model}: rt.subscribe_report")
                self._subscribed.append(stream)
        except BaseException:
            self._stopping = True  # the loop returns at once, having processed nothing
            self._ready.set()
            self.stop(lambda ret, what: None)  # the load's own error is the one to raise
            raise
        self._ready.set()

    def _loop(self, _: Any) -> None:
        self._ready.wait()
        failures = 0
        try:
            while not self._stopping:
                ret = self._acl.rt.process_report(-1)
                if ret == ACL_SUCCESS:
                    failures = 0
                    continue
                failures += 1  # it ran no callback: the next call runs them
                log.warning("acl_process_report_failed", model=self._model, code=ret)
                if failures >= MAX_REPORT_FAILURES:
                    self._failed = ret
                    log.error("acl_report_thread_failed", model=self._model, code=ret)
                    break
        finally:
            self._ended.set()
            for done in self._done:  # nobody waits for ever on a dead thread
                done.set()

    def _completed(self, index: int) -> None:
        """The callback, on the report thread: batch `index`'s stream work is done."""
        self._done[index].set()

    def _stop(self, _: Any) -> None:
        self._stopping = True

    def launch(self, index: int, stream: int) -> int:
        """Enqueue set `index`'s completion callback on its stream, after its batch."""
        if self._ended.is_set():  # nothing would run it
            raise self._dead()
        self._done[index].clear()
        ret: int = self._acl.rt.launch_callback(
            self._completed, index, ACL_CALLBACK_NO_BLOCK, stream
        )
        return ret

    def wait(self, index: int) -> None:
        """Until set `index`'s callback ran (its batch's outputs are on the host)."""
        if not self._ended.is_set():  # the loop's end sets every event after `_ended`
            self._done[index].wait()
        if self._ended.is_set():
            raise self._dead()

    def _dead(self) -> BackendError:
        if self._failed:
            return acl_error(self._acl, self._failed, f"{self._model}: rt.process_report")
        return BackendError(f"{self._model}: the report thread has ended")

    def stop(self, attempt: Attempt) -> None:
        """End the thread: the stop callback (on the first stream, after its work) unless
        the loop is ending already, the loop's end waited for, each stream unsubscribed, the
        thread joined. Every stream is synchronized before."""
        acl = self._acl
        if not self.thread:
            return
        if self._subscribed and not self._stopping and not self._ended.is_set():
            stream = self._subscribed[0]
            ret = acl.rt.launch_callback(self._stop, 0, ACL_CALLBACK_BLOCK, stream)
            attempt(ret, "rt.launch_callback (stop the report thread)")
            if ret == ACL_SUCCESS:
                self._ended.wait()  # the loop ran the stop callback, or died: it returned
        elif self._stopping:
            self._ended.wait()  # it returns at once: it was told before it processed
        for stream in self._subscribed:
            attempt(acl.rt.unsubscribe_report(self.thread, stream), "rt.unsubscribe_report")
        self._subscribed = []
        if self._ended.is_set() or self._stopping:
            attempt(acl.util.stop_thread(self.thread), "acl.util.stop_thread")
        self.thread = 0
