"""FakeAcl: pyACL's return shapes, and each rule it enforces failing with the real code."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnxruntime as ort
import pytest

from inferchain.testing.fake_acl import FakeAcl, FakeAclCrash, write_fake_om
from inferchain.testing.fake_acl._model import CompiledModel, Gear
from inferchain.testing.onnx_models import write_mlp

HUGE_FIRST = 0
H2D, D2H, D2D, DEFAULT = 1, 2, 3, 4
T = TypeVar("T")


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_mlp(tmp_path_factory.mktemp("fake_acl") / "mlp.onnx"))


@pytest.fixture
def acl() -> FakeAcl:
    fake = FakeAcl()
    assert fake.init() == 0
    return fake


def on_thread(fn: Callable[[], T]) -> T:
    """Run `fn` on a fresh thread (no current context) and return its result."""
    result: list[T] = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


class Loaded:
    """A model loaded the way the official samples do, with every buffer allocated."""

    def __init__(self, acl: FakeAcl, path: str) -> None:
        self.acl = acl
        assert acl.rt.set_device(0) == 0
        self.ctx, ret = acl.rt.create_context(0)
        assert ret == 0
        self.stream, ret = acl.rt.create_stream()
        assert ret == 0
        self.model_id, ret = acl.mdl.load_from_file(path)
        assert ret == 0
        self.desc = acl.mdl.create_desc()
        assert acl.mdl.get_desc(self.desc, self.model_id) == 0
        self.inputs = self._dataset(acl.mdl.get_num_inputs(self.desc), False)
        self.outputs = self._dataset(acl.mdl.get_num_outputs(self.desc), True)

    def _dataset(self, count: int, outputs: bool) -> tuple[int, list[tuple[int, int, int]]]:
        acl, mdl = self.acl, self.acl.mdl
        dataset = mdl.create_dataset()
        slots = []
        for i in range(count):
            size_of = mdl.get_output_size_by_index if outputs else mdl.get_input_size_by_index
            size = size_of(self.desc, i)
            ptr, ret = acl.rt.malloc(size, HUGE_FIRST)
            assert ret == 0
            buf = acl.create_data_buffer(ptr, size)
            same, ret = mdl.add_dataset_buffer(dataset, buf)
            assert (same, ret) == (dataset, 0)
            slots.append((ptr, size, buf))
        return dataset, slots

    def put(self, index: int, array: np.ndarray) -> int:
        ptr, size, _ = self.inputs[1][index]
        return int(self.acl.rt.memcpy(ptr, size, array.ctypes.data, array.nbytes, H2D))

    def get(self, index: int, out: np.ndarray) -> int:
        ptr, _, _ = self.outputs[1][index]
        return int(self.acl.rt.memcpy(out.ctypes.data, out.nbytes, ptr, out.nbytes, D2H))

    def execute(self) -> tuple[int, int]:
        mdl, rt = self.acl.mdl, self.acl.rt
        ret = mdl.execute_async(self.model_id, self.inputs[0], self.outputs[0], self.stream)
        return ret, rt.synchronize_stream(self.stream)

    def close(self) -> None:
        acl, rt, mdl = self.acl, self.acl.rt, self.acl.mdl
        assert rt.synchronize_stream(self.stream) == 0
        assert mdl.unload(self.model_id) == 0
        assert mdl.destroy_desc(self.desc) == 0
        for dataset, slots in (self.inputs, self.outputs):
            for _, _, buf in slots:
                assert rt.free(acl.get_data_buffer_addr(buf)) == 0
                assert acl.destroy_data_buffer(buf) == 0
            assert mdl.destroy_dataset(dataset) == 0
        assert rt.destroy_stream(self.stream) == 0
        assert rt.destroy_context(self.ctx) == 0
        assert rt.reset_device(0) == 0


@pytest.fixture
def blocked_execute(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Model executions wait until the returned event is set (to hold work "in flight")."""
    gate = threading.Event()
    original = CompiledModel.execute

    def execute(self: CompiledModel, gear: Gear, arrays: Any) -> list[np.ndarray]:
        gate.wait(10)
        return original(self, gear, arrays)

    monkeypatch.setattr(CompiledModel, "execute", execute)
    yield gate
    gate.set()


