"""FakeAcl's calls: pyACL's error codes, the internal `Fail`, and the call wrapper `api()`.

Every public fake call goes through `api()`: it parses its arguments as pyACL does
(`_args`), counts it, refuses the calls that need `init` (those that reach GE's model
executor, `NEEDS_INIT`) and those a callback must not make, fires injected faults, and turns
an internal `Fail` into the call's documented return shape (a bare code, `(0, code)`,
`({}, code)`, a NULL value ...), as pyACL reports errors. It needs of the fake's state only
what `Ledger` names, so this module is the bottom of the fake: of its other modules it
imports only `_args`, which imports none.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, cast

from inferchain.testing.fake_acl._args import parse

SUCCESS = 0
INVALID_PARAM = 100000
UNINITIALIZE = 100001
REPEAT_INITIALIZE = 100002
INVALID_FILE = 100003
INVALID_MODEL_ID = 100011
MODEL_INPUT_NOT_MATCH = 100017
MODEL_OUTPUT_NOT_MATCH = 100018
MODEL_NOT_DYNAMIC = 100019
REPEAT_FINALIZE = 100037
INVALID_RESOURCE_HANDLE = 200005
RT_PARAM_INVALID = 107000
RT_INVALID_DEVICEID = 107001
RT_CONTEXT_NULL = 107002
RT_STREAM_CONTEXT = 107003
RT_MODEL_CONTEXT = 107004
RT_EVENT_TIMESTAMP_INVALID = 107006
RT_ADDR_UNALIGNED = 107008
RT_MEMORY_ALLOCATION = 207001
RT_STREAM_SUBSCRIBE = 107011
RT_THREAD_SUBSCRIBE = 107012
RT_STREAM_NO_CB_REG = 107015
RT_REPORT_TIMEOUT = 507012
GE_PARAM_INVALID = 145000
GE_EXEC_NOT_INIT = 145001
GE_DYNAMIC_BATCH_SIZE_INVALID = 145013
GE_SHAPE_INVALID = 145021
INTERNAL_ERROR = 500000

# Which calls need `acl.init()`. In hicann/runtime's acl (src/acl/aclrt_impl/acl.cpp,
# device.cpp) only the dump calls check the init flag (`GetAclInitFlag`, toolchain/dump.cpp);
# `aclrtGetRunModeImpl` asks `rtGetRunMode` directly, and the rt calls go straight to the
# runtime. The model calls reach GE's `GeExecutor` (graphengine ge/executor/ge_executor.cc),
# whose LoadModelFromData / LoadDataFromFile / ExecModel / UnloadModel / GetModelDescInfo
# return ACL_ERROR_GE_EXEC_NOT_INIT (145001) while `isInit_` is false (aclInit initialises
# it, aclFinalize finalizes it). Everything else answers before init too.
NEEDS_INIT = frozenset(
    {
        "mdl.load_from_file",
        "mdl.load_from_mem",
        "mdl.get_desc",
        "mdl.execute",
        "mdl.execute_async",
        "mdl.unload",
    }
)
# What a callback must not call (it runs on the report thread, inside process_report):
# it would deadlock or reorder the stream it is an order point of. Stricter than the card.
NOT_IN_CALLBACK = frozenset(
    {
        "rt.malloc",
        "rt.free",
        "rt.malloc_host",
        "rt.free_host",
        "rt.synchronize_stream",
        "rt.synchronize_event",
        "rt.launch_callback",
        "rt.memcpy_async",
        "mdl.execute_async",
        "mdl.execute",
    }
)


class Fail(Exception):
    """Internal: a fake call fails with `code`; `api()` turns it into the return value."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


T = TypeVar("T")


def as_int(value: object, what: str) -> int:
    """`value` as an int, or TypeError (pyACL's argument parsing rejects non-integers)."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__}") from None


def lookup(table: Mapping[int, T], value: object, what: str, code: int) -> T:
    """The live object behind handle `value`, or `Fail(code)` naming an unknown `what`."""
    handle = as_int(value, what.replace(" ", "_"))
    found = table.get(handle)
    if found is None:
        raise Fail(code, f"unknown {what} {handle:#x}")
    return found


F = TypeVar("F", bound=Callable[..., Any])

Failure = Callable[[int, tuple[Any, ...]], Any]  # (code, call args) -> what the call returns


def ret(code: int, args: tuple[Any, ...]) -> int:
    return code


def pair(code: int, args: tuple[Any, ...]) -> tuple[int, int]:
    return 0, code


def dict_pair(code: int, args: tuple[Any, ...]) -> tuple[dict[str, Any], int]:
    return {}, code


def null(code: int, args: tuple[Any, ...]) -> int:
    return 0


def undefined_type(code: int, args: tuple[Any, ...]) -> int:
    return -1  # ACL_DT_UNDEFINED


def empty_name(code: int, args: tuple[Any, ...]) -> str:
    return ""


def same_first(code: int, args: tuple[Any, ...]) -> tuple[Any, int]:
    return (args[0] if args else 0), code


class Ledger(Protocol):
    """What `api()` needs of the fake's state (`_core.State`)."""

    initialized: bool

    @property
    def in_callback(self) -> bool:
        """True on a report thread while it runs a stream callback."""

    def record_call(self, name: str) -> None:
        """Count a call of `name`."""

    def record_error(self, name: str, code: int, message: str) -> None:
        """Note that the call `name` failed with `code`."""

    def maybe_inject(self, name: str) -> None:
        """Raise `Fail` where a planted fault fires on this call of `name`."""


class Caller(Protocol):
    """What a fake call is a method of (a `_core.Namespace`)."""

    @property
    def _state(self) -> Ledger: ...


def api(name: str, fmt: str, failure: Failure = ret) -> Callable[[F], F]:
    """Wrap a fake call: parse its arguments as pyACL's format `fmt` does (TypeError, before
    anything else), count it, check init, fire faults, map `Fail` to its return shape."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(self: Caller, *args: Any, **kwargs: Any) -> Any:
            parsed = parse(name, fmt, args, kwargs)
            state = self._state
            state.record_call(name)
            try:
                if name in NEEDS_INIT and not state.initialized:
                    raise Fail(
                        GE_EXEC_NOT_INIT,
                        "the model executor is not initialized (acl.init() first; "
                        "or acl.finalize() was called)",
                    )
                if name in NOT_IN_CALLBACK and state.in_callback:
                    raise Fail(
                        RT_PARAM_INVALID,
                        f"{name} inside a stream callback (a callback must not allocate, free, "
                        "synchronize or launch)",
                    )
                state.maybe_inject(name)
                return fn(self, *parsed)
            except Fail as e:
                state.record_error(name, e.code, e.message)
                return failure(e.code, parsed)

        return cast(F, call)

    return wrap
