"""A strict CPU stand-in for pyACL (`import acl`), so the acl backend is tested without an NPU.

`FakeAcl()` is a module-like object with pyACL's attribute tree (`acl.rt`, `acl.mdl`,
`acl.util`, top-level `init`, `finalize`, data-buffer calls, `get_recent_err_msg`) and
pyACL's exact return shapes: bare `ret`, `(value, ret)`, `(dict, ret)`, `(dataset, ret)` from
`add_dataset_buffer`, NULL (0) from calls without a code. Errors are return codes, never
exceptions; wrong argument types raise TypeError, as pyACL's argument parsing does.
`get_recent_err_msg()` gives the calling thread's last error message.

Models. Wherever pyACL takes an `.om` path, the fake takes an ONNX file (or a fake `.om`
written by `write_fake_om`, which names an ONNX file and its gears) and runs it with ONNX
Runtime on the CPU (1 thread) on the stream's own thread. How it is "compiled" (as ATC would):

- static: the ONNX batch dim if fixed, else `static_batch` (an int for every model, or a
  mapping path -> batch; default 1). Dims report that batch.
- dynamic batch: `FakeAcl(dynamic_batch={path: [1, 2, 4, 8]})`. Dims report -1 for the batch
  and an extra last input `ascend_mbatch_shape_data` (int64, dims [1]) appears; buffers are
  sized for the largest gear; `mdl.set_dynamic_batch_size` selects the gear.
- dims gears: `FakeAcl(dynamic_dims={path: [(v, ...), ...]})`, one value per dynamic dim of
  every input, in input order (ATC's `--dynamic_dims`); `mdl.get_input_dynamic_gear_count`,
  `mdl.get_input_dynamic_dims` (each gear as every input's shape, concatenated) and
  `mdl.set_input_dynamic_dims` select them.
- from a recipe: `FakeAcl.for_recipe(recipe)` (`fake_acl._recipe`): batch gears from
  `max_batch_size`, dims gears from `shapes: buckets` or for rows off axis 0; `shapes=`,
  `batches=` and `probe=` give what the recipe does not.
Output dims are found by running each gear once at load on zeros (or the `probe` values of
`CompileOptions`, for a model that branches on an input); a failing run is 100003.
- dynamic image size: `FakeAcl(dynamic_hw={path: [(h, w), ...]})` for NCHW inputs whose H/W
  are dynamic in the ONNX file; batch as for static models; dims report -1 for H and W;
  `ascend_mbatch_shape_data` has dims [2]; `mdl.set_dynamic_hw_size` selects the gear and
  `mdl.get_cur_output_dims` reports the gear's output dims.
Output names read
"<name>_node:0:<name>", ATC's "op:edge:name" form for ONNX outputs. A path key matches the
path given to `load_from_file` after `os.path.realpath`.

Devices and threads: `rt.set_device(d)` makes the device's implicit default context current
on the calling thread if it has none; `rt.create_context(d)` (device set first, else 107001)
makes the new context current; other threads must `rt.set_context`. Device memory is a
simulated address space (pointers >= 2**48, never reused, 512-byte aligned), filled with
0xFF (NaN as float) when allocated, as real memory is uninitialised; `rt.malloc_host`
memory is real, 64-byte aligned host memory.

Device time: an async copy takes `count / copy_bandwidth` seconds (default 16 GB/s, a PCIe
4.0 x16 link; None = instant) on its stream's thread, one copy at a time per direction and
device (the copy engines); compute is the ONNX Runtime run on the stream's thread, stretched
by `compute_scale`. Events and waits follow stream order. `slices` lists every copy and
compute as (stream, kind, start, end) for traces. Every execution passes the gates
`executes` (`inferchain.testing.gates`) first: a test holds one shut to keep the device
busy for as long as it needs, and opens it.

Arguments are parsed as pyACL's C wrappers do (`fake_acl._args`): positional only, pointers
and sizes must be Python ints (numpy ints are a TypeError), `init()`'s path is a str or
absent (None is a TypeError).

Rules the card enforces too (code returned), each from the CANN sources (file and function
in the module that models it):
- only the calls that reach GE's model executor need `init` (load, get_desc, execute, unload:
  145001, `_calls.NEEDS_INIT`); `rt.get_run_mode` and the other rt calls answer before it;
  `init` twice: 100002; `finalize` twice: 100037; `finalize` before any `init`: 0.
- a thread without a current context (never set_device / create_context / set_context):
  107002 on calls that need one (malloc, memcpy, streams, events, load, execute, unload ...);
  `rt.free` and `rt.synchronize_stream` need none (the runtime switches to the stream's
  context). `set_context(0)`: 100000.
- a stream used (memcpy_async, execute_async, record/wait event, destroy) from a thread whose
  current context is not the stream's: 107003.
- a model used (execute, unload, set_dynamic_*) outside the context it was loaded in: 107004.
- a model executing on two streams at once: 107000, decided by order, not timing: an
  execution on another stream must be ordered before (an event recorded after it that this
  stream waited for, or a host synchronisation).
- `memcpy` with a NULL pointer or an unknown kind: 100000; `count > dst_max`, a pointer on
  the wrong side for the kind, or a device range outside a live allocation: 107000. Kind 4
  (ACL_MEMCPY_DEFAULT) infers the sides from the pointers. `memcpy_async` with a source or
  destination that is not 64-byte aligned: 107008 (ACL_ERROR_RT_ADDR_UNALIGNED).
- `malloc` of size 0: 100000; beyond `device_memory`: 207001; an unknown policy falls back
  to the default.
- unknown / already destroyed handles: 107000 for rt objects (context, stream, event, device
  or host memory), 200005 for desc, dataset and data buffer, 100011 for a model_id.
- `destroy_context` also destroys the context's streams, as the runtime does.
- execute: after `set_dynamic_*` / `set_input_dynamic_dims` put a gear in the input dataset,
  buffers sized for that gear are accepted (GE checks no size on a dynamic run); otherwise
  the wrong number of buffers or one smaller than the model's size: 145000 (`fake_acl._mdl`).
  A gear never set in `ascend_mbatch_shape_data`: 145013 (batch) / 145021 (HW, dims),
  reported by `synchronize_stream`; `set_dynamic_*` with a value that is not a gear: 145013 /
  145021, on a model without such gears: 100019; loading a file that is no model: 100003.
- callbacks (`fake_acl._report`): `util.start_thread` / `stop_thread`,
  `rt.subscribe_report` / `unsubscribe_report`, `rt.launch_callback` (107015 on a stream no
  thread subscribed), `rt.process_report(timeout_ms)` (507012 on timeout, 107012 from a
  thread subscribed to nothing). A callback runs on its report thread once the work before it
  on its stream is done (a stream order point); a blocking one holds the stream.
- `acl.app_log(level, message)` returns None; the lines are kept in `app_logs`.

Rules stricter than the card (107000 here; the card would race, read stale bytes or leak
silently), so code that is wrong on hardware fails here on every run. All are decided by the
order of calls (a happens-before ledger, `fake_acl._order`), never by timing:
- a host read (`memcpy`) of device memory that stream work not yet synchronized by the host
  writes; a host write (`memcpy`, `memset`, `set_dynamic_*`) or `free` of device memory that
  such work reads or writes;
- stream work on memory that another stream's unsynchronized work writes (or, for a write,
  reads), unless this stream waited for an event recorded after it;
- an async copy into host memory lands only when the host synchronizes past it (the stream,
  or an event recorded after it); until then the destination reads 0xFF (poison);
- the teardown ledger: destroying a stream, event or model with work the host has not
  synchronized; destroying a context that still has events or models; the last
  `reset_device` of a device that still has contexts, streams, models or memory.
- a callback that allocates, frees, synchronizes or launches; `unsubscribe_report` with
  callbacks not yet run; destroying a subscribed stream; a buffer smaller than the running
  gear needs (the card reads or writes past it); a static buffer short of the model's size
  by 64 bytes or less (GE lets it pass).
Not modelled: the default stream (0 is refused with 107000), AIPP, op execution.

For tests: `live_handles()`, `call_count(name)`, `app_logs`, `callback_errors`, `copies()`
(count and bytes per direction), `calls`, `errors`, `executions`, `slices`,
`inject(call, code, nth=None, p=None)` and `clear_injections()`.
"""

