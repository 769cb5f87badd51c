"""Ascend pyACL backend: `.om` models on an NPU through an injected (or imported) `acl` module.

The constants and the error table are in `acl_api`, one buffer set (stream, events, device
and host buffers) in `acl_buffers`. Every non-zero return code becomes a `BackendError`
carrying the code, its name and `acl.get_recent_err_msg()`. A session is loaded, run and
closed on its worker's thread (pyACL contexts are per thread); all device and host buffers
are allocated once at load, so `launch` / `collect` / `run` never allocate.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from inferchain.backends.acl_api import (
    ACL_DTYPES,
    ACL_ERROR_REPEAT_INITIALIZE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    ACL_SUCCESS,
    DYNAMIC_INPUT_NAME,
    acl_error,
    check,
    import_acl,
    null_error,
)
from inferchain.backends.acl_buffers import (
    BufferSet,
    Launched,
    Slot,
    ignore,
    make_sets,
    set_bytes,
    value_of,
)
from inferchain.backends.acl_clock import DeviceClock
from inferchain.backends.acl_constants import DeviceConstants
from inferchain.backends.acl_constants import plan as plan_constants
from inferchain.backends.acl_gears import DimsGear, batch_gear, pick_dims, split_dims, with_rows
from inferchain.backends.acl_handover import HandoverPool, Lease, gather, scatter, unpin
from inferchain.backends.acl_handover import plan as plan_handover
from inferchain.backends.acl_reports import Reports
from inferchain.backends.acl_state import Carried, DeviceState, plan
from inferchain.backends.base import Backend, Session
from inferchain.config import ModelConfig, Recipe
from inferchain.errors import BackendError, ConfigError, LoadError
from inferchain.handover import DeviceTensor
from inferchain.layout import Axis, Layout
from inferchain.logs import get_logger
from inferchain.precision import declared_precision
from inferchain.tensors import StateRows, TensorDesc

log = get_logger(__name__)

DEFAULT_STREAMS = 2  # buffer sets per session when the recipe does not say
STAGES = (
    ("h2d", "start", "copied"),
    ("compute", "copied", "computed"),
    ("d2h", "computed", "done"),
)


# -- acl.init / acl.finalize, reference counted per acl module (one per process) ------------


@attrs.define
class _Runtime:
    module: Any  # held so its id is not reused while counted
    refs: int
    owned: bool  # we called init successfully, so the last release calls finalize


_RUNTIMES: dict[int, _Runtime] = {}
_RUNTIMES_LOCK = threading.Lock()


def _acquire_runtime(acl: Any) -> None:
    with _RUNTIMES_LOCK:
        runtime = _RUNTIMES.get(id(acl))
        if runtime is None:
            ret = acl.init()
            if ret not in (ACL_SUCCESS, ACL_ERROR_REPEAT_INITIALIZE):
                raise acl_error(acl, ret, "acl.init")
            # REPEAT_INITIALIZE: someone else initialised the process and will finalize it
            runtime = _RUNTIMES[id(acl)] = _Runtime(acl, 0, owned=ret == ACL_SUCCESS)
        runtime.refs += 1


def _release_runtime(acl: Any) -> None:
    with _RUNTIMES_LOCK:
        runtime = _RUNTIMES[id(acl)]
        runtime.refs -= 1
        if runtime.refs:
            return
        del _RUNTIMES[id(acl)]
        if runtime.owned:
            check(acl, acl.finalize(), "acl.finalize")


# -- which context each thread has current, as far as this module made it so ---------------

_THREAD = threading.local()


def _current_context(acl: Any) -> int:
    contexts: dict[int, int] = getattr(_THREAD, "contexts", {})
    return contexts.get(id(acl), 0)


def _note_current(acl: Any, context: int) -> None:
    if not hasattr(_THREAD, "contexts"):
        _THREAD.contexts = {}
    _THREAD.contexts[id(acl)] = context


# -- the session ----------------------------------------------------------------------------


def _io_name(name: str) -> str:
    """Tensor name without ATC's "op:edge:" prefix (ONNX outputs read "op:0:name")."""
    parts = name.split(":")
    return parts[-1] if len(parts) >= 3 and parts[-1] else name