# -- lifecycle ----------------------------------------------------------------------------


def test_only_the_model_executor_needs_init(mlp: str) -> None:
    """rt calls answer before init; the model calls (GE's executor) give 145001."""
    acl = FakeAcl()
    assert acl.rt.get_run_mode() == (1, 0)
    assert acl.rt.set_device(0) == 0
    assert acl.mdl.load_from_file(mlp) == (0, 145001)
    assert "acl.init()" in acl.get_recent_err_msg()
    assert acl.init() == 0
    model_id, ret = acl.mdl.load_from_file(mlp)
    assert ret == 0
    assert acl.finalize() == 0
    assert acl.mdl.unload(model_id) == 145001  # the executor is gone after finalize
    assert acl.init() == 0  # aclInit after aclFinalize initialises again
    assert acl.mdl.unload(model_id) == 0
    assert acl.rt.reset_device(0) == 0


def test_init_twice_is_repeat_initialize(acl: FakeAcl) -> None:
    assert acl.init() == 100002


def test_finalize_twice_is_repeat_finalize(acl: FakeAcl) -> None:
    assert acl.finalize() == 0
    assert acl.finalize() == 100037


def test_finalize_before_init_succeeds() -> None:
    assert FakeAcl().finalize() == 0  # aclFinalizeImpl refuses only a repeated finalize


def test_clean_teardown_leaves_nothing_live(acl: FakeAcl, mlp: str) -> None:
    Loaded(acl, mlp).close()
    assert acl.finalize() == 0
    assert set(acl.live_handles().values()) == {0}
    assert acl.errors == []


def test_live_handles_counts_what_is_open(acl: FakeAcl, mlp: str) -> None:
    Loaded(acl, mlp)
    live = acl.live_handles()
    assert live["models"] == live["contexts"] == live["streams"] == live["devices"] == 1
    assert live["datasets"] == 2
    assert live["data_buffers"] == live["device_memory"] == 4  # x, scale, logits, hidden


# -- contexts and threads -----------------------------------------------------------------


def test_thread_without_context_gets_context_null(acl: FakeAcl) -> None:
    assert acl.rt.set_device(0) == 0  # the main thread gets the default context
    assert acl.rt.malloc(64, HUGE_FIRST)[1] == 0
    assert on_thread(lambda: acl.rt.malloc(64, HUGE_FIRST)) == (0, 107002)
    assert on_thread(lambda: acl.rt.create_stream()) == (0, 107002)


def test_stream_from_a_thread_without_its_context_fails(acl: FakeAcl) -> None:
    acl.rt.set_device(0)
    ctx, _ = acl.rt.create_context(0)
    stream, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    assert on_thread(lambda: acl.rt.record_event(event, stream)) == 107002

    def other_context() -> int:
        acl.rt.set_device(0)  # current: the device's default context, not `ctx`
        code = int(acl.rt.record_event(event, stream))
        acl.rt.reset_device(0)
        return code

    assert on_thread(other_context) == 107003

    def with_set_context() -> int:
        acl.rt.set_context(ctx)
        return int(acl.rt.record_event(event, stream))

    assert on_thread(with_set_context) == 0
    assert acl.rt.synchronize_event(event) == 0


def test_synchronize_stream_works_from_any_thread_and_context(acl: FakeAcl) -> None:
    """The runtime switches to the stream's context itself: no 107002 / 107003 here."""
    acl.rt.set_device(0)
    acl.rt.create_context(0)
    stream, _ = acl.rt.create_stream()
    assert on_thread(lambda: acl.rt.synchronize_stream(stream)) == 0
    acl.rt.create_context(0)  # another context, current on this thread
    assert acl.rt.synchronize_stream(stream) == 0


