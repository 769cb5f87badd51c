"""The exception tree: one root so a batch job can catch everything inferchain raises.

InferchainError
├── ConfigError          a recipe or an argument is wrong (names the key and the file)
├── InvalidInput         an input does not match the model (names input, expected, actual)
├── InvalidTransition    an illegal Request state change (a bug, never user input)
├── QueueFull            submit(block=False) found the waiting queue full
├── Closed               the OfflineInference (or a Ray predictor) is closed or not initialised
├── MissingDependency    an optional package is not installed (names the extra)
│   └── RayNotInstalled  (inferchain.integrations.ray) `ray[data]` is missing
├── LoadError            start-up failed: a device runtime or a model could not be loaded or
│                        initialised (the runtime's numeric code and name when it gave one)
└── RequestError         a request ended without outputs
    ├── BackendError     the device runtime failed (numeric code and name)
    │   └── OutputMismatch   a batch's outputs do not hold the batch's rows (the model's
    │                        declared shapes or the recipe's batch axes are wrong)
    ├── RequestTimeout   the deadline passed before the request ran
    ├── RequestCancelled cancel() or close() ended the request
    ├── DependencyFailed a request it depends on did not finish DONE
    └── StateLost        a sequence's carried state was lost (its model was re-loaded)
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
    """The OfflineInference (or a Ray predictor) is not initialised or has been closed."""


class MissingDependency(InferchainError, ImportError):
    """An optional package is not installed; the message names the extra that brings it."""


class _RuntimeCoded(InferchainError):
    """An error that carries the device runtime's own code.

    `code` is the backend's numeric code (None when the runtime gives none) and `name` its
    symbolic name, e.g. ``207001`` / ``"ACL_ERROR_RT_MEMORY_ALLOCATION"``.
    """

    def __init__(self, message: str, *, code: int | None = None, name: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.name = name


class LoadError(_RuntimeCoded):
    """Start-up failed: the device runtime or a model could not be loaded or initialised
    (`init()`, a backend's `load`). `code` and `name` as on `BackendError`."""

    @classmethod
    def from_backend(cls, error: BackendError) -> LoadError:
        """The same failure, met while starting up rather than while running a batch."""
        return cls(str(error), code=error.code, name=error.name)


class RequestError(InferchainError):
    """A request ended without outputs."""


class BackendError(_RuntimeCoded, RequestError):
    """The device runtime failed while running a batch (the requests in it end with this).

    `code` is the backend's numeric code (None when the runtime gives none) and `name` its
    symbolic name, e.g. ``207001`` / ``"ACL_ERROR_RT_MEMORY_ALLOCATION"``.
    """


class OutputMismatch(BackendError):
    """A batch's outputs do not have the batch's rows on their batch axis: the model does not
    return what it declares, or the recipe names the wrong batch axis (the message says which
    output, axis, rows found and expected, and the recipe key that fixes it). The batch's
    requests end with it: none ever receives another request's rows. Not a failure of the
    session (re-loading it would not help), so it does not count towards `health`."""

    def __init__(self, message: str) -> None:
        super().__init__(message, name="OutputMismatch")


class StateLost(RequestError):
    """A sequence's carried state was lost: it lived in device memory of a session that was
    re-loaded after failures. The sequence cannot go on; others are not affected."""


class RequestTimeout(RequestError):
    """The request's deadline passed while it was WAITING or READY."""


class RequestCancelled(RequestError, concurrent.futures.CancelledError):
    """The request was cancelled (by `cancel()`, `cancel_all()` or `close()`); also a
    `concurrent.futures.CancelledError`, as a cancelled future raises."""


class DependencyFailed(RequestError):
    """A request listed in `depends_on` ended in ERROR, CANCELLED or TIMED_OUT."""


MAX_MESSAGE = 2000  # characters of an error message shown to a user, at most


def cut_message(text: str) -> str:
    """`text` cut to `MAX_MESSAGE` characters: an error message stays one readable line,
    whatever value it shows."""
    if len(text) <= MAX_MESSAGE:
        return text
    return f"{text[:MAX_MESSAGE]}... ({len(text)} characters in all)"