from __future__ import annotations

import ctypes
import json
import os
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from inferchain.testing.fake_acl._calls import (
    INVALID_PARAM,
    INVALID_RESOURCE_HANDLE,
    REPEAT_FINALIZE,
    REPEAT_INITIALIZE,
    Fail,
    api,
    as_int,
    lookup,
    null,
)
from inferchain.testing.fake_acl._core import DataBuffer, Injection, Namespace, Slice, State
from inferchain.testing.fake_acl._mdl import FakeMdl
from inferchain.testing.fake_acl._memory import DeviceMemory, HostMemory, is_device_pointer
from inferchain.testing.fake_acl._model import (
    OM_MAGIC,
    CompiledModel,
    CompileOptions,
    compile_model,
)
from inferchain.testing.fake_acl._objects import Execution, Stream
from inferchain.testing.fake_acl._report import ThreadUtil
from inferchain.testing.fake_acl._rt import FakeRt
from inferchain.testing.gates import Gates

if TYPE_CHECKING:
    from inferchain.config import Recipe

__all__ = ["Execution", "FakeAcl", "FakeAclCrash", "Slice", "write_fake_om"]

PCIE_BANDWIDTH = 16e9  # bytes/s: the default copy speed, a PCIe 4.0 x16 link

PathKey = str | os.PathLike[str]


