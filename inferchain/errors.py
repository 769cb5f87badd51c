"""The exception tree: one root so a batch job can catch everything inferchain raises.

InferchainError
├── ConfigError          a recipe or an argument is wrong (names the key and the file)
├── InvalidInput         an input does not match the model (names input, expected, actual)
├── InvalidTransition    an illegal Request state change (a bug, never user input)
├── QueueFull            submit(block=False) found the waiting queue full
├── Closed               the OfflineInference is closed or was never initialised
└── RequestError         a request ended without outputs
    ├── BackendError     the device runtime failed (numeric code and name)
    ├── RequestTimeout   the deadline passed before the request ran
    ├── RequestCancelled cancel() or close() ended the request
    └── DependencyFailed a request it depends on did not finish DONE
"""

from __future__ import annotations

import concurrent.futures


class InferchainError(Exception):
    """Root of every error inferchain raises."""


class ConfigError(InferchainError):
    """A recipe, an override or an argument is wrong; the message names the key and file."""


class InvalidInput(InferchainError):
    """An input does not fit the model; the message names input, expected and actual."""


class InvalidTransition(InferchainError):
    """A Request was asked to move to a state its transition table forbids."""


class QueueFull(InferchainError):
    """The waiting queue is at `max_queue_size` and the caller asked not to block."""


class Closed(InferchainError):
    """The OfflineInference is not initialised or has been closed."""


class RequestError(InferchainError):
    """A request ended without outputs."""


class BackendError(RequestError):
    """The device runtime failed.

    `code` is the backend's numeric code (None when the runtime gives none) and `name` its
    symbolic name, e.g. ``207001`` / ``"ACL_ERROR_RT_MEMORY_ALLOCATION"``.
    """

    def __init__(self, message: str, *, code: int | None = None, name: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.name = name


class RequestTimeout(RequestError):
    """The request's deadline passed while it was WAITING or READY."""


class RequestCancelled(RequestError, concurrent.futures.CancelledError):
    """The request was cancelled (by `cancel()`, `cancel_all()` or `close()`); also a
    `concurrent.futures.CancelledError`, as a cancelled future raises."""


class DependencyFailed(RequestError):
    """A request listed in `depends_on` ended in ERROR, CANCELLED or TIMED_OUT."""
