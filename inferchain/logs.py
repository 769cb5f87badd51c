"""The library's loggers: quiet unless the application configured logging, and never fatal.

A library never configures output. `get_logger(__name__)` follows the application's
`structlog.configure(...)` once there is one; until then its events go to the stdlib
`logging` logger of the same name, whose default (no handlers configured) shows WARNING and
above on stderr and nothing below. `logging.basicConfig(level=logging.INFO)` in the
application shows the info events too.

`configure_output` is for the applications (the command line, each Ray actor): the one
place that calls `structlog.configure`. A runtime's own log (onnxruntime's) is the
backends' business: the applications set it beside, with
`inferchain.backends.factory.set_runtime_log_level`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog


def log_safely(emit: Callable[..., object], event: str, **fields: object) -> None:
    """`emit(event, **fields)`, swallowing whatever the configured logger raises."""
    with contextlib.suppress(Exception):  # nothing better to do with a failing logger
        emit(event, **fields)


def _render(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> str:
    """`event key=value ...`, then the traceback if there is one."""
    event = event_dict.pop("event", "")
    trace = event_dict.pop("exception", None)
    line = " ".join([str(event), *(f"{k}={v!r}" for k, v in sorted(event_dict.items()))])
    return f"{line}\n{trace}" if trace else line


def _stdlib_logger(name: str) -> Any:
    """A structlog logger over `logging.getLogger(name)`, filtered by the stdlib's levels."""
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.processors.format_exc_info,
            _render,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


class LibraryLogger:
    """A module's logger that picks, at each call, structlog when the application configured
    it and the stdlib logger of the same name otherwise."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._structlog: Any = structlog.get_logger(name)
        self._stdlib: Any = _stdlib_logger(name)
        self._logging = logging.getLogger(name)

    @property
    def target(self) -> Any:
        """The logger events go to right now."""
        return self._structlog if structlog.is_configured() else self._stdlib

    def enabled(self, level: int) -> bool:
        """True when an event at `level` (a `logging` level) would go anywhere."""
        if not structlog.is_configured():
            return self._logging.isEnabledFor(level)  # cached by `logging`: cheap per batch
        target = self._structlog
        check = getattr(target, "is_enabled_for", None) or getattr(target, "isEnabledFor", None)
        return bool(check(level)) if check is not None else True

    def __getattr__(self, method: str) -> Any:
        return getattr(self.target, method)


def get_logger(name: str) -> Any:
    """The logger for module `name` (see the module docstring)."""
    return LibraryLogger(name)


def _stderr_logger(*args: object) -> structlog.PrintLogger:
    """A logger on whatever `sys.stderr` is at the time (it may be replaced, e.g. in tests)."""
    return structlog.PrintLogger(sys.stderr)


def configure_output(level: str, fmt: str = "auto") -> None:
    """For applications (the command line, a Ray actor), never the library itself: structlog
    to stderr at `level` and up, console lines on a TTY and JSON otherwise (`fmt` "auto"), or
    as asked ("console", "json")."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if fmt == "console" else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