class FakeAclCrash(RuntimeError):
    """What would crash the process on real hardware (e.g. reading a device pointer on the host)."""


def write_fake_om(
    path: PathKey,
    onnx: PathKey,
    *,
    batch: int | None = None,
    dynamic_batch: Sequence[int] = (),
    dynamic_hw: Sequence[tuple[int, int]] = (),
    dynamic_dims: Sequence[Sequence[int]] = (),
) -> Path:
    """Write a fake `.om` file: a small header naming `onnx` (relative to `path`'s folder or
    absolute) and how it is compiled. Only FakeAcl can load it."""
    spec = {
        "onnx": os.fspath(onnx),
        "batch": batch,
        "dynamic_batch": list(dynamic_batch),
        "dynamic_hw": [list(hw) for hw in dynamic_hw],
        "dynamic_dims": [list(g) for g in dynamic_dims],
    }
    out = Path(path)
    out.write_bytes(OM_MAGIC + json.dumps(spec).encode())
    return out


def _stop_streams(streams: dict[int, Stream]) -> None:
    for stream in list(streams.values()):
        stream.stop()


def _key(path: PathKey) -> str:
    return os.path.realpath(os.fspath(path))


class FakeUtil(ThreadUtil):
    """`acl.util`: host pointers to and from Python objects; report threads (`_report`)."""

    @api("util.bytes_to_ptr", "O")
    def bytes_to_ptr(self, data: bytes) -> int:
        if not isinstance(data, bytes):
            raise TypeError(f"bytes_to_ptr needs bytes, got {type(data).__name__}")
        address = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
        return address or 0

    @api("util.ptr_to_bytes", "kk")
    def ptr_to_bytes(self, ptr: int, size: int) -> bytes:
        address, n = as_int(ptr, "ptr"), as_int(size, "size")
        if address == 0 or is_device_pointer(address):
            raise FakeAclCrash(
                f"ptr_to_bytes({address:#x}): not host memory (a segfault on hardware)"
            )
        return ctypes.string_at(address, n)

    @api("util.numpy_to_ptr", "O")
    def numpy_to_ptr(self, array: np.ndarray) -> int:
        return int(array.ctypes.data)


