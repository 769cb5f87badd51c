"""Logging from threads that must not die: a failing log sink must never strand a request."""

from __future__ import annotations

import contextlib
from collections.abc import Callable


def log_safely(emit: Callable[..., object], event: str, **fields: object) -> None:
    """`emit(event, **fields)`, swallowing whatever the configured logger raises."""
    with contextlib.suppress(Exception):  # nothing better to do with a failing logger
        emit(event, **fields)