def test_model_used_from_another_context_fails(acl: FakeAcl, mlp: str) -> None:
    loaded = Loaded(acl, mlp)
    acl.rt.create_context(0)  # another context, now current on this thread
    assert acl.mdl.unload(loaded.model_id) == 107004
    acl.rt.set_context(loaded.ctx)
    assert acl.mdl.unload(loaded.model_id) == 0


def test_destroying_a_context_takes_its_streams_along(acl: FakeAcl) -> None:
    acl.rt.set_device(0)
    ctx, _ = acl.rt.create_context(0)
    acl.rt.create_stream()
    assert acl.rt.destroy_context(ctx) == 0  # as the runtime does: its streams go with it
    assert acl.live_handles()["streams"] == 0
    assert acl.rt.destroy_context(ctx) == 107000  # now unknown
    assert acl.rt.reset_device(0) == 0
    assert acl.rt.reset_device(0) == 107001  # not set any more


def test_teardown_ledger_refuses_what_is_still_in_use(acl: FakeAcl) -> None:
    """Stricter than the card (documented as such): live events keep their context."""
    acl.rt.set_device(0)
    ctx, _ = acl.rt.create_context(0)
    event, _ = acl.rt.create_event()
    assert acl.rt.destroy_context(ctx) == 107000
    assert acl.rt.reset_device(0) == 107000  # the last reset with a live context
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.destroy_context(ctx) == 0
    assert acl.rt.reset_device(0) == 0


def test_create_context_needs_a_set_device(acl: FakeAcl) -> None:
    assert acl.rt.create_context(0) == (0, 107001)
    assert acl.rt.set_device(5) == 107001


# -- memory -------------------------------------------------------------------------------


def test_malloc_rules(acl: FakeAcl) -> None:
    small = FakeAcl(device_memory=1024)
    small.init()
    small.rt.set_device(0)
    assert small.rt.malloc(0, HUGE_FIRST) == (0, 100000)
    assert small.rt.malloc(16, 7)[1] == 0  # an unknown policy falls back to the default
    assert small.rt.malloc(2048, HUGE_FIRST) == (0, 207001)
    assert "out of memory" in small.get_recent_err_msg()


def test_free_unknown_or_twice_is_param_invalid(acl: FakeAcl) -> None:
    acl.rt.set_device(0)
    ptr, _ = acl.rt.malloc(64, HUGE_FIRST)
    assert acl.rt.free(ptr + 8) == 107000  # not the start of an allocation
    assert acl.rt.free(ptr) == 0
    assert acl.rt.free(ptr) == 107000


def test_memcpy_rules(acl: FakeAcl) -> None:
    acl.rt.set_device(0)
    dev, _ = acl.rt.malloc(64, HUGE_FIRST)
    host = np.arange(32, dtype=np.float32)  # 128 bytes
    assert acl.rt.memcpy(dev, 64, host.ctypes.data, 128, H2D) == 107000  # count > dst_max
    assert acl.rt.memcpy(dev, 128, host.ctypes.data, 128, H2D) == 107000  # beyond allocation
    assert acl.rt.memcpy(host.ctypes.data, 64, dev, 64, H2D) == 107000  # dst is host memory
    assert acl.rt.memcpy(dev, 64, 0, 64, H2D) == 100000  # NULL
    assert acl.rt.memcpy(dev, 64, host.ctypes.data, 64, 9) == 100000  # unknown kind
    assert acl.rt.memcpy(dev, 64, host.ctypes.data, 64, H2D) == 0
    back = np.zeros(16, np.float32)
    assert acl.rt.memcpy(back.ctypes.data, back.nbytes, dev, 64, D2H) == 0
    np.testing.assert_array_equal(back, host[:16])
    back[:] = 0
    assert acl.rt.memcpy(back.ctypes.data, back.nbytes, dev, 64, DEFAULT) == 0  # sides inferred
    np.testing.assert_array_equal(back, host[:16])


