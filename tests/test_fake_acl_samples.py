"""FakeAcl driven the way Huawei's published pyACL samples drive the card: one client per
behaviour (init, set_device, create_context, load, desc, datasets, execute or execute_async +
callback, teardown), each checked against ONNX Runtime and the fake's ledger."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import inferchain as ic
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_mlp

ACL_SUCCESS, ACL_HOST = 0, 1
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST = 1, 2
ACL_CALLBACK_BLOCK = 1
ACL_ERROR_RT_REPORT_TIMEOUT, ACL_ERROR_RT_STREAM_NO_CB_REG = 507012, 107015
ACL_ERROR_RT_THREAD_SUBSCRIBE, ACL_ERROR_GE_EXEC_NOT_INIT = 107012, 145001
ACL_ERROR_GE_PARAM_INVALID, ACL_ERROR_RT_PARAM_INVALID = 145000, 107000
DEVICE_ID = 0
RECIPES = Path(__file__).resolve().parent.parent / "recipes"
ENCODER = "pkg://arabic_name_romanizer/resources/encoder.onnx"


def check_ret(message: str, ret: int) -> None:
    if ret != ACL_SUCCESS:
        raise RuntimeError(f"{message} failed ret={ret}")


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_mlp(tmp_path_factory.mktemp("samples") / "mlp.onnx"))


@pytest.fixture(scope="module")
def encoder() -> str:
    return _resolve(ENCODER)


def _resolve(path: str) -> str:
    from importlib.resources import files

    package, _, rest = path.removeprefix("pkg://").partition("/")
    return str(files(package) / rest)


def reference(path: str, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return list(session.run(None, feed))


class Net:
    """The structure of the samples' `Net` class: resources, model, datasets, run, release."""

    def __init__(self, acl: Any, model_path: str) -> None:
        self.acl = acl
        check_ret("acl.init", acl.init())
        check_ret("acl.rt.set_device", acl.rt.set_device(DEVICE_ID))
        self.context, ret = acl.rt.create_context(DEVICE_ID)
        check_ret("acl.rt.create_context", ret)
        self.stream, ret = acl.rt.create_stream()
        check_ret("acl.rt.create_stream", ret)
        self.model_id, ret = acl.mdl.load_from_file(model_path)
        check_ret("acl.mdl.load_from_file", ret)
        self.model_desc = acl.mdl.create_desc()
        check_ret("acl.mdl.get_desc", acl.mdl.get_desc(self.model_desc, self.model_id))
        self.datasets: list[tuple[int, list[tuple[int, int]]]] = []

    def dataset(self, sizes: list[int]) -> tuple[int, list[tuple[int, int]]]:
        """A dataset of fresh device buffers of `sizes` bytes (as the samples' _gen_dataset)."""
        acl = self.acl
        dataset = acl.mdl.create_dataset()
        buffers = []
        for size in sizes:
            ptr, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
            check_ret("acl.rt.malloc", ret)
            data = acl.create_data_buffer(ptr, size)
            _, ret = acl.mdl.add_dataset_buffer(dataset, data)
            check_ret("acl.mdl.add_dataset_buffer", ret)
            buffers.append((ptr, data))
        self.datasets.append((dataset, buffers))
        return dataset, buffers

    def copy_in(self, buffers: list[tuple[int, int]], arrays: list[np.ndarray]) -> None:
        for (ptr, data), array in zip(buffers, arrays, strict=False):
            size = self.acl.get_data_buffer_size(data)
            ret = self.acl.rt.memcpy(
                ptr, size, array.ctypes.data, array.nbytes, ACL_MEMCPY_HOST_TO_DEVICE
            )
            check_ret("acl.rt.memcpy", ret)

    def copy_out(self, ptr: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        out = np.empty(shape, dtype)
        ret = self.acl.rt.memcpy(
            out.ctypes.data, out.nbytes, ptr, out.nbytes, ACL_MEMCPY_DEVICE_TO_HOST
        )
        check_ret("acl.rt.memcpy", ret)
        return out

    def release(self) -> None:
        acl = self.acl
        check_ret("acl.rt.synchronize_stream", acl.rt.synchronize_stream(self.stream))
        check_ret("acl.mdl.unload", acl.mdl.unload(self.model_id))
        check_ret("acl.mdl.destroy_desc", acl.mdl.destroy_desc(self.model_desc))
        for dataset, buffers in self.datasets:
            for ptr, data in buffers:
                check_ret("acl.rt.free", acl.rt.free(ptr))
                check_ret("acl.destroy_data_buffer", acl.destroy_data_buffer(data))
            check_ret("acl.mdl.destroy_dataset", acl.mdl.destroy_dataset(dataset))
        check_ret("acl.rt.destroy_stream", acl.rt.destroy_stream(self.stream))
        check_ret("acl.rt.destroy_context", acl.rt.destroy_context(self.context))
        check_ret("acl.rt.reset_device", acl.rt.reset_device(DEVICE_ID))
        check_ret("acl.finalize", acl.finalize())


def assert_clean(fake: FakeAcl) -> None:
    """No rule broken, nothing live. A report loop's process_report may time out, or find
    its stream unsubscribed before the exit flag is seen, as on the card."""
    reports = {ACL_ERROR_RT_REPORT_TIMEOUT, ACL_ERROR_RT_THREAD_SUBSCRIBE}
    assert [e for e in fake.errors if not (e[0] == "rt.process_report" and e[1] in reports)] == []
    assert all(n == 0 for n in fake.live_handles().values()), fake.live_handles()


def mlp_inputs(rows: int) -> list[np.ndarray]:
    rng = np.random.default_rng(rows)
    return [
        rng.standard_normal((rows, 4)).astype(np.float32),
        rng.standard_normal((rows, 1)).astype(np.float32),
    ]


# -- 1. dynamic batch: buffers sized for the gear that runs ---------------------------------


def test_buffers_sized_for_the_running_gear_are_accepted(mlp: str) -> None:
    """ACLLite's dynamic-batch path: 2 rows on gears [1, 2, 4, 8], every buffer sized for 2."""
    fake = FakeAcl(dynamic_batch={mlp: [1, 2, 4, 8]})
    net = Net(fake, mlp)
    mdl, desc = fake.mdl, net.model_desc
    arrays = mlp_inputs(2)
    mbatch_index, ret = mdl.get_input_index_by_name(desc, "ascend_mbatch_shape_data")
    check_ret("acl.mdl.get_input_index_by_name", ret)
    sizes = [a.nbytes for a in arrays] + [mdl.get_input_size_by_index(desc, mbatch_index)]
    in_ds, in_bufs = net.dataset(sizes)
    out_ds, out_bufs = net.dataset([2 * 3 * 4, 2 * 8 * 4])  # [2, 3] and [2, 8] float32
    net.copy_in(in_bufs, arrays)
    ret = mdl.set_dynamic_batch_size(net.model_id, in_ds, mbatch_index, 2)
    check_ret("acl.mdl.set_dynamic_batch_size", ret)
    check_ret("acl.mdl.execute", mdl.execute(net.model_id, in_ds, out_ds))
    got = [net.copy_out(out_bufs[0][0], (2, 3), np.float32)]
    got.append(net.copy_out(out_bufs[1][0], (2, 8), np.float32))
    want = reference(mlp, {"x": arrays[0], "scale": arrays[1]})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert [e.batch for e in fake.executions] == [2]
    net.release()
    assert_clean(fake)


def test_buffers_too_small_for_their_run_are_refused(mlp: str) -> None:
    """Static run (no gear set): GE's 145000; a gear set but buffers short of it: 107000."""
    fake = FakeAcl(dynamic_batch={mlp: [1, 2, 4, 8]})
    net = Net(fake, mlp)
    mdl = fake.mdl
    in_ds, _ = net.dataset([2 * 4 * 4, 2 * 4, 8])
    out_ds, _ = net.dataset([2 * 3 * 4, 2 * 8 * 4])
    assert mdl.execute(net.model_id, in_ds, out_ds) == ACL_ERROR_GE_PARAM_INVALID
    check_ret("set_dynamic_batch_size", mdl.set_dynamic_batch_size(net.model_id, in_ds, 2, 4))
    assert mdl.execute(net.model_id, in_ds, out_ds) == ACL_ERROR_RT_PARAM_INVALID
    assert "gear batch 4" in fake.get_recent_err_msg()


# -- 2. what needs acl.init() ---------------------------------------------------------------


def test_run_mode_is_answered_before_init_and_models_need_it(mlp: str) -> None:
    """ACLLite reads the run mode at import time, before acl.init()."""
    fake = FakeAcl()
    run_mode, ret = fake.rt.get_run_mode()
    assert (run_mode, ret) == (ACL_HOST, ACL_SUCCESS)
    assert fake.mdl.load_from_file(mlp) == (0, ACL_ERROR_GE_EXEC_NOT_INIT)
    net = Net(fake, mlp)  # acl.init() inside
    in_ds, in_bufs = net.dataset([4 * 4, 4])
    out_ds, out_bufs = net.dataset([3 * 4, 8 * 4])
    arrays = mlp_inputs(1)
    net.copy_in(in_bufs, arrays)
    check_ret("acl.mdl.execute", fake.mdl.execute(net.model_id, in_ds, out_ds))
    want = reference(mlp, {"x": arrays[0], "scale": arrays[1]})[0]
    np.testing.assert_array_equal(net.copy_out(out_bufs[0][0], (1, 3), np.float32), want)
    net.release()
    assert fake.errors == [("mdl.load_from_file", ACL_ERROR_GE_EXEC_NOT_INIT)]
    assert all(n == 0 for n in fake.live_handles().values())


# -- 3. acl.app_log --------------------------------------------------------------------------


def test_app_log_takes_a_level_and_a_str() -> None:
    """ACLLite's logger writes every line with acl.app_log(level, message)."""
    fake = FakeAcl()
    assert fake.app_log(3, "model loaded") is None  # before init too: a plain log call
    assert fake.app_logs == [(3, "model loaded")]
    with pytest.raises(TypeError):
        fake.app_log("3", "model loaded")
    with pytest.raises(TypeError):
        fake.app_log(3, None)


# -- 4. callbacks ---------------------------------------------------------------------------


class AsyncNet(Net):
    """The asynchronous sample: a report thread, execute_async, a callback that reads the
    outputs (copied by memcpy_async before it, or inside it with memcpy)."""

    def __init__(self, acl: Any, model_path: str) -> None:
        super().__init__(acl, model_path)
        self.exit = False
        self.results: list[np.ndarray] = []
        self.tid, ret = acl.util.start_thread(self._process_callback, [self.context, 50])
        check_ret("acl.util.start_thread", ret)
        check_ret("acl.rt.subscribe_report", acl.rt.subscribe_report(self.tid, self.stream))

    def _process_callback(self, args_list: list[Any]) -> None:
        context, timeout = args_list
        self.acl.rt.set_context(context)
        while not self.exit:
            self.acl.rt.process_report(timeout)

    def stop(self) -> None:
        check_ret("acl.rt.synchronize_stream", self.acl.rt.synchronize_stream(self.stream))
        ret = self.acl.rt.unsubscribe_report(self.tid, self.stream)
        check_ret("acl.rt.unsubscribe_report", ret)
        self.exit = True
        check_ret("acl.util.stop_thread", self.acl.util.stop_thread(self.tid))


def host_buffer(acl: Any, size: int) -> int:
    ptr, ret = acl.rt.malloc_host(size)
    check_ret("acl.rt.malloc_host", ret)
    return int(ptr)


@pytest.mark.parametrize("callback_first", [False, True])
def test_a_callback_sees_the_stream_work_before_it(mlp: str, callback_first: bool) -> None:
    """The callback runs on the report thread once the work before it on its stream is done:
    outputs copied before it are there; launched before the copy, it reads the poison."""
    fake = FakeAcl()
    net = AsyncNet(fake, mlp)
    rt, mdl = fake.rt, fake.mdl
    arrays = mlp_inputs(1)
    in_ds, in_bufs = net.dataset([4 * 4, 4])
    out_ds, out_bufs = net.dataset([3 * 4, 8 * 4])
    host = host_buffer(fake, 3 * 4)
    net.copy_in(in_bufs, arrays)
    check_ret("execute_async", mdl.execute_async(net.model_id, in_ds, out_ds, net.stream))

    def copy_out() -> None:
        ret = rt.memcpy_async(host, 12, out_bufs[0][0], 12, ACL_MEMCPY_DEVICE_TO_HOST, net.stream)
        check_ret("acl.rt.memcpy_async", ret)

    def callback(user_data: list[int]) -> None:
        raw = fake.util.ptr_to_bytes(host, 12)
        net.results.append(np.frombuffer(raw, np.float32).reshape(1, 3).copy())

    if not callback_first:
        copy_out()
    check_ret("launch_callback", rt.launch_callback(callback, [0], ACL_CALLBACK_BLOCK, net.stream))
    if callback_first:
        copy_out()
    net.stop()
    want = reference(mlp, {"x": arrays[0], "scale": arrays[1]})[0]
    if callback_first:
        assert np.isnan(net.results[0]).all()  # the copy had not run: the 0xFF poison
    else:
        np.testing.assert_array_equal(net.results[0], want)
    check_ret("acl.rt.free_host", rt.free_host(host))
    net.release()
    assert_clean(fake)
    assert fake.callback_errors == []


def test_a_callback_may_copy_the_outputs_itself(mlp: str) -> None:
    """The ResNet-50 async sample's callback: a synchronous D2H memcpy inside the callback."""
    fake = FakeAcl()
    net = AsyncNet(fake, mlp)
    arrays = mlp_inputs(1)
    in_ds, in_bufs = net.dataset([4 * 4, 4])
    out_ds, out_bufs = net.dataset([3 * 4, 8 * 4])
    net.copy_in(in_bufs, arrays)
    ret = fake.mdl.execute_async(net.model_id, in_ds, out_ds, net.stream)
    check_ret("execute_async", ret)

    def callback(user_data: list[int]) -> None:
        net.results.append(net.copy_out(out_bufs[0][0], (1, 3), np.float32))

    ret = fake.rt.launch_callback(callback, [], ACL_CALLBACK_BLOCK, net.stream)
    check_ret("launch_callback", ret)
    net.stop()
    want = reference(mlp, {"x": arrays[0], "scale": arrays[1]})[0]
    np.testing.assert_array_equal(net.results[0], want)
    net.release()
    assert_clean(fake)


def test_report_threads_time_out_and_need_a_subscription(mlp: str) -> None:
    fake = FakeAcl()
    net = Net(fake, mlp)
    rt = fake.rt
    assert rt.launch_callback(print, [], ACL_CALLBACK_BLOCK, net.stream) == (
        ACL_ERROR_RT_STREAM_NO_CB_REG
    )
    assert rt.process_report(10) == ACL_ERROR_RT_THREAD_SUBSCRIBE
    assert rt.process_report(0) == 100000
    codes: list[int] = []
    subscribed, waited = threading.Event(), threading.Event()

    def waiter(args: list[Any]) -> None:
        subscribed.wait()
        codes.append(rt.process_report(1))  # subscribed, nothing launched: a timeout
        waited.set()

    tid, ret = fake.util.start_thread(waiter, [])
    check_ret("start_thread", ret)
    check_ret("subscribe_report", rt.subscribe_report(tid, net.stream))
    subscribed.set()
    waited.wait()
    check_ret("unsubscribe_report", rt.unsubscribe_report(tid, net.stream))
    check_ret("stop_thread", fake.util.stop_thread(tid))
    assert codes == [ACL_ERROR_RT_REPORT_TIMEOUT]
    net.release()
    assert all(n == 0 for n in fake.live_handles().values())


# -- 5. dims gears ---------------------------------------------------------------------------


def test_dims_gears_run_a_variable_length_encoder(encoder: str) -> None:
    """mmdeploy's Ascend wrapper: read the gears, pick the one of the input shapes, set it."""
    gears = [(1, 8, 1, 8), (2, 8, 2, 8), (2, 16, 2, 16)]  # src and src_mask: [batch, len]
    fake = FakeAcl(dynamic_dims={encoder: gears})
    net = Net(fake, encoder)
    mdl, desc = fake.mdl, net.model_desc
    count, ret = mdl.get_input_dynamic_gear_count(desc, -1)
    assert (count, ret) == (3, ACL_SUCCESS)
    dims, ret = mdl.get_input_dynamic_dims(desc, -1, count)
    check_ret("get_input_dynamic_dims", ret)
    assert [d["dims"] for d in dims] == [list(g) for g in gears]
    rng = np.random.default_rng(0)
    src = rng.integers(4, 40, (2, 16)).astype(np.int64)
    mask = np.ones((2, 16), np.bool_)
    wanted = [2, 16, 2, 16]
    gear = next(d for d in dims if d["dims"] == wanted)
    mbatch, ret = mdl.get_input_index_by_name(desc, "ascend_mbatch_shape_data")
    check_ret("get_input_index_by_name", ret)
    in_ds, in_bufs = net.dataset([src.nbytes, mask.nbytes, mdl.get_input_size_by_index(desc, 2)])
    out_sizes = [2 * 16 * 256 * 4, 2 * 16, 2 * 2 * 256 * 4]  # sized for this gear
    out_ds, out_bufs = net.dataset(out_sizes)
    net.copy_in(in_bufs, [src, mask])
    check_ret(
        "set_input_dynamic_dims", mdl.set_input_dynamic_dims(net.model_id, in_ds, mbatch, gear)
    )
    check_ret("acl.mdl.execute", mdl.execute(net.model_id, in_ds, out_ds))
    memory = net.copy_out(out_bufs[0][0], (2, 16, 256), np.float32)
    want = reference(encoder, {"src": src, "src_mask": mask})
    np.testing.assert_array_equal(memory, want[0])
    not_a_gear = {"dimCount": 4, "dims": [3, 3, 3, 3]}
    assert mdl.set_input_dynamic_dims(net.model_id, in_ds, mbatch, not_a_gear) == 145021
    net.release()
    assert fake.errors == [("mdl.set_input_dynamic_dims", 145021)]
    assert all(n == 0 for n in fake.live_handles().values())


def test_for_recipe_compiles_gears_from_the_recipe(tmp_path: Path, encoder: str) -> None:
    """Batch gears from max_batch_size; dims gears from `shapes: buckets`, one per batch gear
    and bucket."""
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(
        "name: enc\nbackend: acl\nmodels:\n"
        f"  - name: encoder\n    path: {encoder}\n    max_batch_size: 4\n"
        "    shapes: {strategy: buckets, buckets: [[[8], [8]], [[16], [16]]]}\n"
    )
    recipe = ic.load_recipe(recipe_file)
    fake = FakeAcl.for_recipe(recipe)
    net = Net(fake, encoder)
    count, _ = fake.mdl.get_input_dynamic_gear_count(net.model_desc, -1)
    dims, _ = fake.mdl.get_input_dynamic_dims(net.model_desc, -1, count)
    assert [d["dims"][:2] for d in dims] == [[b, n] for b in (1, 2, 4) for n in (8, 16)]
    net.release()
    orientation = ic.load_recipe(RECIPES / "orientation", backend="acl")
    fake = FakeAcl.for_recipe(orientation)
    net = Net(fake, orientation.model("orientation").path)
    batch, _ = fake.mdl.get_dynamic_batch(net.model_desc)
    assert batch["batch"] == [1, 2, 4, 8, 16]
    net.release()