class AclSession(Session):
    """One loaded `.om` model: its context, the model, and K buffer sets (each with its own
    stream, events, device buffers and host staging), all made at load.

    Batches on different sets overlap: `launch` enqueues H2D -> execute -> D2H on the set's
    stream and returns; executions of the one model are chained across sets with events, so
    the H2D copy of batch n+1 and the D2H copy of batch n-1 run during the execute of n.
    Use it from the thread that loaded it. `close()` may run on another thread: it makes the
    context current there first, as pyACL allows.
    """

    reuses_outputs = True  # outputs are views of a set's host staging, reused by its next launch

    def __init__(self, acl: Any, model: ModelConfig, device: int) -> None:
        self._acl = acl
        self._model = model
        self._device = device
        self._owner = threading.get_ident()
        self._lock = threading.Lock()
        self._closed = False
        self._on_close: list[Callable[[AclSession], None]] = []
        # handles, 0 / None until made; `_release` undoes whatever exists
        self._device_set = False
        self._context = 0
        self._model_id: int | None = None
        self._desc = 0
        self._in_slots: list[Slot] = []  # the desc's inputs and outputs (no memory)
        self._out_slots: list[Slot] = []
        self._sets: list[BufferSet] = []
        self._last_executed: BufferSet | None = None  # where the model last executed
        self._state: DeviceState | None = None  # sequence state lanes (open_state)
        self._constants: DeviceConstants | None = None  # constant inputs' lanes (open_state)
        self._reports: Reports | None = None  # the report thread (completion: callback)
        self._pools: dict[int, HandoverPool] = {}  # per handed output (recipe `from:`)
        # hand-overs of batches whose stream did not synchronize: kept until close
        self._stranded: list[tuple[dict[int, Lease], list[Lease]]] = []
        self._clock: DeviceClock | None = None  # device time on the host's clock
        self._spans: deque[tuple[float, float]] = deque(maxlen=1024)  # not yet taken
        # what launch() needs
        self._data_index: list[int] = []  # input positions without ascend_mbatch_shape_data
        self._mbatch_index: int | None = None
        self._batch_gears: tuple[int, ...] = ()
        self._hw_gears: tuple[tuple[int, int], ...] = ()
        self._dims_gears: tuple[DimsGear, ...] = ()
        self._in_axes: tuple[Axis, ...] = ()  # per data input, the dim of its rows
        self._out_axes: tuple[int, ...] = ()  # per output
        self._batch = 1  # rows the model runs: compiled batch or largest gear
        self._floor = 1  # rows a batch runs at least: a deterministic model's gear
        self._batching = model.max_batch_size > 0
        self.num_streams = model.streams or DEFAULT_STREAMS
        self.inputs = ()
        self.outputs = ()

    @property
    def model_name(self) -> str:
        return self._model.name

    @property
    def set_bytes(self) -> int:
        """Device bytes of one buffer set: what each stream beyond the first costs."""
        return set_bytes(self._in_slots, self._out_slots)

    # -- load -----------------------------------------------------------------------------

    @classmethod
    def open(cls, acl: Any, model: ModelConfig, device: int) -> AclSession:
        """Load `model` on `device` from the calling thread; release everything on failure."""
        session = cls(acl, model, device)
        try:
            session._load()
        except BaseException:
            errors = session._release()
            for e in errors:
                log.warning("acl_load_cleanup_failed", model=model.name, error=str(e))
            raise
        log.info(
            "acl_model_loaded",
            model=model.name,
            device=device,
            max_batch_size=session.max_batch_size,
            batch_gears=list(session._batch_gears),
            hw_gears=[list(g) for g in session._hw_gears],
            dims_gears=len(session._dims_gears),
            streams=session.num_streams,
        )
        return session

    def _call(self, ret: int, what: str) -> None:
        check(self._acl, ret, f"{self._model.name}: {what}")

    def _value(self, result: tuple[Any, int], what: str) -> Any:
        return value_of(self._acl, result, f"{self._model.name}: {what}")

    def _load(self) -> None:
        acl, rt, mdl = self._acl, self._acl.rt, self._acl.mdl
        self._call(rt.set_device(self._device), f"rt.set_device({self._device})")
        self._device_set = True
        self._context = self._value(rt.create_context(self._device), "rt.create_context")
        _note_current(acl, self._context)
        path = self._model.path
        self._model_id = self._value(mdl.load_from_file(path), f"mdl.load_from_file({path})")
        self._desc = mdl.create_desc()
        if not self._desc:
            raise null_error(acl, f"{self._model.name}: mdl.create_desc")
        self._call(mdl.get_desc(self._desc, self._model_id), "mdl.get_desc")
        self._describe()
        self._sets = make_sets(
            self.num_streams, self._in_slots, self._out_slots, DYNAMIC_INPUT_NAME
        )
        for buffer_set in self._sets:
            buffer_set.allocate(acl, self._model.name)
        self._open_handovers()
        self._clock = DeviceClock.open(acl, self._model.name, self._sets[0].stream)
        if self._model.completion == "callback":
            self._reports = Reports(acl, self._model.name, [s.stream for s in self._sets])
            self._reports.start()

    def _describe(self) -> None:
        mdl, desc = self._acl.mdl, self._desc
        for kind, slots in (("input", self._in_slots), ("output", self._out_slots)):
            for i in range(getattr(mdl, f"get_num_{kind}s")(desc)):
                what = f"mdl.get_{kind}_dims({i})"
                dims = self._value(getattr(mdl, f"get_{kind}_dims")(desc, i), what)
                acl_type = getattr(mdl, f"get_{kind}_data_type")(desc, i)
                name = _io_name(str(dims.get("name", "")) or f"{kind}{i}")
                dtype = ACL_DTYPES.get(acl_type)
                if dtype is None:
                    raise BackendError(
                        f"{self._model.name}: {kind} {name!r} has aclDataType {acl_type}, "
                        "which has no numpy dtype here",
                        name="ACL_UNSUPPORTED_DTYPE",
                    )
                size = getattr(mdl, f"get_{kind}_size_by_index")(desc, i)
                slots.append(Slot(size, dtype, tuple(dims["dims"]), name))
        if not self._in_slots or not self._out_slots:
            raise BackendError(f"{self._model.name}: the model desc lists no inputs or outputs")
        names = [s.name for s in self._in_slots]
        self._data_index = [i for i, n in enumerate(names) if n != DYNAMIC_INPUT_NAME]
        data_slots = [self._in_slots[i] for i in self._data_index]
        self.inputs = tuple(TensorDesc(s.name, s.dims, s.dtype) for s in data_slots)
        taking = {n for n, c in self._model.inputs.items() if c.from_output is not None}
        self.handed_inputs = frozenset(k for k, s in enumerate(data_slots) if s.name in taking)
        self.outputs = tuple(TensorDesc(s.name, s.dims, s.dtype) for s in self._out_slots)
        layout = Layout.of(self._model, self.inputs, self.outputs)
        self._in_axes, self._out_axes = layout.inputs, layout.outputs
        if DYNAMIC_INPUT_NAME in names:
            self._mbatch_index = names.index(DYNAMIC_INPUT_NAME)
            self._read_gears(data_slots)
        self._batch = self._compiled_batch(data_slots)
        self.max_batch_size = self._batch
        self._floor = min(self._model.fixed_rows or 1, self._batch)
        if self._batching and self._model.max_batch_size > self._batch:
            log.warning(
                "acl_max_batch_size_above_model",
                model=self._model.name,
                recipe=self._model.max_batch_size,
                model_batch=self._batch,
            )

    def _open_handovers(self) -> None:
        """A pool of device blocks for each output a later model takes (recipe `from:`),
        where its rows allow it (`acl_handover.plan`); else it goes to the host, logged."""
        names = [s.name for s in self._out_slots]
        for output, batches in self._model.handed.items():
            if output not in names:  # `inferchain.registry.check_handovers` names it
                continue
            i = names.index(output)
            slot = self._out_slots[i]
            size, why = plan_handover(slot, self._batch, self._out_axes[i])
            if not self._batching or not size:
                why = why or "the model does not batch"
                log.info("acl_handover_on_host", model=self._model.name, output=output, why=why)
                continue
            source = f"{self._model.name}.{output}"
            pool = HandoverPool(
                self._acl, self._device, source, slot, self._batch, size, batches,
                self._make_current,
            )  # fmt: skip
            self._pools[i] = pool
            pool.allocate(self._model.name)

    def _read_gears(self, data_slots: Sequence[Slot]) -> None:
        mdl = self._acl.mdl
        batch = self._value(mdl.get_dynamic_batch(self._desc), "mdl.get_dynamic_batch")
        self._batch_gears = tuple(sorted(int(b) for b in batch.get("batch", ())))
        if not self._batch_gears:
            hw = self._value(mdl.get_dynamic_hw(self._desc, -1), "mdl.get_dynamic_hw")
            self._hw_gears = tuple(sorted((int(h), int(w)) for h, w in hw.get("hw", ())))
        if not self._batch_gears and not self._hw_gears:
            self._dims_gears = self._read_dims_gears(data_slots)
        if not self._batch_gears and not self._hw_gears and not self._dims_gears:
            raise BackendError(
                f"{self._model.name}: the model has {DYNAMIC_INPUT_NAME} but neither batch, "
                "image-size nor dims gears (AIPP models are not supported)",
                name="ACL_UNSUPPORTED_MODEL",
            )

    def _read_dims_gears(self, data_slots: Sequence[Slot]) -> tuple[DimsGear, ...]:
        """The dims gears, each split into the data inputs' shapes."""
        mdl, what = self._acl.mdl, "mdl.get_input_dynamic_gear_count"
        count = int(self._value(mdl.get_input_dynamic_gear_count(self._desc, -1), what))
        if count <= 0:
            return ()
        what = f"mdl.get_input_dynamic_dims({count})"
        raw = self._value(mdl.get_input_dynamic_dims(self._desc, -1, count), what)
        ranks = [len(s.dims) for s in data_slots]
        gears = []
        for entry in raw:
            dims = [int(d) for d in entry["dims"]][: int(entry.get("dimCount", len(entry["dims"])))]
            gear = split_dims(dims, ranks, self._in_axes)
            if gear is None:
                raise BackendError(
                    f"{self._model.name}: dims gear {dims} does not give the inputs' ranks "
                    f"{ranks} with one batch on their batch axes {list(self._in_axes)}",
                    name="ACL_UNSUPPORTED_MODEL",
                )
            gears.append(gear)
        return tuple(gears)

    def _compiled_batch(self, data_slots: Sequence[Slot]) -> int:
        if self._batch_gears:
            return self._batch_gears[-1]
        if self._dims_gears:
            return max(g.batch for g in self._dims_gears)
        batched = [
            s.dims[a]
            for s, a in zip(data_slots, self._in_axes, strict=True)
            if a is not None and a < len(s.dims)
        ]
        if not batched or batched[0] <= 0:
            dims = next((s.dims for s in data_slots if s.dims), ())
            raise BackendError(
                f"{self._model.name}: cannot tell the batch from input dims {dims}",
                name="ACL_UNSUPPORTED_MODEL",
            )
        return batched[0]

    def padded_rows(self, rows: int) -> int:
        """The rows the model runs for a batch of `rows`: the smallest batch gear (or dims
        gear's batch) that holds them (a deterministic model's: them and its max batch),
        else the compiled batch."""
        if not self._batching:
            return rows
        rows = max(rows, self._floor)
        if self._batch_gears:
            return batch_gear(self._batch_gears, min(rows, self._batch))
        if self._dims_gears:
            return min((g.batch for g in self._dims_gears if g.batch >= rows), default=rows)
        return max(rows, self._batch)

    # -- run ------------------------------------------------------------------------------

    def run(self, inputs: Sequence[np.ndarray], batch_size: int) -> list[np.ndarray]:
        """One batch on stream 0, start to finish: `launch(..., 0)` then `collect(0)`,
        with every output on the host (warm-ups and probes: no hand-over)."""
        self._start(inputs, batch_size, 0, None, hand=False)
        return self.collect(0)

    def open_state(
        self, carried: Sequence[tuple[int, int]], lanes: int, constant: Sequence[int] = ()
    ) -> bool:
        """Keep `lanes` rows of each carried input in device memory (see `acl_state`);
        False, logged, where the model's rows do not allow it. With the state, the
        `constant` inputs whose rows allow it go to device lanes too (`acl_constants`;
        the others, logged, are fed from the host at every step)."""
        with self._lock:
            self._usable_set(0, "open_state")
            if self._state is not None:
                raise BackendError(f"{self._model.name}: the sequence state is already open")
            data = [self._in_slots[i] for i in self._data_index]
            pairs = [(i, o) for o, i in carried]
            found: list[Carried] = []
            why = "the model does not batch"
            if self._batching:
                axes = [(self._in_axes[i] or 0, self._out_axes[o]) for i, o in pairs]
                found, why = plan(data, self._out_slots, pairs, self._batch, axes)
            if not found:
                log.info("acl_state_on_host", model=self._model.name, reason=why)
                return False
            self._call(self._make_current(), "rt.set_context")
            state = DeviceState(found, lanes)
            try:
                state.allocate(self._acl, self._model.name)
            except BaseException:
                state.release(self._acl, ignore)
                raise
            self._state = state
            if constant:
                self._open_constants(constant, lanes)
            return True

    def _open_constants(self, constant: Sequence[int], lanes: int) -> None:
        data = [self._in_slots[i] for i in self._data_index]
        pads: dict[str, float | bool] = {}
        for s in data:  # the recipe's `inputs: {NAME: {pad: ...}}`, else the shapes' pad
            given = self._model.inputs.get(s.name)
            pad = given.pad if given is not None else None
            pads[s.name] = self._model.shapes.pad_value if pad is None else pad
        found, why = plan_constants(
            data, constant, self._in_axes, self._dims_gears, self._batch, pads
        )
        for reason in why:
            log.info("acl_constant_on_host", model=self._model.name, reason=reason)
        if not found:
            return
        constants = DeviceConstants(found, lanes)
        try:
            constants.allocate(self._acl, self._model.name)
        except BaseException:
            constants.release(self._acl, ignore)
            raise
        self._constants = constants

    def launch(
        self,
        inputs: Sequence[np.ndarray],
        batch_size: int,
        stream: int,
        state: StateRows | None = None,
    ) -> None:
        """Stage `batch_size` rows into set `stream`'s host buffers and enqueue, on its
        stream: H2D copies, a wait for the model's previous execution (on another set),
        execute, D2H copies. Returns at once; `collect(stream)` waits.

        With `state`, the carried inputs are gathered from the device lanes (a first
        step's from its host row) after that wait, the carried outputs are scattered
        back to the lanes before the next execution may start, and they are not copied
        to the host.

        An input in `handed_inputs` may be rows of DeviceTensors (an object array): it is
        filled by device-to-device copies from their blocks. An output a later model takes
        (`from:`) is copied into a free block of its pool instead of to the host, and
        `collect` returns it as DeviceTensors."""
        self._start(inputs, batch_size, stream, state, hand=True)

    def _start(
        self,
        inputs: Sequence[np.ndarray],
        batch_size: int,
        stream: int,
        state: StateRows | None,
        hand: bool,
    ) -> None:
        with self._lock:
            buffer_set = self._usable_set(stream, "launch")
            if state is not None:
                self._check_state(state, batch_size)
            if buffer_set.launched is not None:
                raise BackendError(
                    f"{self._model.name}: stream {stream} already has a batch in flight "
                    "(collect it first)"
                )
            if len(inputs) != len(self._data_index):
                raise BackendError(
                    f"{self._model.name}: launch() got {len(inputs)} inputs, the model takes "
                    f"{len(self._data_index)}"
                )
            rows = batch_size if self._batching else _leading_dim(inputs[0])
            if not 1 <= rows <= self._batch:
                raise BackendError(
                    f"{self._model.name}: batch of {rows} rows; the model takes 1..{self._batch}"
                )
            self._call(self._make_current(), "rt.set_context")
            data = [buffer_set.in_slots[i] for i in self._data_index]
            columns = {
                k: inputs[k] for k in self.handed_inputs if np.asarray(inputs[k]).dtype == object
            }
            arrays = [
                _stand_in(columns[k], s) if k in columns else _contiguous(a, s.dtype)
                for k, (a, s) in enumerate(zip(inputs, data, strict=True))
            ]
            run = self._select_gear(buffer_set, arrays, max(rows, self._floor))
            shapes = self._output_shapes(rows, run)
            self.last_stages = None
            if buffer_set.leases or buffer_set.pinned:  # no sync settled them: until close
                self._stranded.append((buffer_set.leases, buffer_set.pinned))
                buffer_set.leases, buffer_set.pinned = {}, []
            if hand:
                for i, pool in self._pools.items():
                    lease = pool.lease()
                    if lease is not None:
                        buffer_set.leases[i] = lease
            try:
                self._enqueue(buffer_set, arrays, rows, run, shapes, state, columns)
            except BaseException:
                self._drain(buffer_set)
                raise

    def collect(self, stream: int) -> list[np.ndarray]:
        """Wait for the batch on `stream`; views of its host staging, valid until the next
        launch on it. Sets `last_stages` (h2d, compute, d2h seconds) from its events."""
        with self._lock:
            buffer_set = self._usable_set(stream, "collect")
            launched = buffer_set.launched
            if launched is None:
                raise BackendError(f"{self._model.name}: nothing launched on stream {stream}")
            buffer_set.launched = None
            self._call(self._make_current(), "rt.set_context")
            if self._reports is not None:
                self._reports.wait(buffer_set.index)
            else:
                ret = self._acl.rt.synchronize_stream(buffer_set.stream)
                self._call(ret, f"rt.synchronize_stream (stream {stream})")
            self.last_stages = self._stages(buffer_set)
            unpin(buffer_set.pinned, self._model.name)  # the reads of the batch are done
            buffer_set.pinned = []
            leases, buffer_set.leases = buffer_set.leases, {}
            self._time_device(buffer_set)
            results = []
            for i, (slot, shape, count) in enumerate(
                zip(buffer_set.out_slots, launched.shapes, launched.counts, strict=True)
            ):
                if i in launched.on_device:
                    continue
                if i in leases:  # kept on the device: one DeviceTensor a row
                    results.append(self._pools[i].tensors(leases[i], launched.rows))
                    continue
                assert slot.host is not None  # made at load
                out = slot.host[:count].view(slot.dtype).reshape(shape)
                axis = self._out_axes[i] if self._batching else 0
                if axis and axis < out.ndim and out.shape[axis] != launched.rows:
                    out = out[(slice(None),) * axis + (slice(0, launched.rows),)]
                results.append(out)
            return results

    def _check_state(self, state: StateRows, rows: int) -> None:
        name = self._model.name
        if self._state is None:
            raise BackendError(f"{name}: launch() got sequence state, but none is open")
        if len(state.read) != rows:
            raise BackendError(
                f"{name}: sequence state for {len(state.read)} rows in a batch of {rows}"
            )
        lanes = self._state.lanes
        for what in (state.read, state.write):
            if len(what) and not (int(what.min()) >= 0 and int(what.max()) < lanes):
                raise BackendError(f"{name}: a sequence lane outside 0..{lanes - 1}")

    def _usable_set(self, stream: int, what: str) -> BufferSet:
        if threading.get_ident() != self._owner:
            raise BackendError(
                f"{self._model.name}: AclSession.{what} called from thread "
                f"{threading.current_thread().name!r}, not the thread that loaded it "
                "(pyACL contexts are per thread)",
                name="ACL_WRONG_THREAD",
            )
        if self._closed:
            raise BackendError(f"{self._model.name}: the session is closed")
        if not 0 <= stream < len(self._sets):
            raise BackendError(
                f"{self._model.name}: stream {stream} is not one of 0..{len(self._sets) - 1}"
            )
        return self._sets[stream]

    def _enqueue(
        self,
        buffer_set: BufferSet,
        arrays: Sequence[np.ndarray],
        rows: int,
        run: int,
        shapes: list[tuple[int, ...]],
        state: StateRows | None = None,
        columns: Mapping[int, np.ndarray] | None = None,
    ) -> None:
        """The order of the official samples, on the set's own stream, nothing allocated.
        With `state`, the device lanes are read and written only between the wait for the
        previous execution and this one's "computed" event, which the next one waits for,
        so executions (and their state copies) on the model's sets never overlap."""
        rt, mdl, stream = self._acl.rt, self._acl.mdl, buffer_set.stream
        events = buffer_set.events
        device_state = self._state if state is not None else None  # open: _check_state
        carried = device_state.inputs if device_state is not None else {}
        constants = self._constants if state is not None else None
        held = constants.inputs if constants is not None else {}
        self._call(rt.record_event(events["start"], stream), "rt.record_event")
        data = [buffer_set.in_slots[i] for i in self._data_index]
        for k, (array, slot) in enumerate(zip(arrays, data, strict=True)):
            axis = self._in_axes[k] if self._batching else 0
            if columns and k in columns:  # rows of DeviceTensors: copied on the device
                gather(
                    self._acl, self._call, columns[k], slot, stream, self._device,
                    self._model.name, buffer_set.pinned,
                )  # fmt: skip
                continue
            if k in carried or k in held:  # gathered below; the host rows count only for a
                assert state is not None  # first step
                if state.fresh.any():
                    self._stage(array, slot, rows, axis, run)
                continue
            count = self._stage(array, slot, rows, axis, run)
            ret = rt.memcpy_async(
                slot.ptr, slot.size, slot.host_ptr, count, ACL_MEMCPY_HOST_TO_DEVICE, stream
            )
            self._call(ret, f"rt.memcpy_async (input {slot.name!r})")
        previous = self._last_executed
        if previous is not None and previous is not buffer_set:  # one execution at a time
            ret = rt.stream_wait_event(stream, previous.events["computed"])
            self._call(ret, "rt.stream_wait_event")
        if device_state is not None:
            assert state is not None
            for k, c in carried.items():
                device_state.gather(rt, self._call, c, data[k], state, stream, run)
        if constants is not None:
            assert state is not None
            for k, const in held.items():
                constants.gather(rt, self._call, const, data[k], state, stream, arrays[k].shape[1])
        self._call(rt.record_event(events["copied"], stream), "rt.record_event")
        ret = mdl.execute_async(
            self._model_id, buffer_set.in_dataset, buffer_set.out_dataset, stream
        )
        self._call(ret, "mdl.execute_async")
        self._last_executed = buffer_set
        on_device: frozenset[int] = frozenset()
        if device_state is not None:
            assert state is not None
            for c in device_state.carried:
                device_state.scatter(
                    rt, self._call, c, buffer_set.out_slots[c.output], state, stream, run
                )
            on_device = device_state.outputs
        self._call(rt.record_event(events["computed"], stream), "rt.record_event")
        counts = []
        for i, (slot, shape) in enumerate(zip(buffer_set.out_slots, shapes, strict=True)):
            count = math.prod(shape) * slot.dtype.itemsize
            if count > slot.size:
                raise BackendError(f"{self._model.name}: output {slot.name!r} {shape} overflows")
            if i in on_device:  # stays in the device lanes
                counts.append(0)
                continue
            lease = buffer_set.leases.get(i)
            if lease is not None:  # a later model takes it: into its block, not the host
                scatter(rt, self._call, lease, slot, count, stream)
                counts.append(0)
                continue
            ret = rt.memcpy_async(
                slot.host_ptr, slot.size, slot.ptr, count, ACL_MEMCPY_DEVICE_TO_HOST, stream
            )
            self._call(ret, f"rt.memcpy_async (output {slot.name!r})")
            counts.append(count)
        self._call(rt.record_event(events["done"], stream), "rt.record_event")
        if self._reports is not None:  # its callback: the batch's outputs are on the host
            self._call(self._reports.launch(buffer_set.index, stream), "rt.launch_callback")
        buffer_set.launched = Launched(rows, shapes, counts, on_device)

    def _stage(self, array: np.ndarray, slot: Slot, rows: int, axis: Axis, run: int) -> int:
        """Copy one input into the set's host staging (pinned, aligned for memcpy_async)
        in the layout the model runs: `rows` rows on dim `axis` of `run` (a batch axis
        other than 0 with fewer rows than the gear: laid out at the gear, the rest left as
        padding; an unbatched input whole). Returns the bytes to copy to the device."""
        if axis is not None and slot.dims and array.shape[axis : axis + 1] != (rows,):
            raise BackendError(
                f"{self._model.name}: input {slot.name!r} has {array.shape[axis : axis + 1]} "
                f"rows on its batch axis {axis}, expected {rows}"
            )
        shape = array.shape
        if axis and rows != run:
            shape = with_rows(array.shape, axis, run)
        nbytes = math.prod(shape) * array.dtype.itemsize
        if nbytes > slot.size:
            raise BackendError(
                f"{self._model.name}: input {slot.name!r} of shape {shape} "
                f"({nbytes} bytes) does not fit the model's {slot.size}-byte buffer"
            )
        assert slot.host is not None  # made at load
        if shape is array.shape:
            slot.host[:nbytes] = array.reshape(-1).view(np.uint8)
        else:
            laid = slot.host[:nbytes].view(array.dtype).reshape(shape)
            laid[(slice(None),) * (axis or 0) + (slice(0, rows),)] = array
        return nbytes

    def _drain(self, buffer_set: BufferSet) -> None:
        """After a failed launch: wait for what was enqueued, so the set can be used again."""
        buffer_set.launched = None
        ret = self._acl.rt.synchronize_stream(buffer_set.stream)
        if ret != ACL_SUCCESS:  # its work may still run: the next launch still waits for it
            log.warning("acl_drain_failed", model=self._model.name, code=ret)
            return
        self._settle(buffer_set)
        if self._last_executed is buffer_set:
            self._last_executed = None

    def _settle(self, buffer_set: BufferSet) -> None:
        """After a sync of the set's stream without a collect: its reads of other models'
        blocks are done, its leased blocks hold nothing anyone has."""
        unpin(buffer_set.pinned, self._model.name)
        for lease in buffer_set.leases.values():
            lease.release()
        buffer_set.leases, buffer_set.pinned = {}, []

    def _stages(self, buffer_set: BufferSet) -> dict[str, float] | None:
        """Device seconds of the collected batch per stage, from its events; None where the
        runtime cannot time events."""
        elapsed = getattr(self._acl.rt, "event_elapsed_time", None)
        if elapsed is None:
            return None
        events, stages = buffer_set.events, {}
        for stage, first, last in STAGES:
            ms, ret = elapsed(events[first], events[last])
            if ret != ACL_SUCCESS:
                return None
            stages[stage] = float(ms) / 1000.0
        return stages

    def _time_device(self, buffer_set: BufferSet) -> None:
        """Note when the collected batch's work ran on the device (its "start" to "done"
        events, on the host's clock); record the clock's epoch again when it is due, on this
        set's stream, idle now. A clock that fails is dropped (the host's times stand in)."""
        clock = self._clock
        if clock is None:
            return
        events = buffer_set.events
        span = clock.span(events["start"], events["done"])
        if span is not None:
            self._spans.append(span)
        if clock.due():
            try:
                clock.anchor(buffer_set.stream)
            except BackendError as e:
                log.warning("acl_device_clock_failed", model=self._model.name, error=str(e))
                clock.release(ignore)
                self._clock = None

    def take_device_spans(self) -> tuple[tuple[float, float], ...]:
        """The device spans (perf_counter seconds: first copy in -> last copy out) of the
        batches collected since the last call, oldest first; () where events cannot be
        timed."""
        with self._lock:
            spans = tuple(self._spans)
            self._spans.clear()
        return spans

    def _output_shapes(self, rows: int, run: int) -> list[tuple[int, ...]]:
        """Each output's shape for a batch of `rows` at the gear just set (running `run`
        rows): `rows` on axis 0, or the gear's whole output where the rows are on another
        axis (`collect` cuts them)."""
        shapes = []
        for i, slot in enumerate(self._out_slots):
            dims = slot.dims
            if self._dims_gears or any(d < 0 for d in dims[1:]):  # dims follow the gear
                what = "mdl.get_cur_output_dims"
                dims = tuple(
                    self._value(self._acl.mdl.get_cur_output_dims(self._desc, i), what)["dims"]
                )
            axis = self._out_axes[i] if self._batching else 0
            if axis and axis < len(dims):
                shapes.append(with_rows(dims, axis, run))
                continue
            batched = bool(dims) and dims[0] in (-1, self._batch, run)
            shapes.append((rows, *dims[1:]) if batched else dims)
        return shapes

    def _make_current(self) -> int:
        """Make the session's context current on this thread if it is not (another session
        may have created its own here; `close()` may run on another thread)."""
        if not self._context or _current_context(self._acl) == self._context:
            return ACL_SUCCESS
        ret: int = self._acl.rt.set_context(self._context)
        if ret == ACL_SUCCESS:
            _note_current(self._acl, self._context)
        return ret

    def _select_gear(self, buffer_set: BufferSet, arrays: Sequence[np.ndarray], rows: int) -> int:
        """Set the smallest batch gear >= rows, the dims gear of the inputs' shapes with
        the fewest rows >= rows, or the (H, W) gear the inputs have, in the set's input
        dataset; the rows the model runs."""
        mdl, index, dataset = self._acl.mdl, self._mbatch_index, buffer_set.in_dataset
        if self._batch_gears:
            gear: object = self._batch_gears[bisect.bisect_left(self._batch_gears, rows)]
            if gear != buffer_set.gear:
                buffer_set.gear = None
                ret = mdl.set_dynamic_batch_size(self._model_id, dataset, index, gear)
                self._call(ret, f"mdl.set_dynamic_batch_size({gear})")
                buffer_set.gear = gear
            assert isinstance(gear, int)
            return gear
        if self._dims_gears:
            return self._select_dims(buffer_set, arrays, rows)
        if self._hw_gears:
            data = [self._in_slots[i] for i in self._data_index]
            hw = {
                (a.shape[2], a.shape[3])
                for a, s in zip(arrays, data, strict=True)
                if len(s.dims) == 4 and s.dims[2] == -1 and s.dims[3] == -1 and a.ndim == 4
            }
            if len(hw) != 1 or next(iter(hw)) not in self._hw_gears:
                raise BackendError(
                    f"{self._model.name}: input height/width {sorted(hw)} is not one of the "
                    f"model's image-size gears {[list(g) for g in self._hw_gears]}",
                    name="ACL_NO_MATCHING_GEAR",
                )
            (h, w) = gear = next(iter(hw))
            buffer_set.gear = None  # the model's current gear is per model: set it every time
            ret = mdl.set_dynamic_hw_size(self._model_id, dataset, index, h, w)
            self._call(ret, f"mdl.set_dynamic_hw_size({h}, {w})")
            buffer_set.gear = gear
        return self._batch if self._batching else rows

    def _select_dims(self, buffer_set: BufferSet, arrays: Sequence[np.ndarray], rows: int) -> int:
        """Set the dims gear the batch takes (`acl_gears.pick_dims`); its rows."""
        shapes = [tuple(int(d) for d in a.shape) for a in arrays]
        axes = self._in_axes if self._batching else (None,) * len(arrays)
        gear = pick_dims(self._dims_gears, shapes, axes, rows if self._batching else 1)
        if gear is None:
            raise BackendError(
                f"{self._model.name}: inputs of shapes {shapes} ({rows} rows) fit none of the "
                f"model's {len(self._dims_gears)} dims gears (e.g. "
                f"{[list(g.shapes) for g in self._dims_gears[:3]]})",
                name="ACL_NO_MATCHING_GEAR",
            )
        buffer_set.gear = None  # the model's current gear is per model: set it every time
        values = gear.values
        dims = {"dimCount": len(values), "dims": values}
        mdl, dataset = self._acl.mdl, buffer_set.in_dataset
        ret = mdl.set_input_dynamic_dims(self._model_id, dataset, self._mbatch_index, dims)
        self._call(ret, f"mdl.set_input_dynamic_dims({values})")
        buffer_set.gear = gear
        return gear.batch

    # -- close ----------------------------------------------------------------------------

    def close(self) -> None:
        """Release everything in pyACL's documented order; idempotent.

        Any thread may call it: off the loading thread it first makes the session's context
        current there. Every step is attempted; the first failure is raised at the end.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            errors = []
            ret = self._make_current()
            if ret != ACL_SUCCESS:
                errors.append(acl_error(self._acl, ret, f"{self._model.name}: rt.set_context"))
            errors += self._release()
        for callback in self._on_close:
            callback(self)
        if errors:
            first = errors[0]
            more = f" (and {len(errors) - 1} more release errors)" if len(errors) > 1 else ""
            raise BackendError(f"{first}{more}", code=first.code, name=first.name)
        log.info("acl_model_closed", model=self._model.name)

    def _release(self) -> list[BackendError]:
        """Undo whatever `_load` made, in order: every stream synchronized, model, desc, the
        device clock's event, each set's buffers, datasets, host staging and events, the
        streams, context, device. Each handle is forgotten once its release was attempted."""
        acl, rt, mdl = self._acl, self._acl.rt, self._acl.mdl
        errors: list[BackendError] = []

        def attempt(ret: int, what: str) -> None:
            if ret != ACL_SUCCESS:
                errors.append(acl_error(acl, ret, f"{self._model.name}: {what}"))

        for buffer_set in self._sets:
            if buffer_set.stream:
                attempt(rt.synchronize_stream(buffer_set.stream), "rt.synchronize_stream")
        for buffer_set in self._sets:  # every stream is done with other models' blocks
            self._settle(buffer_set)
        for _, pinned in self._stranded:
            unpin(pinned, self._model.name)
        self._stranded = []
        if self._reports is not None:  # its streams unsubscribed before they go
            self._reports.stop(attempt)
            self._reports = None
        if self._model_id is not None:
            attempt(mdl.unload(self._model_id), "mdl.unload")
            self._model_id = None
        if self._desc:
            attempt(mdl.destroy_desc(self._desc), "mdl.destroy_desc")
            self._desc = 0
        if self._clock is not None:
            self._clock.release(attempt)
            self._clock = None
        for buffer_set in self._sets:
            buffer_set.release(acl, attempt)
        if self._state is not None:
            self._state.release(acl, attempt)
            self._state = None
        if self._constants is not None:
            self._constants.release(acl, attempt)
            self._constants = None
        for pool in self._pools.values():  # the blocks no consumer is reading
            pool.close(attempt)
        self._pools = {}
        for buffer_set in self._sets:
            if buffer_set.stream:
                attempt(rt.destroy_stream(buffer_set.stream), "rt.destroy_stream")
                buffer_set.stream = 0
        self._sets = []
        self._last_executed = None
        if self._context:
            attempt(rt.destroy_context(self._context), "rt.destroy_context")
            if _current_context(acl) == self._context:
                _note_current(acl, 0)
            self._context = 0
        if self._device_set:
            attempt(rt.reset_device(self._device), f"rt.reset_device({self._device})")
            self._device_set = False
        return errors


def _contiguous(array: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """`array` as C-contiguous `dtype` (a 0-d array stays 0-d, unlike with
    `np.ascontiguousarray`)."""
    array = np.asarray(array, dtype=dtype)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def _stand_in(column: np.ndarray, slot: Slot) -> np.ndarray:
    """For the gear of a batch: an array of the shape and dtype that a column of
    DeviceTensors stands for (zero strides, no memory)."""
    first = column[0] if len(column) else None
    item = first.shape if isinstance(first, DeviceTensor) else tuple(slot.dims[1:])
    return np.broadcast_to(np.zeros((), slot.dtype), (len(column), *item))


def _leading_dim(array: np.ndarray) -> int:
    return int(array.shape[0]) if array.ndim else 1


class AclBackend(Backend):
    """pyACL for the whole process: `acl.init` on construction, `acl.finalize` on the last
    `close()` of any AclBackend sharing the same `acl` module."""

    name = "acl"

    def __init__(self, recipe: Recipe, acl_module: object | None = None) -> None:
        self._recipe = recipe
        self._acl: Any = acl_module if acl_module is not None else import_acl()
        try:
            _acquire_runtime(self._acl)
        except BackendError as e:
            raise LoadError.from_backend(e) from e
        self._lock = threading.Lock()
        self._closed = False
        self._sessions: set[AclSession] = set()  # open ones, so close() can release leftovers

    @property
    def acl(self) -> Any:
        """The pyACL module (or fake) this backend drives."""
        return self._acl

    def load(self, model: ModelConfig, device: int) -> AclSession:
        """Load one instance of `model` on `device`; call it on the worker's own thread."""
        with self._lock:
            if self._closed:
                raise LoadError(f"{model.name}: the acl backend is closed")
        try:
            session = AclSession.open(self._acl, model, device)
        except BackendError as e:
            raise LoadError.from_backend(e) from e
        session._on_close.append(self._forget)
        with self._lock:
            self._sessions.add(session)
        wrong = declared_precision(model, (*session.inputs, *session.outputs))
        if wrong is not None:
            session.close()
            raise ConfigError(f"{self._recipe.source}: {wrong}")
        return session

    def _forget(self, session: AclSession) -> None:
        with self._lock:
            self._sessions.discard(session)

    def close(self) -> None:
        """Release this backend's hold on the runtime (the last one calls `acl.finalize`).

        Sessions still open are closed first, with a warning: close them on their own threads
        before this for a clean tear-down.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            leftovers = list(self._sessions)
        for session in leftovers:
            log.warning("acl_session_left_open", model=session.model_name)
            try:
                session.close()
            except BackendError as e:
                log.warning("acl_session_close_failed", model=session.model_name, error=str(e))
        _release_runtime(self._acl)
