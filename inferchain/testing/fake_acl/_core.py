"""FakeAcl's shared core: error codes, the call wrapper, the ledger and fault injection.

Every public fake call goes through `api()`: it counts the call, refuses the calls that need
`init` (those that reach GE's model executor, `NEEDS_INIT`) and those a callback must not make,
fires injected faults, and turns an internal `Fail` into the call's documented return shape
(a bare code, `(0, code)`, `({}, code)`, a NULL value ...), as pyACL reports errors.
"""

from __future__ import annotations

import functools
import itertools
import operator
import random
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

import attrs

from inferchain.testing.fake_acl._args import parse
from inferchain.testing.fake_acl._order import Clock
from inferchain.testing.gates import Gates

if TYPE_CHECKING:
    from inferchain.testing.fake_acl._mdl import Dataset, Desc, Execution, LoadedModel
    from inferchain.testing.fake_acl._memory import DeviceMemory, HostMemory
    from inferchain.testing.fake_acl._report import Reports
    from inferchain.testing.fake_acl._rt import Context, Event, Landing, Stream

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


@attrs.define
class Injection:
    """A fault planted by `FakeAcl.inject`."""

    call: str
    code: int
    nth: int | None  # fire once, on this call (1-based, counted from the inject)
    p: float | None  # fire on each call with this probability
    seen: int = 0  # matching calls since the inject


class Slice(NamedTuple):
    """One piece of simulated device time, as `FakeAcl.slices` lists them."""

    stream: int  # the stream's handle
    kind: str  # "h2d", "d2h", "d2d", "h2h" (copies) or "compute"
    start: float  # time.perf_counter() seconds
    end: float


@attrs.define(eq=False)
class DataBuffer:
    handle: int
    ptr: int  # what acl.create_data_buffer was given (device memory, usually)
    size: int  # bytes