def test_fresh_device_memory_is_garbage_not_zero(acl: FakeAcl) -> None:
    acl.rt.set_device(0)
    dev, _ = acl.rt.malloc(16, HUGE_FIRST)
    out = np.zeros(4, np.float32)
    acl.rt.memcpy(out.ctypes.data, 16, dev, 16, D2H)
    assert np.isnan(out).all()


def test_memcpy_async_copies_on_the_stream(acl: FakeAcl) -> None:
    acl.rt.set_device(0)
    stream, _ = acl.rt.create_stream()
    a, _ = acl.rt.malloc(16, HUGE_FIRST)
    b, _ = acl.rt.malloc(16, HUGE_FIRST)
    src = np.arange(4, dtype=np.int32)
    acl.rt.memcpy(a, 16, src.ctypes.data, 16, H2D)
    assert acl.rt.memcpy_async(b, 16, a, 16, D2D, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    out = np.zeros(4, np.int32)
    acl.rt.memcpy(out.ctypes.data, 16, b, 16, D2H)
    np.testing.assert_array_equal(out, src)


def test_host_memory_and_util(acl: FakeAcl) -> None:
    acl.rt.set_device(0)
    host, ret = acl.rt.malloc_host(8)
    assert ret == 0 and acl.live_handles()["host_memory"] == 1
    data = b"abcdefgh"
    assert acl.rt.memcpy(host, 8, acl.util.bytes_to_ptr(data), 8, 0) == 0
    assert acl.util.ptr_to_bytes(host, 8) == data
    dev, _ = acl.rt.malloc(8, HUGE_FIRST)
    with pytest.raises(FakeAclCrash):
        acl.util.ptr_to_bytes(dev, 8)
    assert acl.rt.free_host(host) == 0
    assert acl.rt.free_host(host) == 107000


def test_non_integer_handles_raise_type_error(acl: FakeAcl) -> None:
    with pytest.raises(TypeError):
        acl.rt.malloc(1.5, HUGE_FIRST)  # type: ignore[arg-type]


# -- models -------------------------------------------------------------------------------


def test_desc_return_shapes(acl: FakeAcl, mlp: str) -> None:
    loaded = Loaded(acl, mlp)
    mdl, desc = acl.mdl, loaded.desc
    assert mdl.get_input_dims(desc, 0) == ({"name": "x", "dimCount": 2, "dims": [1, 4]}, 0)
    dims, ret = mdl.get_output_dims(desc, 0)
    assert ret == 0 and dims["dims"] == [1, 3] and dims["name"].endswith(":logits")
    assert mdl.get_input_size_by_index(desc, 0) == 16
    assert mdl.get_input_data_type(desc, 0) == 0  # ACL_FLOAT
    assert mdl.get_input_name_by_index(desc, 1) == "scale"
    assert mdl.get_input_index_by_name(desc, "scale") == (1, 0)
    assert mdl.get_dynamic_batch(desc) == ({"batchCount": 0, "batch": []}, 0)
    assert mdl.get_input_dims(desc, 9) == ({}, 100000)
    assert mdl.get_num_inputs(12345) == 0  # unknown desc: NULL-style value
    assert acl.errors[-1] == ("mdl.get_num_inputs", 200005)


def test_execute_matches_onnxruntime(acl: FakeAcl, mlp: str) -> None:
    loaded = Loaded(acl, mlp)
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    scale = np.full((1, 1), 2.0, np.float32)
    assert loaded.put(0, x) == 0 and loaded.put(1, scale) == 0
    assert loaded.execute() == (0, 0)
    logits = np.empty((1, 3), np.float32)
    assert loaded.get(0, logits) == 0
    expected = ort.InferenceSession(mlp).run(["logits"], {"x": x, "scale": scale})[0]
    np.testing.assert_allclose(logits, expected, rtol=1e-6)
    assert acl.mdl.execute(loaded.model_id, loaded.inputs[0], loaded.outputs[0]) == 0
    assert [e.batch for e in acl.executions] == [1, 1]


def test_static_batch_option(mlp: str) -> None:
    acl = FakeAcl(static_batch={mlp: 4})
    acl.init()
    loaded = Loaded(acl, mlp)
    assert acl.mdl.get_input_dims(loaded.desc, 0)[0]["dims"] == [4, 4]


def test_unknown_handles(acl: FakeAcl, mlp: str) -> None:
    loaded = Loaded(acl, mlp)
    assert acl.mdl.unload(999) == 100011
    assert acl.mdl.destroy_desc(999) == 200005
    assert acl.mdl.destroy_dataset(999) == 200005
    assert acl.destroy_data_buffer(999) == 200005
    assert acl.rt.destroy_stream(999) == 107000
    assert acl.mdl.execute_async(loaded.model_id, 999, loaded.outputs[0], loaded.stream) == 200005


def test_execute_checks_the_datasets(acl: FakeAcl, mlp: str) -> None:
    loaded = Loaded(acl, mlp)
    mdl, stream = acl.mdl, loaded.stream
    outputs_as_inputs = loaded.outputs[0]  # two buffers, but smaller than the inputs need
    assert mdl.execute_async(loaded.model_id, outputs_as_inputs, loaded.outputs[0], stream) == (
        145000
    )
    small_out = mdl.create_dataset()
    for size in (4, 4):
        ptr, _ = acl.rt.malloc(size, HUGE_FIRST)
        mdl.add_dataset_buffer(small_out, acl.create_data_buffer(ptr, size))
    assert mdl.execute_async(loaded.model_id, loaded.inputs[0], small_out, stream) == 145000


def test_loading_something_that_is_not_a_model(acl: FakeAcl, tmp_path: Path) -> None:
    acl.rt.set_device(0)
    bad = tmp_path / "model.om"
    bad.write_bytes(b"not a model")
    assert acl.mdl.load_from_file(str(bad)) == (0, 100003)
    assert acl.mdl.load_from_file(str(tmp_path / "missing.om")) == (0, 100003)


def test_one_model_never_executes_on_two_streams(
    acl: FakeAcl, mlp: str, blocked_execute: threading.Event
) -> None:
    loaded = Loaded(acl, mlp)
    other, _ = acl.rt.create_stream()
    model, ins, outs = loaded.model_id, loaded.inputs[0], loaded.outputs[0]
    assert acl.mdl.execute_async(model, ins, outs, loaded.stream) == 0
    assert acl.mdl.execute_async(model, ins, outs, other) == 107000
    assert acl.mdl.execute(model, ins, outs) == 107000
    assert acl.mdl.execute_async(model, ins, outs, loaded.stream) == 0  # same stream queues
    blocked_execute.set()
    assert acl.rt.synchronize_stream(loaded.stream) == 0


def test_busy_resources_cannot_be_released(
    acl: FakeAcl, mlp: str, blocked_execute: threading.Event
) -> None:
    loaded = Loaded(acl, mlp)
    assert (
        acl.mdl.execute_async(loaded.model_id, loaded.inputs[0], loaded.outputs[0], loaded.stream)
        == 0
    )
    assert acl.rt.free(loaded.inputs[1][0][0]) == 107000  # read by the pending execution
    assert loaded.put(0, np.zeros((1, 4), np.float32)) == 107000  # a race on hardware
    assert acl.mdl.unload(loaded.model_id) == 107000
    assert acl.rt.destroy_stream(loaded.stream) == 107000  # pending work
    blocked_execute.set()
    loaded.close()
    assert acl.errors == [
        ("rt.free", 107000),
        ("rt.memcpy", 107000),
        ("mdl.unload", 107000),
        ("rt.destroy_stream", 107000),
    ]


# -- gears --------------------------------------------------------------------------------


def test_dynamic_batch_gears(mlp: str) -> None:
    acl = FakeAcl(dynamic_batch={mlp: [4, 1, 2]})
    acl.init()
    loaded = Loaded(acl, mlp)
    desc, mdl = loaded.desc, acl.mdl
    assert mdl.get_dynamic_batch(desc) == ({"batchCount": 3, "batch": [1, 2, 4]}, 0)
    assert mdl.get_num_inputs(desc) == 3
    assert mdl.get_input_name_by_index(desc, 2) == "ascend_mbatch_shape_data"
    assert mdl.get_input_dims(desc, 0)[0]["dims"] == [-1, 4]
    assert mdl.get_input_size_by_index(desc, 0) == 4 * 4 * 4  # the largest gear
    assert loaded.execute() == (0, 145013)  # no gear set yet
    ds = loaded.inputs[0]
    assert mdl.set_dynamic_batch_size(loaded.model_id, ds, 2, 3) == 145013
    assert mdl.set_dynamic_batch_size(loaded.model_id, ds, 0, 2) == 100000  # not the index
    assert mdl.set_dynamic_batch_size(loaded.model_id, ds, 2, 2) == 0
    assert mdl.get_cur_output_dims(desc, 0)[0]["dims"] == [2, 3]
    assert loaded.execute() == (0, 0)
    assert acl.executions[-1].batch == 2


def test_set_dynamic_batch_on_a_static_model(acl: FakeAcl, mlp: str) -> None:
    loaded = Loaded(acl, mlp)
    assert acl.mdl.set_dynamic_batch_size(loaded.model_id, loaded.inputs[0], 0, 1) == 100019


def test_fake_om_wrapper_declares_gears(acl: FakeAcl, mlp: str, tmp_path: Path) -> None:
    om = write_fake_om(tmp_path / "mlp.om", mlp, dynamic_batch=[2, 8])
    loaded = Loaded(acl, str(om))
    assert acl.mdl.get_dynamic_batch(loaded.desc) == ({"batchCount": 2, "batch": [2, 8]}, 0)


def test_load_from_mem_reads_host_bytes(acl: FakeAcl, mlp: str) -> None:
    acl.rt.set_device(0)
    data = Path(mlp).read_bytes()
    model_id, ret = acl.mdl.load_from_mem(acl.util.bytes_to_ptr(data), len(data))
    assert ret == 0
    assert acl.mdl.unload(model_id) == 0
    assert acl.mdl.load_from_mem(0, 10) == (0, 100000)


# -- events -------------------------------------------------------------------------------


def test_events(acl: FakeAcl) -> None:
    acl.rt.set_device(0)
    stream, _ = acl.rt.create_stream()
    event, ret = acl.rt.create_event()
    assert ret == 0 and acl.live_handles()["events"] == 1
    assert acl.rt.record_event(event, stream) == 0
    assert acl.rt.synchronize_event(event) == 0
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.destroy_event(event) == 107000
    assert on_thread(lambda: acl.rt.create_event()) == (0, 107002)


# -- fault injection ----------------------------------------------------------------------


def test_inject_nth_call(acl: FakeAcl) -> None:
    acl.rt.set_device(0)
    acl.inject("rt.malloc", 207001, nth=2)
    assert acl.rt.malloc(8, HUGE_FIRST)[1] == 0
    assert acl.rt.malloc(8, HUGE_FIRST) == (0, 207001)
    assert "injected" in acl.get_recent_err_msg()
    assert acl.rt.malloc(8, HUGE_FIRST)[1] == 0  # one-shot
    assert acl.live_handles()["device_memory"] == 2  # the failed call allocated nothing
    assert acl.call_count("rt.malloc") == 3


def test_inject_with_probability_is_seeded() -> None:
    def failures(seed: int) -> list[int]:
        acl = FakeAcl(seed=seed)
        acl.init()
        acl.rt.set_device(0)
        acl.inject("rt.malloc", 207001, p=0.5)
        return [acl.rt.malloc(8, HUGE_FIRST)[1] for _ in range(40)]

    first = failures(1)
    assert first == failures(1)
    assert 0 < first.count(207001) < 40


def test_inject_always_until_cleared(acl: FakeAcl) -> None:
    acl.inject("mdl.create_desc", 500000)
    assert acl.mdl.create_desc() == 0  # a bare-value call fails with NULL
    assert acl.mdl.create_desc() == 0
    acl.clear_injections()
    assert acl.mdl.create_desc() != 0


# -- arguments, parsed as pyACL's C wrappers do --------------------------------------------


def test_pointers_and_sizes_must_be_python_ints(acl: FakeAcl) -> None:
    """`k` formats take int only: a numpy.int64 count is a TypeError, as on the card."""
    acl.rt.set_device(0)
    dev, _ = acl.rt.malloc(64, HUGE_FIRST)
    host = np.zeros(16, np.float32)
    with pytest.raises(TypeError, match=r"argument 4 must be int, not numpy\.int64"):
        acl.rt.memcpy(host.ctypes.data, 64, dev, np.prod([4, 4]) * 4, D2H)
    with pytest.raises(TypeError, match=r"argument 1 must be int, not numpy\.int64"):
        acl.rt.malloc(np.int64(64), HUGE_FIRST)
    assert acl.rt.malloc(64, np.int32(HUGE_FIRST))[1] == 0  # `i` takes any integer
    assert acl.rt.memcpy(host.ctypes.data, 64, dev, 64, np.int64(D2H)) == 0
    assert acl.errors == []  # refused before the call: no return code


def test_keyword_arguments_are_refused_everywhere(acl: FakeAcl, mlp: str) -> None:
    acl.rt.set_device(0)
    with pytest.raises(TypeError, match="takes no keyword arguments"):
        acl.rt.malloc(size=64, policy=HUGE_FIRST)
    with pytest.raises(TypeError, match="takes no keyword arguments"):
        acl.mdl.load_from_file(model_path=mlp)
    with pytest.raises(TypeError, match="exactly 2 arguments"):
        acl.rt.malloc(64)


def test_init_takes_a_str_path_or_nothing() -> None:
    acl = FakeAcl()
    with pytest.raises(TypeError, match="must be str, not None"):
        acl.init(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes no keyword arguments"):
        acl.init(config_path="acl.json")
    assert acl.init() == 0


def test_set_context_null_is_invalid_param(acl: FakeAcl) -> None:
    acl.rt.set_device(0)
    assert acl.rt.set_context(0) == 100000
    assert acl.rt.set_context(12345) == 107000


def test_free_needs_no_current_context(acl: FakeAcl) -> None:
    acl.rt.set_device(0)
    ptr, _ = acl.rt.malloc(64, HUGE_FIRST)
    assert on_thread(lambda: acl.rt.free(ptr)) == 0


# -- async copies, ordering and the time model --------------------------------------------


def test_memcpy_async_needs_64_byte_aligned_addresses(acl: FakeAcl) -> None:
    acl.rt.set_device(0)
    stream, _ = acl.rt.create_stream()
    dev, _ = acl.rt.malloc(256, HUGE_FIRST)
    host, _ = acl.rt.malloc_host(256)
    assert host % 64 == 0 and dev % 64 == 0
    assert acl.rt.memcpy_async(dev, 128, host + 8, 64, H2D, stream) == 107008
    assert acl.rt.memcpy_async(dev + 32, 128, host, 64, H2D, stream) == 107008
    assert acl.rt.memcpy_async(dev + 64, 128, host, 64, H2D, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0


def test_reading_outputs_without_synchronizing_is_refused_however_long_ago(
    acl: FakeAcl, mlp: str
) -> None:
    """Decided by order, not timing: the execution has surely finished, yet the host never
    synchronized, so the read is refused on every run."""
    loaded = Loaded(acl, mlp)
    x = np.ones((1, 4), np.float32)
    assert loaded.put(0, x) == 0 and loaded.put(1, x[:, :1]) == 0
    mdl = acl.mdl
    assert (
        mdl.execute_async(loaded.model_id, loaded.inputs[0], loaded.outputs[0], loaded.stream) == 0
    )
    while not acl.executions:  # the device is done; the host does not know it
        threading.Event().wait(0.001)
    logits = np.empty((1, 3), np.float32)
    assert loaded.get(0, logits) == 107000
    assert "not synchronized" in acl.get_recent_err_msg()
    assert acl.rt.synchronize_stream(loaded.stream) == 0
    assert loaded.get(0, logits) == 0


def test_async_copy_to_host_lands_at_the_host_synchronize(acl: FakeAcl) -> None:
    """Until the host synchronizes, the destination holds 0xFF: reading early is caught."""
    acl.rt.set_device(0)
    stream, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    dev, _ = acl.rt.malloc(64, HUGE_FIRST)
    host, _ = acl.rt.malloc_host(64)
    src = np.arange(16, dtype=np.float32)
    assert acl.rt.memcpy(dev, 64, src.ctypes.data, 64, H2D) == 0
    assert acl.rt.memcpy_async(host, 64, dev, 64, D2H, stream) == 0
    assert acl.rt.record_event(event, stream) == 0
    while not acl.slices:  # the copy ran on the stream
        threading.Event().wait(0.001)
    view = np.frombuffer(acl.util.ptr_to_bytes(host, 64), np.float32)
    assert np.isnan(view).all()
    assert acl.rt.synchronize_event(event) == 0  # an event after the copy lands it too
    np.testing.assert_array_equal(np.frombuffer(acl.util.ptr_to_bytes(host, 64), np.float32), src)


def test_streams_must_be_ordered_by_events(acl: FakeAcl) -> None:
    """Stream B using what stream A wrote needs B to wait for an event recorded after it."""
    acl.rt.set_device(0)
    a, _ = acl.rt.create_stream()
    b, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    host, _ = acl.rt.malloc_host(64)
    dev, _ = acl.rt.malloc(64, HUGE_FIRST)
    out, _ = acl.rt.malloc(64, HUGE_FIRST)
    assert acl.rt.memcpy_async(dev, 64, host, 64, H2D, a) == 0
    assert acl.rt.memcpy_async(out, 64, dev, 64, D2D, b) == 107000  # races a's write
    assert acl.rt.record_event(event, a) == 0
    assert acl.rt.stream_wait_event(b, event) == 0
    assert acl.rt.memcpy_async(out, 64, dev, 64, D2D, b) == 0
    assert acl.rt.synchronize_stream(b) == 0
    assert acl.rt.destroy_stream(a) == 0  # b's sync covers a's work it waited for


def test_time_model_records_slices_per_stream() -> None:
    acl = FakeAcl(copy_bandwidth=1e6)  # 1 MB/s: 4 kB take 4 ms
    acl.init()
    acl.rt.set_device(0)
    stream, _ = acl.rt.create_stream()
    start, _ = acl.rt.create_event()
    end, _ = acl.rt.create_event()
    dev, _ = acl.rt.malloc(4096, HUGE_FIRST)
    host, _ = acl.rt.malloc_host(4096)
    assert acl.rt.record_event(start, stream) == 0
    assert acl.rt.memcpy_async(dev, 4096, host, 4096, H2D, stream) == 0
    assert acl.rt.record_event(end, stream) == 0
    assert acl.rt.event_elapsed_time(start, end) == (0.0, 107006)  # not synchronized yet
    assert acl.rt.synchronize_stream(stream) == 0
    ms, ret = acl.rt.event_elapsed_time(start, end)
    assert ret == 0 and ms >= 4.0  # the model's own figure: 4096 bytes / 1e6 bytes/s
    ((slice_stream, kind, begin, finish),) = acl.slices
    assert (slice_stream, kind) == (stream, "h2d") and finish - begin >= 0.004
    with pytest.raises(ValueError, match="copy_bandwidth"):
        FakeAcl(copy_bandwidth=0)
