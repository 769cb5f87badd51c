"""FakeAcl's ledger: the one `State` a fake "process" holds, shared by every namespace.

`State` keeps the live handles (contexts, streams, events, models, descs, datasets, data
buffers, memory), the counters and errors, the injected faults, and the device time model;
`Namespace` is the base of the attribute tree (`acl`, `acl.rt`, `acl.mdl`, `acl.util`) that
shares it. The objects it holds are in `_objects`, the codes and the call wrapper in `_calls`.
"""

from __future__ import annotations

import ctypes
import itertools
import random
import threading
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple, cast

import attrs

from inferchain.testing.fake_acl._calls import (
    RT_CONTEXT_NULL,
    RT_PARAM_INVALID,
    RT_STREAM_CONTEXT,
    Fail,
    Ledger,
)
from inferchain.testing.fake_acl._order import Clock, merge
from inferchain.testing.gates import Gates

if TYPE_CHECKING:
    from inferchain.testing.fake_acl._memory import DeviceMemory, HostMemory
    from inferchain.testing.fake_acl._objects import (
        Context,
        Dataset,
        Desc,
        Event,
        Execution,
        Landing,
        LoadedModel,
        Reports,
        Stream,
    )


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


class Namespace:
    """Base of the fake's attribute tree (`acl`, `acl.rt`, `acl.mdl`): they share one State."""

    def __init__(self, state: State) -> None:
        self._state = state


if TYPE_CHECKING:
    _LEDGER: type[Ledger] = State  # the state is what `api()` takes it for


def land(st: State) -> None:
    """Write every landing the host clock now covers (state lock held)."""
    keep = []
    for landing in st.landings:
        if st.host_clock.get(landing.stream, 0) < landing.seq:
            keep.append(landing)
        elif landing.data is not None:
            ctypes.memmove(landing.dst, landing.data, len(landing.data))
    st.landings[:] = keep


def synchronized(st: State, clock: Mapping[int, int]) -> None:
    """The host now knows the work in `clock` complete: advance it and land copies."""
    with st.lock:
        merge(st.host_clock, clock)
        land(st)