class State:
    """Everything one fake "process" holds: the ledger of live handles, counters, faults."""

    def __init__(self, *, seed: int, device_count: int) -> None:
        self.lock = threading.RLock()
        self.device_count = device_count
        self.initialized = False
        self.was_finalized = False
        self.calls: list[str] = []
        self.counts: Counter[str] = Counter()
        self.errors: list[tuple[str, int]] = []  # every failed call, in order
        self.executions: list[Execution] = []
        self.injections: list[Injection] = []
        self.rng = random.Random(seed)
        self._tls = threading.local()
        self._handles = itertools.count(0x5A0000, 0x40)  # one space: no two handles collide
        self._model_ids = itertools.count(1)
        # the ledger, handle -> object
        self.device_refs: Counter[int] = Counter()  # device id -> set_device references
        self.default_contexts: dict[int, Context] = {}  # device id -> implicit context
        self.contexts: dict[int, Context] = {}  # created with rt.create_context
        self.streams: dict[int, Stream] = {}
        self.events: dict[int, Event] = {}
        self.models: dict[int, LoadedModel] = {}  # by model_id
        self.descs: dict[int, Desc] = {}
        self.datasets: dict[int, Dataset] = {}
        self.buffers: dict[int, DataBuffer] = {}
        self.memory: DeviceMemory
        self.host: HostMemory
        # ordering and the device time model
        self.host_clock: Clock = {}  # stream work the host has synchronized
        self.landings: list[Landing] = []  # async copies into host memory, not yet landed
        self.slices: list[Slice] = []
        self.copies: Counter[str] = Counter()  # direction -> copies enqueued or made
        self.copied: Counter[str] = Counter()  # direction -> their bytes
        self.copy_bandwidth: float | None = None  # bytes per second; None = instant
        self.compute_scale: float = 1.0  # simulated compute = ONNX Runtime time x this
        self.executes = Gates()  # every model execution passes here before it computes
        self.engines: dict[tuple[int, str], threading.Lock] = {}  # (device, direction)
        # callbacks: report threads (acl.util.start_thread) and stream subscriptions
        self.threads: dict[int, threading.Thread] = {}  # thread id -> its thread
        self.reports: dict[int, Reports] = {}  # thread id -> its queue of launched callbacks
        self.subscribed: dict[int, int] = {}  # stream handle -> subscribed thread id
        self.app_logs: list[tuple[int, str]] = []  # acl.app_log (level, message)
        self.callback_errors: list[Exception] = []  # what callbacks raised

    def count_copy(self, direction: str, nbytes: int) -> None:
        """A copy was made or enqueued (state lock held)."""
        self.copies[direction] += 1
        self.copied[direction] += nbytes

    # -- handles and the calling thread ----------------------------------------------------

    def new_handle(self) -> int:
        return next(self._handles)

    def new_model_id(self) -> int:
        return next(self._model_ids)

    @property
    def current(self) -> Context | None:
        """The calling thread's current context (None if unset or destroyed since)."""
        ctx: Context | None = getattr(self._tls, "context", None)
        return ctx if ctx is not None and ctx.alive else None

    @current.setter
    def current(self, ctx: Context | None) -> None:
        self._tls.context = ctx

    def require_context(self) -> Context:
        ctx = self.current
        if ctx is None:
            raise Fail(RT_CONTEXT_NULL, "no current context on this thread (set_context first)")
        return ctx

    def engine(self, device: int, direction: str) -> threading.Lock:
        """The copy engine of one direction of one device: its copies run one at a time."""
        with self.lock:
            return self.engines.setdefault((device, direction), threading.Lock())

    def require_stream(self, handle: int, *, same_context: bool = True) -> Stream:
        """The stream, checked against the calling thread's current context."""
        if handle == 0:
            raise Fail(RT_PARAM_INVALID, "stream 0 (default stream) is not modelled: create one")
        stream = self.streams.get(handle)
        if stream is None:
            raise Fail(RT_PARAM_INVALID, f"unknown stream {handle:#x}")
        if not same_context:
            return stream
        ctx = self.require_context()
        if ctx is not stream.context:
            raise Fail(
                RT_STREAM_CONTEXT,
                f"stream {handle:#x} belongs to context {stream.context.handle:#x}, "
                f"the thread's current context is {ctx.handle:#x}",
            )
        return stream

    @property
    def in_callback(self) -> bool:
        """True on a report thread while it runs a stream callback."""
        return bool(getattr(self._tls, "in_callback", False))

    @in_callback.setter
    def in_callback(self, value: bool) -> None:
        self._tls.in_callback = value

    @property
    def recent_error(self) -> str:
        return cast(str, getattr(self._tls, "message", ""))

    # -- calls, errors, faults ------------------------------------------------------------

    def record_call(self, name: str) -> None:
        with self.lock:
            self.calls.append(name)
            self.counts[name] += 1

    def record_error(self, name: str, code: int, message: str) -> None:
        with self.lock:
            self.errors.append((name, code))
        self._tls.message = f"[fake acl] {name}: {message}"

    def maybe_inject(self, name: str) -> None:
        with self.lock:
            for inj in self.injections:
                if inj.call != name:
                    continue
                inj.seen += 1
                if inj.nth is not None:
                    fire = inj.seen == inj.nth
                    if fire:
                        self.injections.remove(inj)
                elif inj.p is not None:
                    fire = self.rng.random() < inj.p
                else:
                    fire = True
                if fire:
                    raise Fail(inj.code, f"injected failure (call #{inj.seen} since inject)")


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


class Namespace:
    """Base of the fake's attribute tree (`acl`, `acl.rt`, `acl.mdl`): they share one State."""

    def __init__(self, state: State) -> None:
        self._state = state


def api(name: str, fmt: str, failure: Failure = ret) -> Callable[[F], F]:
    """Wrap a fake call: parse its arguments as pyACL's format `fmt` does (TypeError, before
    anything else), count it, check init, fire faults, map `Fail` to its return shape."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(self: Namespace, *args: Any, **kwargs: Any) -> Any:
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
