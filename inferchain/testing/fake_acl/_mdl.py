"""FakeAcl's `acl.mdl`: loading, model descs, datasets, gears and (async) execution.

A model lives in the context it was loaded in (107004 from any other), executes on one stream
at a time (107000 while it is in flight elsewhere), and reads its inputs from / writes its
outputs to simulated device memory when its task runs on the stream's thread.

Buffer sizes at execute follow GE (graphengine ge/graph/load/model_manager/davinci_model.cc,
`DavinciModel::UpdateIoTaskArgs` / `CheckInputAndModelSize`, reached through
ge/executor/ge_executor.cc `GeExecutor::ExecModel`): once `set_dynamic_batch_size`,
`set_dynamic_hw_size` or `set_input_dynamic_dims` put a gear in the input dataset, the run is
"dynamic" and GE checks no buffer size ("dynamic is max size"), so buffers sized for the gear
that runs are accepted. Otherwise a count that differs from the model's, or a buffer smaller
than the model's size, is ACL_ERROR_GE_PARAM_INVALID (145000); a larger one is accepted. The
fake is stricter in two places (107000): a dynamic run whose buffers are smaller than its gear
needs (the card would read or write past them), and any static buffer short of the size (GE
lets 64 bytes pass). UNVERIFIED: whether acl's own `aclmdlExecute` checks the datasets before
GE (its source, in hicann/ge, was not read).
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from inferchain.testing.fake_acl._calls import (
    GE_DYNAMIC_BATCH_SIZE_INVALID,
    GE_PARAM_INVALID,
    GE_SHAPE_INVALID,
    INTERNAL_ERROR,
    INVALID_MODEL_ID,
    INVALID_PARAM,
    INVALID_RESOURCE_HANDLE,
    MODEL_NOT_DYNAMIC,
    MODEL_OUTPUT_NOT_MATCH,
    RT_MODEL_CONTEXT,
    RT_PARAM_INVALID,
    Fail,
    api,
    as_int,
    dict_pair,
    empty_name,
    lookup,
    null,
    pair,
    same_first,
    undefined_type,
)
from inferchain.testing.fake_acl._core import DataBuffer, Namespace, Slice, State
from inferchain.testing.fake_acl._memory import Allocation, check_host_access
from inferchain.testing.fake_acl._model import MBATCH_INPUT, CompiledModel, Gear, IOSpec
from inferchain.testing.fake_acl._objects import (
    Context,
    Dataset,
    Desc,
    Execution,
    LoadedModel,
    Stream,
)
from inferchain.testing.fake_acl._rt import wait_until

Loader = Callable[[Path | bytes, str], CompiledModel]


def _none_pair(code: int, args: tuple[Any, ...]) -> tuple[None, int]:
    return None, code


Slots = list[tuple[int, int]]  # (device pointer, bytes) per input or output


class FakeMdl(Namespace):
    """`acl.mdl`."""

    def __init__(self, state: State, loader: Loader) -> None:
        super().__init__(state)
        self._load = loader

    # -- load and unload ------------------------------------------------------------------

    def _register(self, compiled: CompiledModel, ctx: Context) -> int:
        st = self._state
        with st.lock:
            model = LoadedModel(st.new_model_id(), compiled, ctx, compiled.largest_gear)
            st.models[model.model_id] = model
        return model.model_id

    @api("mdl.load_from_file", "s", pair)
    def load_from_file(self, model_path: str) -> tuple[int, int]:
        if not isinstance(model_path, str):
            raise TypeError(f"model_path must be a str, got {type(model_path).__name__}")
        ctx = self._state.require_context()
        return self._register(self._load(Path(model_path), model_path), ctx), 0

    @api("mdl.load_from_mem", "kk", pair)
    def load_from_mem(self, model: int, model_size: int) -> tuple[int, int]:
        ptr, size = as_int(model, "model"), as_int(model_size, "model_size")
        ctx = self._state.require_context()
        if ptr == 0 or size <= 0:
            raise Fail(INVALID_PARAM, "load_from_mem needs a host pointer and a size")
        data = ctypes.string_at(ptr, size)
        return self._register(self._load(data, f"<{size} bytes at {ptr:#x}>"), ctx), 0

    def _model(self, model_id: object) -> LoadedModel:
        """The model, checked against the calling thread's current context."""
        mid = as_int(model_id, "model_id")
        model = self._state.models.get(mid)
        if model is None:
            raise Fail(INVALID_MODEL_ID, f"unknown model_id {mid}")
        ctx = self._state.require_context()
        if ctx is not model.context:
            raise Fail(
                RT_MODEL_CONTEXT,
                f"model {mid} was loaded in context {model.context.handle:#x}, "
                f"the thread's current context is {ctx.handle:#x}",
            )
        return model

    @api("mdl.unload", "I")
    def unload(self, model_id: int) -> int:
        st = self._state
        with st.lock:
            model = self._model(model_id)
            if model.accesses.conflicts(st.host_clock, write=True):  # stricter than the card
                raise Fail(RT_PARAM_INVALID, f"model {model.model_id} is still executing")
            del st.models[model.model_id]
        return 0

    # -- descs ----------------------------------------------------------------------------

    @api("mdl.create_desc", "", null)
    def create_desc(self) -> int:
        st = self._state
        with st.lock:
            desc = Desc(st.new_handle())
            st.descs[desc.handle] = desc
        return desc.handle

    def _desc(self, desc: object) -> Desc:
        return lookup(self._state.descs, desc, "model desc", INVALID_RESOURCE_HANDLE)

    @api("mdl.get_desc", "kI")
    def get_desc(self, model_desc: int, model_id: int) -> int:
        desc = self._desc(model_desc)
        mid = as_int(model_id, "model_id")
        model = self._state.models.get(mid)
        if model is None:
            raise Fail(INVALID_MODEL_ID, f"unknown model_id {mid}")
        desc.model = model
        return 0

    @api("mdl.destroy_desc", "k")
    def destroy_desc(self, model_desc: int) -> int:
        with self._state.lock:
            del self._state.descs[self._desc(model_desc).handle]
        return 0

    def _io(self, model_desc: object, index: object, outputs: bool) -> IOSpec:
        desc = self._desc(model_desc)
        if desc.model is None:
            raise Fail(INVALID_PARAM, f"model desc {desc.handle:#x} was not filled by get_desc")
        specs = desc.model.compiled.outputs if outputs else desc.model.compiled.inputs
        i = as_int(index, "index")
        if not 0 <= i < len(specs):
            raise Fail(INVALID_PARAM, f"index {i} out of range (model has {len(specs)})")
        return specs[i]

    def _count(self, model_desc: object, outputs: bool) -> int:
        desc = self._desc(model_desc)
        if desc.model is None:
            raise Fail(INVALID_PARAM, f"model desc {desc.handle:#x} was not filled by get_desc")
        compiled = desc.model.compiled
        return len(compiled.outputs if outputs else compiled.inputs)

    @api("mdl.get_num_inputs", "k", null)
    def get_num_inputs(self, model_desc: int) -> int:
        return self._count(model_desc, outputs=False)

    @api("mdl.get_num_outputs", "k", null)
    def get_num_outputs(self, model_desc: int) -> int:
        return self._count(model_desc, outputs=True)

    @api("mdl.get_input_size_by_index", "kk", null)
    def get_input_size_by_index(self, model_desc: int, index: int) -> int:
        return self._io(model_desc, index, outputs=False).size

    @api("mdl.get_output_size_by_index", "kk", null)
    def get_output_size_by_index(self, model_desc: int, index: int) -> int:
        return self._io(model_desc, index, outputs=True).size

    @api("mdl.get_input_dims", "kk", dict_pair)
    def get_input_dims(self, model_desc: int, index: int) -> tuple[dict[str, Any], int]:
        spec = self._io(model_desc, index, outputs=False)
        return _dims(spec.name, spec.dims), 0

    @api("mdl.get_output_dims", "kk", dict_pair)
    def get_output_dims(self, model_desc: int, index: int) -> tuple[dict[str, Any], int]:
        spec = self._io(model_desc, index, outputs=True)
        return _dims(spec.name, spec.dims), 0

    @api("mdl.get_cur_output_dims", "kk", dict_pair)
    def get_cur_output_dims(self, model_desc: int, index: int) -> tuple[dict[str, Any], int]:
        spec = self._io(model_desc, index, outputs=True)
        model = self._desc(model_desc).model
        assert model is not None  # _io checked
        shape = model.compiled.output_shapes(model.gear)[as_int(index, "index")]
        return _dims(spec.name, shape), 0

    @api("mdl.get_input_data_type", "kk", undefined_type)
    def get_input_data_type(self, model_desc: int, index: int) -> int:
        return self._io(model_desc, index, outputs=False).acl_type

    @api("mdl.get_output_data_type", "kk", undefined_type)
    def get_output_data_type(self, model_desc: int, index: int) -> int:
        return self._io(model_desc, index, outputs=True).acl_type

    @api("mdl.get_input_name_by_index", "kk", empty_name)
    def get_input_name_by_index(self, model_desc: int, index: int) -> str:
        return self._io(model_desc, index, outputs=False).name

    @api("mdl.get_output_name_by_index", "kk", empty_name)
    def get_output_name_by_index(self, model_desc: int, index: int) -> str:
        return self._io(model_desc, index, outputs=True).name

    @api("mdl.get_input_index_by_name", "ks", pair)
    def get_input_index_by_name(self, model_desc: int, name: str) -> tuple[int, int]:
        for i in range(self._count(model_desc, outputs=False)):
            if self._io(model_desc, i, outputs=False).name == name:
                return i, 0
        raise Fail(INVALID_PARAM, f"no input named {name!r}")

    @api("mdl.get_output_index_by_name", "ks", pair)
    def get_output_index_by_name(self, model_desc: int, name: str) -> tuple[int, int]:
        for i in range(self._count(model_desc, outputs=True)):
            if self._io(model_desc, i, outputs=True).name == name:
                return i, 0
        raise Fail(INVALID_PARAM, f"no output named {name!r}")

    @api("mdl.get_dynamic_batch", "k", dict_pair)
    def get_dynamic_batch(self, model_desc: int) -> tuple[dict[str, Any], int]:
        self._count(model_desc, outputs=False)  # checks the desc
        model = self._desc(model_desc).model
        assert model is not None
        gears = list(model.compiled.batch_gears)
        return {"batchCount": len(gears), "batch": gears}, 0

    @api("mdl.get_input_dynamic_gear_count", "kk", pair)
    def get_input_dynamic_gear_count(self, model_desc: int, index: int) -> tuple[int, int]:
        """Dims gears of the model (`index` is reserved, -1 in the samples); 0 for a model
        without dims gears (UNVERIFIED: the card may return an error there)."""
        self._count(model_desc, outputs=False)
        model = self._desc(model_desc).model
        assert model is not None
        return len(model.compiled.dims_gears), 0

    @api("mdl.get_input_dynamic_dims", "kkk", _none_pair)
    def get_input_dynamic_dims(
        self, model_desc: int, index: int, gear_count: int
    ) -> tuple[list[dict[str, Any]], int]:
        """One dict per gear, `{"name", "dimCount", "dims"}`, `dims` the shapes of every data
        input at that gear concatenated (the layout of aclmdlGetInputDynamicDims in the CANN
        docs); pyACL refuses `gear_count` > 4096 with (None, 100000) before the call."""
        if gear_count > 4096:
            raise Fail(INVALID_PARAM, f"gear_count {gear_count} > 4096")
        self._count(model_desc, outputs=False)
        model = self._desc(model_desc).model
        assert model is not None
        compiled = model.compiled
        if gear_count != len(compiled.dims_gears):
            raise Fail(
                INVALID_PARAM,
                f"gear_count {gear_count}, the model has {len(compiled.dims_gears)} dims gears",
            )
        return [_dims("", tuple(compiled.dims_of(g))) for g in compiled.gears()], 0

    @api("mdl.get_dynamic_hw", "kk", dict_pair)
    def get_dynamic_hw(self, model_desc: int, index: int) -> tuple[dict[str, Any], int]:
        self._count(model_desc, outputs=False)
        model = self._desc(model_desc).model
        assert model is not None
        gears = [list(hw) for hw in model.compiled.hw_gears]
        return {"hwCount": len(gears), "hw": gears}, 0

    # -- datasets -------------------------------------------------------------------------

    @api("mdl.create_dataset", "", null)
    def create_dataset(self) -> int:
        st = self._state
        with st.lock:
            dataset = Dataset(st.new_handle())
            st.datasets[dataset.handle] = dataset
        return dataset.handle

    def _dataset(self, dataset: object) -> Dataset:
        return lookup(self._state.datasets, dataset, "dataset", INVALID_RESOURCE_HANDLE)

    def _buffer(self, buffer: object) -> DataBuffer:
        return lookup(self._state.buffers, buffer, "data buffer", INVALID_RESOURCE_HANDLE)

    @api("mdl.add_dataset_buffer", "kk", same_first)
    def add_dataset_buffer(self, dataset: int, data_buffer: int) -> tuple[int, int]:
        with self._state.lock:
            ds = self._dataset(dataset)
            ds.buffers.append(self._buffer(data_buffer).handle)
        return ds.handle, 0

    @api("mdl.get_dataset_num_buffers", "k", null)
    def get_dataset_num_buffers(self, dataset: int) -> int:
        return len(self._dataset(dataset).buffers)

    @api("mdl.get_dataset_buffer", "kk", null)
    def get_dataset_buffer(self, dataset: int, index: int) -> int:
        ds, i = self._dataset(dataset), as_int(index, "index")
        if not 0 <= i < len(ds.buffers):
            raise Fail(INVALID_PARAM, f"index {i} out of range (dataset has {len(ds.buffers)})")
        return ds.buffers[i]

    @api("mdl.destroy_dataset", "k")
    def destroy_dataset(self, dataset: int) -> int:
        with self._state.lock:
            del self._state.datasets[self._dataset(dataset).handle]
        return 0

    # -- gears ----------------------------------------------------------------------------

    def _mbatch_slot(self, model: LoadedModel, dataset: object, index: object) -> tuple[int, int]:
        specs = model.compiled.inputs
        i = as_int(index, "index")
        if not 0 <= i < len(specs) or specs[i].name != MBATCH_INPUT:
            raise Fail(INVALID_PARAM, f"input {i} is not {MBATCH_INPUT}")
        ds = self._dataset(dataset)
        if i >= len(ds.buffers):
            raise Fail(INVALID_PARAM, f"dataset {ds.handle:#x} has no buffer {i}")
        buf = self._buffer(ds.buffers[i])
        if buf.size < specs[i].size:
            raise Fail(INVALID_PARAM, f"buffer {i} holds {buf.size} bytes, needs {specs[i].size}")
        st = self._state
        alloc = st.memory.find(buf.ptr, specs[i].size)[0]
        check_host_access([alloc], st.host_clock, write=True, what="set_dynamic_*")
        return buf.ptr, specs[i].size

    @api("mdl.set_dynamic_batch_size", "IkkK")
    def set_dynamic_batch_size(self, model_id: int, dataset: int, index: int, batch: int) -> int:
        st = self._state
        with st.lock:
            model = self._model(model_id)
            if not model.compiled.batch_gears:
                raise Fail(MODEL_NOT_DYNAMIC, f"model {model.model_id} has no batch gears")
            b = as_int(batch, "batch_size")
            if b not in model.compiled.batch_gears:
                raise Fail(
                    GE_DYNAMIC_BATCH_SIZE_INVALID,
                    f"batch {b} is not a gear of model {model.model_id}: "
                    f"{list(model.compiled.batch_gears)}",
                )
            ptr, _ = self._mbatch_slot(model, dataset, index)
            st.memory.write(ptr, np.array([b], np.int64))
            model.gear = self._dataset(dataset).gear = Gear(b)
        return 0

    @api("mdl.set_dynamic_hw_size", "IkkKK")
    def set_dynamic_hw_size(
        self, model_id: int, dataset: int, index: int, height: int, width: int
    ) -> int:
        st = self._state
        with st.lock:
            model = self._model(model_id)
            compiled = model.compiled
            if not compiled.hw_gears:
                raise Fail(MODEL_NOT_DYNAMIC, f"model {model.model_id} has no image-size gears")
            hw = (as_int(height, "height"), as_int(width, "width"))
            if hw not in compiled.hw_gears:
                raise Fail(GE_SHAPE_INVALID, f"{hw} is not a gear: {list(compiled.hw_gears)}")
            ptr, _ = self._mbatch_slot(model, dataset, index)
            st.memory.write(ptr, np.array(hw, np.int64))
            model.gear = self._dataset(dataset).gear = Gear(compiled.static_batch, hw)
        return 0

    @api("mdl.set_input_dynamic_dims", "IkkO")
    def set_input_dynamic_dims(
        self, model_id: int, dataset: int, index: int, dims: dict[str, Any]
    ) -> int:
        """Select the dims gear whose concatenated input shapes are `dims["dims"]` (pyACL's
        `WrapAclMdlSetInputDynamicDims` takes a dict: "dimCount", "dims", optional "name")."""
        if not isinstance(dims, dict):
            raise TypeError("argument 4 is not dict")
        st = self._state
        with st.lock:
            model = self._model(model_id)
            compiled = model.compiled
            if not compiled.dims_gears:
                raise Fail(MODEL_NOT_DYNAMIC, f"model {model.model_id} has no dims gears")
            wanted = [int(d) for d in dims.get("dims", [])][: int(dims.get("dimCount", 0))]
            gear = next((g for g in compiled.gears() if compiled.dims_of(g) == wanted), None)
            if gear is None:
                shown = [compiled.dims_of(g) for g in compiled.gears()]
                raise Fail(GE_SHAPE_INVALID, f"dims {wanted} are not a gear: {shown}")
            ptr, _ = self._mbatch_slot(model, dataset, index)
            assert gear.dims is not None
            st.memory.write(ptr, np.array(gear.dims, np.int64))
            model.gear = self._dataset(dataset).gear = gear
        return 0

    # -- execution ------------------------------------------------------------------------

    def _slots(self, dataset: object, needs: list[int], gear: Gear | None, what: str) -> Slots:
        """The (pointer, bytes) of each buffer; `needs` is the bytes each must hold: the
        model's sizes (static run, 145000 when short) or the gear's (dynamic run, 107000)."""
        ds = self._dataset(dataset)
        if len(ds.buffers) != len(needs):
            raise Fail(
                GE_PARAM_INVALID,
                f"{what} dataset has {len(ds.buffers)} buffers, model has {len(needs)}",
            )
        slots = []
        for i, (handle, need) in enumerate(zip(ds.buffers, needs, strict=True)):
            buf = self._buffer(handle)
            if buf.size < need:
                code, why = (
                    (RT_PARAM_INVALID, f"the running gear {_gear_text(gear)} needs")
                    if gear is not None
                    else (GE_PARAM_INVALID, "the model needs")
                )
                raise Fail(code, f"{what} {i} buffer holds {buf.size} bytes, {why} {need}")
            self._state.memory.find(buf.ptr, need)  # 107000 unless device memory
            slots.append((buf.ptr, need))
        return slots

    def _begin(
        self, model: LoadedModel, in_ds: object, out_ds: object, stream: Stream | None
    ) -> tuple[Slots, Slots, list[Allocation], list[Allocation]]:
        """Validate one execution against the order of earlier work (lock held): the
        model's other executions and its memory's other users must be ordered before it."""
        st = self._state
        own = stream.handle if stream is not None else 0
        clock = stream.clock(st.host_clock) if stream is not None else st.host_clock
        if model.accesses.conflicts(clock, write=True, own=own):
            raise Fail(
                RT_PARAM_INVALID,
                f"model {model.model_id} is already executing on another stream or thread "
                "(its execution there is not ordered before this one)",
            )
        compiled = model.compiled
        gear = self._dataset(in_ds).gear  # a dynamic run: GE checks no sizes
        if gear is None:
            in_needs = [spec.size for spec in compiled.inputs]
            out_needs = [spec.size for spec in compiled.outputs]
        else:
            in_needs = [_nbytes(spec.shape(gear), spec) for spec in compiled.data_inputs]
            in_needs += [spec.size for spec in compiled.inputs[len(in_needs) :]]
            out_needs = [
                math.prod(shape) * spec.dtype.itemsize
                for shape, spec in zip(compiled.output_shapes(gear), compiled.outputs, strict=True)
            ]
        inputs = self._slots(in_ds, in_needs, gear, "input")
        outputs = self._slots(out_ds, out_needs, gear, "output")
        reads = [st.memory.find(ptr, size)[0] for ptr, size in inputs]
        writes = [st.memory.find(ptr, size)[0] for ptr, size in outputs]
        for allocs, write in ((reads, False), (writes, True)):
            if stream is None:
                check_host_access(allocs, clock, write=write, what="mdl.execute")
                continue
            for alloc in allocs:
                racing = alloc.accesses.conflicts(clock, write=write, own=own)
                if racing:  # stricter than the card, where the two would race
                    raise Fail(
                        RT_PARAM_INVALID,
                        f"execute_async: device memory {alloc.base:#x} is used by work on "
                        f"stream {racing[0]:#x} that this stream is not ordered after",
                    )
        return inputs, outputs, reads, writes

    def _run(self, model: LoadedModel, inputs: Slots, outputs: Slots, stream: int) -> None:
        """The device side: read inputs, run the ONNX model, write outputs."""
        st, compiled = self._state, model.compiled
        if not st.executes.arrive():  # a gate the test held and never opened
            raise Fail(INTERNAL_ERROR, "the execution was held and never let go")
        started = time.perf_counter()
        gear = compiled.largest_gear
        if compiled.batch_gears or compiled.hw_gears or compiled.dims_gears:
            picked = compiled.gear_from(st.memory.read(*inputs[-1]))
            if picked is None:
                code = GE_DYNAMIC_BATCH_SIZE_INVALID if compiled.batch_gears else GE_SHAPE_INVALID
                raise Fail(code, f"{MBATCH_INPUT} does not hold a gear (set_dynamic_* first?)")
            gear = picked
        arrays = []
        for spec, (ptr, _) in zip(compiled.data_inputs, inputs, strict=False):
            shape = spec.shape(gear)
            raw = st.memory.read(ptr, math.prod(shape) * spec.dtype.itemsize)
            arrays.append(raw.view(spec.dtype).reshape(shape))
        results = compiled.execute(gear, arrays)
        for result, (ptr, size) in zip(results, outputs, strict=True):
            if result.nbytes > size:
                raise Fail(MODEL_OUTPUT_NOT_MATCH, f"output of {result.nbytes} bytes > {size}")
            st.memory.write(ptr, result)
        if st.compute_scale > 1.0:
            wait_until(started + (time.perf_counter() - started) * st.compute_scale)
        with st.lock:
            st.executions.append(Execution(model.model_id, gear.batch, gear.hw))
            st.slices.append(Slice(stream, "compute", started, time.perf_counter()))

    @api("mdl.execute", "Ikk")
    def execute(self, model_id: int, input: int, output: int) -> int:  # pyACL's argument names
        with self._state.lock:
            model = self._model(model_id)
            inputs, outputs, _, _ = self._begin(model, input, output, None)
        self._run(model, inputs, outputs, 0)
        return 0

    @api("mdl.execute_async", "Ikkk")
    def execute_async(self, model_id: int, input: int, output: int, stream: int) -> int:
        st = self._state
        with st.lock:
            s = st.require_stream(as_int(stream, "stream"))
            model = self._model(model_id)
            inputs, outputs, reads, writes = self._begin(model, input, output, s)
            seq = s.submit(lambda: self._run(model, inputs, outputs, s.handle))
            model.accesses.note(s.handle, seq, write=True)
            for alloc in reads:
                alloc.accesses.note(s.handle, seq, write=False)
            for alloc in writes:
                alloc.accesses.note(s.handle, seq, write=True)
        return 0


def _nbytes(shape: tuple[int, ...], spec: IOSpec) -> int:
    return math.prod(shape) * spec.dtype.itemsize


def _gear_text(gear: Gear | None) -> str:
    if gear is None:
        return "-"
    if gear.dims is not None:
        return f"dims {list(gear.dims)}"
    return f"hw {gear.hw}" if gear.hw else f"batch {gear.batch}"


def _dims(name: str, dims: tuple[int, ...]) -> dict[str, Any]:
    return {"name": name, "dimCount": len(dims), "dims": list(dims)}
