"""The callback thread: user callbacks run here, never on a worker (a slow callback must not
stall a device), and one that raises anything is logged with its request id and harms
nothing; a callback that never returns delays `stop` by its bound at most."""

from __future__ import annotations

import queue
import threading

from inferchain.core.guard import call_user
from inferchain.core.request import Request
from inferchain.logs import get_logger, log_safely

log = get_logger(__name__)


class CallbackThread:
    """Runs `request.callback(request)` for finished requests, in finishing order."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="inferchain-callbacks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, request: Request) -> None:
        """Queue a finished request whose callback is set (any thread)."""
        self._queue.put(request)

    def stop(self, timeout: float | None = None) -> bool:
        """Run what is queued, then end the thread and join it (unless called from it),
        waiting at most `timeout` seconds (None: until it ends). False when a callback still
        runs after that: the thread (a daemon) is left to end after it, and it is logged."""
        self._queue.put(None)
        if not self._thread.is_alive() or threading.current_thread() is self._thread:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            log_safely(log.warning, "callbacks_not_finished", waited_s=timeout)
            return False
        return True

    def _main(self) -> None:
        while (request := self._queue.get()) is not None:
            assert request.callback is not None
            call_user(  # on this thread a KeyboardInterrupt is logged like any error
                request.callback,
                request,
                "callback_failed",
                request_id=request.id,
                model=request.model,
            )
