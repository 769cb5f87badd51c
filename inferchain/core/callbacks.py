"""The callback thread: user callbacks run here, never on a worker (a slow callback must not
stall a device), and one that raises is logged with its request id and harms nothing."""

from __future__ import annotations

import queue
import threading

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

    def stop(self) -> None:
        """Run what is queued, then end the thread and join it (unless called from it)."""
        self._queue.put(None)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def _main(self) -> None:
        while (request := self._queue.get()) is not None:
            assert request.callback is not None
            try:
                request.callback(request)
            except Exception as e:
                log_safely(
                    log.error,
                    "callback_failed",
                    request_id=request.id,
                    model=request.model,
                    error=type(e).__name__,
                    detail=str(e),
                    exc_info=True,
                )