class FakeAcl(Namespace):
    """A fake `acl` module; one instance is one process's view of the runtime.

    Options: `dynamic_batch` / `dynamic_hw` map model paths to gears; `static_batch` is the
    batch of static models whose ONNX batch dim is dynamic (int, or mapping path -> int);
    `device_count` devices of `device_memory` bytes each; `seed` drives `inject(p=...)`;
    `copy_bandwidth` (bytes/s, None = instant) and `compute_scale` (>= 1) set the device
    time model.
    """

    def __init__(
        self,
        *,
        dynamic_batch: Mapping[PathKey, Sequence[int]] | None = None,
        dynamic_hw: Mapping[PathKey, Sequence[tuple[int, int]]] | None = None,
        dynamic_dims: Mapping[PathKey, Sequence[Sequence[int]]] | None = None,
        static_batch: int | Mapping[PathKey, int] = 1,
        device_count: int = 1,
        device_memory: int = 4 << 30,
        seed: int = 0,
        copy_bandwidth: float | None = PCIE_BANDWIDTH,
        compute_scale: float = 1.0,
    ) -> None:
        if copy_bandwidth is not None and copy_bandwidth <= 0:
            raise ValueError(f"copy_bandwidth must be > 0 bytes/s, got {copy_bandwidth}")
        if compute_scale < 1.0:
            raise ValueError(f"compute_scale must be >= 1, got {compute_scale}")
        state = State(seed=seed, device_count=device_count)
        state.copy_bandwidth = copy_bandwidth
        state.compute_scale = compute_scale
        state.memory = DeviceMemory(device_count, device_memory)
        state.host = HostMemory()
        super().__init__(state)
        self._options: dict[str, CompileOptions] = {}
        for path, gears in (dynamic_batch or {}).items():
            self._options[_key(path)] = CompileOptions(dynamic_batch=tuple(gears))
        for path, hws in (dynamic_hw or {}).items():
            self._options[_key(path)] = CompileOptions(dynamic_hw=tuple(hws))
        for path, dims in (dynamic_dims or {}).items():
            self._options[_key(path)] = CompileOptions(dynamic_dims=tuple(map(tuple, dims)))
        if isinstance(static_batch, int):
            self._default_batch, self._batches = static_batch, {}
        else:
            self._default_batch = 1
            self._batches = {_key(p): b for p, b in static_batch.items()}
        self._compiled: dict[str, CompiledModel] = {}  # one ONNX session per model file
        self.rt = FakeRt(state)
        self.mdl = FakeMdl(state, self._compile)
        self.util = FakeUtil(state)
        weakref.finalize(self, _stop_streams, state.streams)  # leaked streams' threads

    @classmethod
    def for_recipe(
        cls,
        recipe: Recipe,
        *,
        shapes: Mapping[str, Sequence[Any]] | None = None,
        batches: Mapping[str, Sequence[int]] | None = None,
        probe: Mapping[str, Mapping[str, float]] | None = None,
        **options: Any,
    ) -> FakeAcl:
        """A fake whose models are "compiled" from `recipe` as ATC would compile them for it
        (`fake_acl._recipe`): batch gears 1, 2, 4, ... up to each model's `max_batch_size`
        (static batch 1 without batching); a model with `shapes: {strategy: buckets}`, or
        with rows off axis 0, gets dims gears instead, one per batch gear and bucket.
        `shapes` / `batches` (by model name) give what the recipe leaves open: the item
        shapes of the gears, the batch gears; `probe` the input values the fake finds the
        output dims with (default zeros). `options` go to `FakeAcl()`."""
        from inferchain.testing.fake_acl._recipe import compile_options

        fake = cls(**options)
        for path, compiled in compile_options(recipe, shapes, batches, probe).items():
            fake._options[_key(path)] = compiled
        return fake

    def _compile(self, source: Path | bytes, where: str) -> CompiledModel:
        if isinstance(source, bytes):
            return compile_model(source, None, self._default_batch, where)
        key = _key(source)
        if key not in self._compiled:
            options = self._options.get(key)
            batch = self._batches.get(key, self._default_batch)
            if options is not None and options.batch is None and key in self._batches:
                options = attrs.evolve(options, batch=batch)
            self._compiled[key] = compile_model(source, options, batch, where)
        return self._compiled[key]

    # -- the top-level pyACL calls --------------------------------------------------------

    @api("init", "|s")
    def init(self, config_path: str | None = None) -> int:
        st = self._state
        with st.lock:
            if st.initialized:
                raise Fail(REPEAT_INITIALIZE, "acl.init() was already called in this process")
            st.initialized = True
            st.was_finalized = False
        return 0

    @api("finalize", "")
    def finalize(self) -> int:
        """`aclFinalizeImpl` (hicann/runtime src/acl/aclrt_impl/acl.cpp) refuses only a
        repeated finalize (100037, its `aclFinalizeFlag`, cleared by the next `aclInit`);
        before any `init` it finalizes nothing and succeeds."""
        st = self._state
        with st.lock:
            if not st.initialized:
                if st.was_finalized:
                    raise Fail(REPEAT_FINALIZE, "acl.finalize() was already called")
                return 0
            st.initialized = False
            st.was_finalized = True
        _stop_streams(st.streams)  # leaked streams stay in the ledger; their threads stop
        return 0

    @api("create_data_buffer", "kk", null)
    def create_data_buffer(self, data: int, size: int) -> int:
        st = self._state
        ptr, nbytes = as_int(data, "data"), as_int(size, "size")
        if nbytes < 0 or (ptr == 0 and nbytes > 0):
            raise Fail(INVALID_PARAM, f"create_data_buffer({ptr:#x}, {nbytes})")
        with st.lock:
            buf = DataBuffer(st.new_handle(), ptr, nbytes)
            st.buffers[buf.handle] = buf
        return buf.handle

    def _data_buffer(self, data_buffer: object) -> DataBuffer:
        return lookup(self._state.buffers, data_buffer, "data buffer", INVALID_RESOURCE_HANDLE)

    @api("destroy_data_buffer", "k")
    def destroy_data_buffer(self, data_buffer: int) -> int:
        with self._state.lock:
            del self._state.buffers[self._data_buffer(data_buffer).handle]
        return 0

    @api("get_data_buffer_addr", "k", null)
    def get_data_buffer_addr(self, data_buffer: int) -> int:
        return self._data_buffer(data_buffer).ptr

    @api("get_data_buffer_size", "k", null)
    def get_data_buffer_size(self, data_buffer: int) -> int:
        return self._data_buffer(data_buffer).size

    @api("get_data_buffer_size_v2", "k", null)
    def get_data_buffer_size_v2(self, data_buffer: int) -> int:
        return self._data_buffer(data_buffer).size

    @api("app_log", "is")
    def app_log(self, level: int, message: str) -> None:
        """pyACL's `WrapAclAppLog` (format "is"): writes one line to the CANN application
        log and returns None. Here the lines are kept in `app_logs`."""
        with self._state.lock:
            self._state.app_logs.append((level, message))

    @api("get_recent_err_msg", "")
    def get_recent_err_msg(self) -> str:
        return self._state.recent_error

    # -- for tests ------------------------------------------------------------------------

    @property
    def initialized(self) -> bool:
        return self._state.initialized

    def live_handles(self) -> dict[str, int]:
        """Live objects per kind; all zero after a clean tear-down and `finalize`.

        `devices` counts outstanding `set_device` references; `device_memory` and
        `host_memory` count live allocations.
        """
        st = self._state
        with st.lock:
            return {
                "contexts": len(st.contexts),
                "streams": len(st.streams),
                "events": len(st.events),
                "models": len(st.models),
                "descs": len(st.descs),
                "datasets": len(st.datasets),
                "data_buffers": len(st.buffers),
                "device_memory": len(st.memory),
                "host_memory": len(st.host),
                "devices": sum(st.device_refs.values()),
                "threads": len(st.threads),
                "subscriptions": len(st.subscribed),
            }

    def device_bytes_in_use(self, device: int = 0) -> int:
        with self._state.lock:
            return self._state.memory.bytes_in_use(device)

    def call_count(self, name: str) -> int:
        """How many times `name` (e.g. "rt.malloc", "mdl.execute_async", "init") was called."""
        with self._state.lock:
            return self._state.counts[name]

    @property
    def calls(self) -> list[str]:
        """Every call so far, in order (a copy)."""
        with self._state.lock:
            return list(self._state.calls)

    @property
    def errors(self) -> list[tuple[str, int]]:
        """Every call that failed, as (name, code), in order (a copy)."""
        with self._state.lock:
            return list(self._state.errors)

    @property
    def slices(self) -> list[Slice]:
        """Every simulated copy and compute as (stream, kind, start, end), in the order they
        ended (a copy); kind is "h2d", "d2h", "d2d", "h2h" or "compute"."""
        with self._state.lock:
            return list(self._state.slices)

    def copies(self) -> dict[str, tuple[int, int]]:
        """Copies made or enqueued so far, per direction ("h2d", "d2h", "d2d", "h2h"):
        (how many, bytes)."""
        with self._state.lock:
            st = self._state
            return {d: (st.copies[d], st.copied[d]) for d in ("h2d", "d2h", "d2d", "h2h")}

    @property
    def app_logs(self) -> list[tuple[int, str]]:
        """Every `acl.app_log(level, message)` line, in order (a copy)."""
        with self._state.lock:
            return list(self._state.app_logs)

    @property
    def callback_errors(self) -> list[Exception]:
        """What stream callbacks raised (pyACL logs and drops them), in order (a copy)."""
        with self._state.lock:
            return list(self._state.callback_errors)

    @property
    def executes(self) -> Gates:
        """The gates every model execution passes before it computes, numbered from 1 in
        the order they start (hold one to keep its stream busy until the test opens it)."""
        return self._state.executes

    @property
    def executions(self) -> list[Execution]:
        """Every finished model execution (model_id, batch, hw), in order (a copy)."""
        with self._state.lock:
            return list(self._state.executions)

    def inject(self, call: str, code: int, nth: int | None = None, p: float | None = None) -> None:
        """Make `call` fail with `code` (it then has no effect).

        `nth`: once, on the nth call counted from now (1-based). `p`: on each call with
        probability p (seeded). Neither: on every call, until `clear_injections()`.
        """
        if nth is not None and nth < 1:
            raise ValueError(f"nth is 1-based, got {nth}")
        if p is not None and not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p}")
        if code == 0:
            raise ValueError("inject a non-zero error code")
        with self._state.lock:
            self._state.injections.append(Injection(call, code, nth, p))

    def clear_injections(self) -> None:
        with self._state.lock:
            self._state.injections.clear()
