"""Ascend pyACL backend: `.om` models on an NPU through an injected (or imported) `acl` module.

The constants and the error table are in `acl_api`. Every non-zero return code becomes
a `BackendError` carrying the code, its name and `acl.get_recent_err_msg()`. A session is
loaded, run and closed on its worker's thread (pyACL contexts are per thread); all device and
host buffers are allocated once at load, so `run` never allocates.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
import structlog

from inferchain.backends.acl_api import (
    ACL_DTYPES,
    ACL_ERROR_REPEAT_INITIALIZE,
    ACL_MEM_MALLOC_HUGE_FIRST,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    ACL_SUCCESS,
    DYNAMIC_INPUT_NAME,
    acl_error,
    check,
    import_acl,
    null_error,
)
from inferchain.backends.base import Backend, Session
from inferchain.config import ModelConfig, Recipe
from inferchain.errors import BackendError
from inferchain.tensors import TensorDesc

log = structlog.get_logger(__name__)


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


@attrs.define
class _Slot:
    """One device buffer of a dataset and what it carries."""

    size: int  # bytes, from get_*_size_by_index
    dtype: np.dtype[Any]
    dims: tuple[int, ...]  # as the desc reports them; -1 = follows the gear
    name: str
    ptr: int = 0  # device memory; 0 = not allocated
    buffer: int = 0  # aclDataBuffer; 0 = not created
    host: np.ndarray | None = None  # outputs: the reused host copy (uint8, `size` bytes)


def _io_name(name: str) -> str:
    """Tensor name without ATC's "op:edge:" prefix (ONNX outputs read "op:0:name")."""
    parts = name.split(":")
    return parts[-1] if len(parts) >= 3 and parts[-1] else name


