"""Calling user code (done-listeners, callbacks) so that nothing it raises stops the framework.

User code may raise anything, `BaseException` included (`SystemExit`, `KeyboardInterrupt`,
`GeneratorExit`). `call_user` catches it where the code is called and logs it. A
`KeyboardInterrupt` on the caller's own thread (any thread that is not one of the
framework's `inferchain-*` threads) is handed back, for the caller to re-raise once the
framework's own work there is done; on a framework thread it is logged like the rest, since
no one there could take it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from inferchain.logs import get_logger, log_safely

log = get_logger(__name__)

FRAMEWORK_THREAD = "inferchain-"  # the name prefix of every thread the framework starts


def on_framework_thread() -> bool:
    """True on a thread the framework started (engine, workers, callbacks, host pool)."""
    return threading.current_thread().name.startswith(FRAMEWORK_THREAD)


def call_user(
    fn: Callable[[Any], object], arg: Any, event: str, **fields: object
) -> KeyboardInterrupt | None:
    """`fn(arg)`; whatever it raises is logged as `event` (with `fields` and the error's type
    and message). Returns a `KeyboardInterrupt` it raised on the caller's thread (to be
    re-raised there), else None."""
    try:
        fn(arg)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt) and not on_framework_thread():
            return e
        log_safely(log.error, event, error=type(e).__name__, detail=str(e), exc_info=True, **fields)
    return None
