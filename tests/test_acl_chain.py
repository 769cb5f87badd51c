"""The whole chain on the acl backend through FakeAcl: same results, no leaks, faults contained."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, recipe

import inferchain as ic
from inferchain import RequestState as S
from inferchain.images import RAPIDOCR, read_image
from inferchain.testing.fake_acl import FakeAcl

ORIENTATION = REPO / "recipes" / "orientation"
SAMPLES = sorted((ORIENTATION / "samples").glob("*.png"))
GEARS = [1, 2, 4, 8, 16]


def acl_recipe(path: Path, **model: object) -> ic.Recipe:
    return recipe({"name": "m", "path": str(path), "max_batch_size": 8, **model}, backend="acl")


def test_orientation_recipe_same_outputs_on_acl_and_onnxruntime(no_thread_leak: None) -> None:
    onnx = ic.load_recipe(ORIENTATION)
    fake = FakeAcl(dynamic_batch={onnx.model("orientation").path: GEARS})
    images = [read_image(p, RAPIDOCR) for p in SAMPLES]
    with ic.OfflineInference(onnx) as oi:
        expected = list(oi.run(images))
        tensors = [oi.pipeline.preprocess(im) for im in images]  # type: ignore[attr-defined]
        raw = [next(iter(o.values())) for o in oi.map("orientation", tensors)]
    with ic.OfflineInference(ic.load_recipe(ORIENTATION, backend="acl"), acl_module=fake) as oi:
        got = list(oi.run(images))
        acl_raw = [next(iter(o.values())) for o in oi.map("orientation", tensors)]
        sizes = oi.stats().models["orientation"].batch_sizes
    assert [g["angle"] for g in got] == [e["angle"] for e in expected]
    np.testing.assert_allclose(np.stack(acl_raw), np.stack(raw), rtol=1e-4, atol=1e-5)
    assert max(sizes) > 1  # batched on the fake device too
    assert all(v == 0 for v in fake.live_handles().values()), fake.live_handles()
    assert fake.errors == []


def test_nothing_leaks_and_teardown_is_in_order(mlp_path: Path, no_thread_leak: None) -> None:
    fake = FakeAcl(static_batch=8)
    oi = ic.OfflineInference(acl_recipe(mlp_path), acl_module=fake).init()
    list(oi.map("m", np.ones((100, 64), np.float32)))
    oi.close()
    assert all(v == 0 for v in fake.live_handles().values()), fake.live_handles()
    assert not fake.initialized
    calls = fake.calls
    unload = calls.index("mdl.unload")
    assert calls[unload - 2 : unload] == ["rt.synchronize_stream"] * 2  # nothing in flight first
    one_set = [  # per stream: buffers/datasets -> host staging -> events
        *["get_data_buffer_addr", "rt.free", "destroy_data_buffer", "mdl.destroy_dataset"] * 2,
        *["rt.free_host"] * 2,
        *["rt.destroy_event"] * 4,
    ]
    assert calls[unload:] == [  # model -> desc -> sets -> streams -> ... -> finalize
        "mdl.unload",
        "mdl.destroy_desc",
        "rt.destroy_event",  # the device clock's epoch
        *one_set * 2,
        *["rt.destroy_stream"] * 2,
        "rt.destroy_context",
        "rt.reset_device",
        "finalize",
    ]
    assert fake.errors == []


def test_many_instances_tear_down_cleanly(mlp_path: Path, no_thread_leak: None) -> None:
    fake = FakeAcl(static_batch=8)
    with ic.OfflineInference(acl_recipe(mlp_path, instances=3), acl_module=fake) as oi:
        list(oi.map("m", np.ones((500, 64), np.float32)))
    assert all(v == 0 for v in fake.live_handles().values()), fake.live_handles()
    assert fake.call_count("mdl.unload") == 3
    assert fake.errors == []  # no context used from a thread that did not set it (107002/3)


def test_no_device_malloc_in_the_steady_state(mlp_path: Path) -> None:
    fake = FakeAcl(static_batch=8)
    with ic.OfflineInference(acl_recipe(mlp_path), acl_module=fake) as oi:
        list(oi.map("m", np.ones((64, 64), np.float32)))  # warm-up
        mallocs = fake.call_count("rt.malloc")
        batches = oi.stats().models["m"].batches
        list(oi.map("m", np.ones((8000, 64), np.float32)))
        assert oi.stats().models["m"].batches - batches >= 1000
        assert fake.call_count("rt.malloc") == mallocs


def test_injected_execute_failure_fails_exactly_that_batch(mlp_path: Path) -> None:
    fake = FakeAcl(static_batch=8)
    x = np.ones(64, np.float32)
    with ic.OfflineInference(acl_recipe(mlp_path, slots=8), acl_module=fake) as oi:
        oi.infer("m", x)
        fake.inject("mdl.execute_async", 507015, nth=1)
        first = oi.submit_many("m", [x] * 8)
        oi.wait_all()
        rest = oi.submit_many("m", [x] * 40)
        oi.wait_all()
    assert {r.state for r in first} == {S.ERROR}
    err = first[0].error
    assert isinstance(err, ic.BackendError)
    assert (err.code, err.name) == (507015, "ACL_ERROR_RT_AICORE_EXCEPTION")
    assert all(r.error is err for r in first)  # one batch, one error
    assert {r.state for r in rest} == {S.DONE}  # the worker recovered


def test_injected_oom_at_load_is_a_clear_init_error(mlp_path: Path, no_thread_leak: None) -> None:
    fake = FakeAcl(static_batch=8)
    fake.inject("rt.malloc", 207001, nth=2)
    oi = ic.OfflineInference(acl_recipe(mlp_path), acl_module=fake)
    with pytest.raises(ic.LoadError, match="ACL_ERROR_RT_MEMORY_ALLOCATION") as e:
        oi.init()
    assert e.value.code == 207001
    assert all(v == 0 for v in fake.live_handles().values()), fake.live_handles()