class AclSession(Session):
    """One loaded `.om` model: its context, stream, datasets and buffers, all made at load.

    Use it from the thread that loaded it. `close()` may run on another thread: it makes the
    context current there first, as pyACL allows.
    """

    reuses_outputs = True  # run() returns views of host buffers reused by the next run

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
        self._stream = 0
        self._model_id: int | None = None
        self._desc = 0
        self._in_dataset = 0
        self._out_dataset = 0
        self._in_slots: list[_Slot] = []
        self._out_slots: list[_Slot] = []
        # what run() needs
        self._data_slots: list[_Slot] = []  # inputs without ascend_mbatch_shape_data
        self._mbatch_index: int | None = None
        self._batch_gears: tuple[int, ...] = ()
        self._hw_gears: tuple[tuple[int, int], ...] = ()
        self._gear: object = None  # the gear last set on the device
        self._batch = 1  # rows the model runs: compiled batch or largest gear
        self._batching = model.max_batch_size > 0
        self.inputs = ()
        self.outputs = ()

    @property
    def model_name(self) -> str:
        return self._model.name

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
        )
        return session

    def _call(self, ret: int, what: str) -> None:
        check(self._acl, ret, f"{self._model.name}: {what}")

    def _value(self, result: tuple[Any, int], what: str) -> Any:
        value, ret = result
        self._call(ret, what)
        return value

    def _load(self) -> None:
        acl, rt, mdl = self._acl, self._acl.rt, self._acl.mdl
        self._call(rt.set_device(self._device), f"rt.set_device({self._device})")
        self._device_set = True
        self._context = self._value(rt.create_context(self._device), "rt.create_context")
        _note_current(acl, self._context)
        self._stream = self._value(rt.create_stream(), "rt.create_stream")
        path = self._model.path
        self._model_id = self._value(mdl.load_from_file(path), f"mdl.load_from_file({path})")
        self._desc = mdl.create_desc()
        if not self._desc:
            raise null_error(acl, f"{self._model.name}: mdl.create_desc")
        self._call(mdl.get_desc(self._desc, self._model_id), "mdl.get_desc")
        self._describe()
        self._in_dataset = self._new_dataset()
        self._fill(self._in_dataset, self._in_slots, "input")
        self._out_dataset = self._new_dataset()
        self._fill(self._out_dataset, self._out_slots, "output")
        for slot in self._out_slots:
            slot.host = np.empty(slot.size, np.uint8)

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
                slots.append(_Slot(size, dtype, tuple(dims["dims"]), name))
        if not self._in_slots or not self._out_slots:
            raise BackendError(f"{self._model.name}: the model desc lists no inputs or outputs")
        names = [s.name for s in self._in_slots]
        if DYNAMIC_INPUT_NAME in names:
            self._mbatch_index = names.index(DYNAMIC_INPUT_NAME)
            self._read_gears()
        self._data_slots = [s for s in self._in_slots if s.name != DYNAMIC_INPUT_NAME]
        self._batch = self._compiled_batch()
        self.max_batch_size = self._batch
        self.inputs = tuple(TensorDesc(s.name, s.dims, s.dtype) for s in self._data_slots)
        self.outputs = tuple(TensorDesc(s.name, s.dims, s.dtype) for s in self._out_slots)
        if self._batching and self._model.max_batch_size > self._batch:
            log.warning(
                "acl_max_batch_size_above_model",
                model=self._model.name,
                recipe=self._model.max_batch_size,
                model_batch=self._batch,
            )

    def _read_gears(self) -> None:
        mdl = self._acl.mdl
        batch = self._value(mdl.get_dynamic_batch(self._desc), "mdl.get_dynamic_batch")
        self._batch_gears = tuple(sorted(int(b) for b in batch.get("batch", ())))
        if not self._batch_gears:
            hw = self._value(mdl.get_dynamic_hw(self._desc, -1), "mdl.get_dynamic_hw")
            self._hw_gears = tuple(sorted((int(h), int(w)) for h, w in hw.get("hw", ())))
        if not self._batch_gears and not self._hw_gears:
            raise BackendError(
                f"{self._model.name}: the model has {DYNAMIC_INPUT_NAME} but neither batch nor "
                "image-size gears (dynamic dims / AIPP models are not supported)",
                name="ACL_UNSUPPORTED_MODEL",
            )

    def _compiled_batch(self) -> int:
        if self._batch_gears:
            return self._batch_gears[-1]
        dims = next((s.dims for s in self._data_slots if s.dims), ())
        if not dims or dims[0] <= 0:
            raise BackendError(
                f"{self._model.name}: cannot tell the batch from input dims {dims}",
                name="ACL_UNSUPPORTED_MODEL",
            )
        return dims[0]

    def _new_dataset(self) -> int:
        dataset = int(self._acl.mdl.create_dataset())
        if not dataset:
            raise null_error(self._acl, f"{self._model.name}: mdl.create_dataset")
        return dataset

    def _fill(self, dataset: int, slots: list[_Slot], kind: str) -> None:
        """Allocate each slot's device memory (HUGE_FIRST) and add it to `dataset`."""
        acl, rt, mdl = self._acl, self._acl.rt, self._acl.mdl
        for i, slot in enumerate(slots):
            if slot.size <= 0:
                raise BackendError(f"{self._model.name}: {kind} {slot.name!r} has size 0")
            what = f"rt.malloc({slot.size}) for {kind} {slot.name!r}"
            slot.ptr = self._value(rt.malloc(slot.size, ACL_MEM_MALLOC_HUGE_FIRST), what)
            slot.buffer = acl.create_data_buffer(slot.ptr, slot.size)
            if not slot.buffer:
                raise null_error(acl, f"{self._model.name}: create_data_buffer ({kind} {i})")
            self._value(mdl.add_dataset_buffer(dataset, slot.buffer), "mdl.add_dataset_buffer")

    # -- run ------------------------------------------------------------------------------

    def run(self, inputs: Sequence[np.ndarray], batch_size: int) -> list[np.ndarray]:
        """Copy in `batch_size` rows, execute, copy out; returns views of reused buffers.

        Sets `last_stages` to the seconds of the H2D copies, execute_async + synchronize, and
        the D2H copies of this run.
        """
        if threading.get_ident() != self._owner:
            raise BackendError(
                f"{self._model.name}: AclSession.run called from thread "
                f"{threading.current_thread().name!r}, not the thread that loaded it "
                "(pyACL contexts are per thread)",
                name="ACL_WRONG_THREAD",
            )
        with self._lock:
            if self._closed:
                raise BackendError(f"{self._model.name}: the session is closed")
            if len(inputs) != len(self._data_slots):
                raise BackendError(
                    f"{self._model.name}: run() got {len(inputs)} inputs, the model takes "
                    f"{len(self._data_slots)}"
                )
            rows = batch_size if self._batching else _leading_dim(inputs[0])
            if not 1 <= rows <= self._batch:
                raise BackendError(
                    f"{self._model.name}: batch of {rows} rows; the model takes 1..{self._batch}"
                )
            acl = self._acl
            self._call(self._make_current(), "rt.set_context")
            arrays = [
                np.ascontiguousarray(a, dtype=s.dtype)
                for a, s in zip(inputs, self._data_slots, strict=True)
            ]
            self._select_gear(arrays, rows)
            self.last_stages = None
            started = time.perf_counter()
            self._copy_in(arrays, rows)
            copied = time.perf_counter()
            self._call(
                acl.mdl.execute_async(
                    self._model_id, self._in_dataset, self._out_dataset, self._stream
                ),
                "mdl.execute_async",
            )
            self._call(acl.rt.synchronize_stream(self._stream), "rt.synchronize_stream")
            computed = time.perf_counter()
            outputs = self._copy_out(rows)
            self.last_stages = {
                "h2d": copied - started,
                "compute": computed - copied,
                "d2h": time.perf_counter() - computed,
            }
            return outputs

    def _make_current(self) -> int:
        """Make the session's context current on this thread if it is not (another session
        may have created its own here; `close()` may run on another thread)."""
        if not self._context or _current_context(self._acl) == self._context:
            return ACL_SUCCESS
        ret: int = self._acl.rt.set_context(self._context)
        if ret == ACL_SUCCESS:
            _note_current(self._acl, self._context)
        return ret

    def _select_gear(self, arrays: Sequence[np.ndarray], rows: int) -> None:
        """Set the smallest batch gear >= rows, or the (H, W) gear the inputs have."""
        mdl, index = self._acl.mdl, self._mbatch_index
        if self._batch_gears:
            gear: object = self._batch_gears[bisect.bisect_left(self._batch_gears, rows)]
            if gear != self._gear:
                self._gear = None
                ret = mdl.set_dynamic_batch_size(self._model_id, self._in_dataset, index, gear)
                self._call(ret, f"mdl.set_dynamic_batch_size({gear})")
                self._gear = gear
        elif self._hw_gears:
            hw = {
                (a.shape[2], a.shape[3])
                for a, s in zip(arrays, self._data_slots, strict=True)
                if len(s.dims) == 4 and s.dims[2] == -1 and s.dims[3] == -1 and a.ndim == 4
            }
            if len(hw) != 1 or next(iter(hw)) not in self._hw_gears:
                raise BackendError(
                    f"{self._model.name}: input height/width {sorted(hw)} is not one of the "
                    f"model's image-size gears {[list(g) for g in self._hw_gears]}",
                    name="ACL_NO_MATCHING_GEAR",
                )
            (h, w) = gear = next(iter(hw))
            if gear != self._gear:
                self._gear = None
                ret = mdl.set_dynamic_hw_size(self._model_id, self._in_dataset, index, h, w)
                self._call(ret, f"mdl.set_dynamic_hw_size({h}, {w})")
                self._gear = gear

    def _copy_in(self, arrays: Sequence[np.ndarray], rows: int) -> None:
        rt = self._acl.rt
        for array, slot in zip(arrays, self._data_slots, strict=True):
            if slot.dims and array.shape[:1] != (rows,):
                raise BackendError(
                    f"{self._model.name}: input {slot.name!r} has {array.shape[:1]} rows, "
                    f"expected {rows}"
                )
            if array.nbytes > slot.size:
                raise BackendError(
                    f"{self._model.name}: input {slot.name!r} of shape {array.shape} "
                    f"({array.nbytes} bytes) does not fit the model's {slot.size}-byte buffer"
                )
            ret = rt.memcpy(
                slot.ptr, slot.size, array.ctypes.data, array.nbytes, ACL_MEMCPY_HOST_TO_DEVICE
            )
            self._call(ret, f"rt.memcpy (input {slot.name!r})")

    def _copy_out(self, rows: int) -> list[np.ndarray]:
        acl = self._acl
        results = []
        for i, slot in enumerate(self._out_slots):
            assert slot.host is not None  # made at load
            dims = slot.dims
            if any(d < 0 for d in dims[1:]):  # dynamic HW: dims follow the gear
                cur = self._value(acl.mdl.get_cur_output_dims(self._desc, i), "get_cur_output_dims")
                dims = tuple(cur["dims"])
            batched = bool(dims) and dims[0] in (-1, self._batch)
            shape = (rows, *dims[1:]) if batched else dims
            count = math.prod(shape) * slot.dtype.itemsize
            if count > slot.size:
                raise BackendError(f"{self._model.name}: output {slot.name!r} {shape} overflows")
            ret = acl.rt.memcpy(
                slot.host.ctypes.data, slot.size, slot.ptr, count, ACL_MEMCPY_DEVICE_TO_HOST
            )
            self._call(ret, f"rt.memcpy (output {slot.name!r})")
            results.append(slot.host[:count].view(slot.dtype).reshape(shape))
        return results

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
        """Undo whatever `_load` made, in order: stream sync, model, desc, buffers, datasets,
        stream, context, device. Each handle is forgotten once its release was attempted."""
        acl, rt, mdl = self._acl, self._acl.rt, self._acl.mdl
        errors: list[BackendError] = []

        def attempt(ret: int, what: str) -> None:
            if ret != ACL_SUCCESS:
                errors.append(acl_error(acl, ret, f"{self._model.name}: {what}"))

        if self._stream:
            attempt(rt.synchronize_stream(self._stream), "rt.synchronize_stream")
        if self._model_id is not None:
            attempt(mdl.unload(self._model_id), "mdl.unload")
            self._model_id = None
        if self._desc:
            attempt(mdl.destroy_desc(self._desc), "mdl.destroy_desc")
            self._desc = 0
        self._release_dataset(self._in_slots, self._in_dataset, attempt)
        self._in_dataset = 0
        self._release_dataset(self._out_slots, self._out_dataset, attempt)
        self._out_dataset = 0
        if self._stream:
            attempt(rt.destroy_stream(self._stream), "rt.destroy_stream")
            self._stream = 0
        if self._context:
            attempt(rt.destroy_context(self._context), "rt.destroy_context")
            if _current_context(acl) == self._context:
                _note_current(acl, 0)
            self._context = 0
        if self._device_set:
            attempt(rt.reset_device(self._device), f"rt.reset_device({self._device})")
            self._device_set = False
        return errors

    def _release_dataset(
        self, slots: list[_Slot], dataset: int, attempt: Callable[[int, str], None]
    ) -> None:
        """Free each buffer's memory and descriptor, then the dataset itself."""
        acl = self._acl
        for slot in slots:
            if slot.buffer:
                ptr = acl.get_data_buffer_addr(slot.buffer) or slot.ptr
                attempt(acl.rt.free(ptr), "rt.free")
                attempt(acl.destroy_data_buffer(slot.buffer), "destroy_data_buffer")
            elif slot.ptr:  # allocated, but create_data_buffer failed
                attempt(acl.rt.free(slot.ptr), "rt.free")
            slot.ptr = slot.buffer = 0
            slot.host = None
        if dataset:
            attempt(acl.mdl.destroy_dataset(dataset), "mdl.destroy_dataset")


def _leading_dim(array: np.ndarray) -> int:
    return int(array.shape[0]) if array.ndim else 1


class AclBackend(Backend):
    """pyACL for the whole process: `acl.init` on construction, `acl.finalize` on the last
    `close()` of any AclBackend sharing the same `acl` module."""

    name = "acl"

    def __init__(self, recipe: Recipe, acl_module: object | None = None) -> None:
        self._recipe = recipe
        self._acl: Any = acl_module if acl_module is not None else import_acl()
        _acquire_runtime(self._acl)
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
                raise BackendError(f"{model.name}: the acl backend is closed")
        session = AclSession.open(self._acl, model, device)
        session._on_close.append(self._forget)
        with self._lock:
            self._sessions.add(session)
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
