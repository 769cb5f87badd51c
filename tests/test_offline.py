"""The whole chain end to end on ONNX Runtime with real (tiny) models."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from conftest import inferchain_threads, recipe, wait_until

import inferchain as ic
from inferchain import RequestState as S


def reference(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path)).run(None, feed)  # type: ignore[no-any-return]


def mlp_recipe(path: Path, **model: object) -> ic.Recipe:
    return recipe({"name": "mlp", "path": str(path), "max_batch_size": 16, **model})


def test_infer_equals_plain_onnxruntime(mlp_path: Path, no_thread_leak: None) -> None:
    xs = np.random.default_rng(0).standard_normal((40, 64)).astype(np.float32)
    (expected,) = reference(mlp_path, {"x": xs})
    with ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        one = oi.infer("mlp", xs[0])
        many = list(oi.map("mlp", xs))
    assert one["y"].shape == (10,)
    np.testing.assert_allclose(one["y"], expected[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.stack([m["y"] for m in many]), expected, rtol=1e-5, atol=1e-5)


def test_two_inputs_in_any_form_and_two_outputs(two_io_path: Path) -> None:
    x = np.arange(4, dtype=np.float32)
    scale = np.array([2.0], np.float32)
    logits, hidden = reference(two_io_path, {"x": x[None], "scale": scale[None]})
    with ic.OfflineInference(recipe({"name": "m", "path": str(two_io_path)})) as oi:
        by_name = oi.infer("m", {"scale": scale, "x": x})
        by_order = oi.infer("m", [x, scale])
        info = oi.model_info("m")
    for out in (by_name, by_order):
        np.testing.assert_allclose(out["logits"], logits[0], rtol=1e-5)
        np.testing.assert_allclose(out["hidden"], hidden[0], rtol=1e-5)
    assert [t.name for t in info.inputs] == ["x", "scale"]
    assert info.outputs[0].shape == (None, 3)


def test_bad_input_is_a_clear_error_and_harms_nothing(mlp_path: Path) -> None:
    xs = np.ones((64, 64), np.float32)
    with ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        in_flight = oi.submit_many("mlp", list(xs))
        with pytest.raises(ic.InvalidInput, match=r"input 'x': expected shape \(64\), got \(63\)"):
            oi.submit("mlp", np.ones(63, np.float32))
        with pytest.raises(ic.InvalidInput, match="expected dtype float32, got float64"):
            oi.submit("mlp", np.ones(64, np.float64))
        with pytest.raises(ic.InvalidInput, match=r"unknown: \['z'\], missing: \['x'\]"):
            oi.submit("mlp", {"z": xs[0]})
        with pytest.raises(ic.InvalidInput, match="no model named 'nope'"):
            oi.submit("nope", xs[0])
        assert oi.infer("mlp", np.ones(64, np.uint8))["y"].shape == (10,)  # a safe cast
        assert all(r.result(timeout=10)["y"].shape == (10,) for r in in_flight)


def test_none_and_strings_are_clear_errors_naming_what_was_given(
    mlp_path: Path, two_io_path: Path
) -> None:
    models = recipe(
        {"name": "mlp", "path": str(mlp_path), "max_batch_size": 16},
        {"name": "two", "path": str(two_io_path)},
    )
    x = np.ones(64, np.float32)
    with ic.OfflineInference(models) as oi:
        expected = "model 'mlp' input 'x': expected an array of float32 of shape (64), got"
        for given, named in [(None, "None"), ("1.5", "a str '1.5'"), (b"x", "a bytes b'x'")]:
            with pytest.raises(ic.InvalidInput, match=re.escape(f"{expected} {named}")):
                oi.submit("mlp", given)
            with pytest.raises(ic.InvalidInput, match=re.escape(f"{expected} {named}")):
                oi.submit("mlp", {"x": given})
        with pytest.raises(ic.InvalidInput, match=r"got a list that numpy reads as object"):
            oi.submit("mlp", {"x": [1.0, None] * 32})
        with pytest.raises(ic.InvalidInput, match=r"model 'two' takes 2 inputs .*; got None"):
            oi.submit("two", None)
        with pytest.raises(ic.InvalidInput, match=r"model 'two' takes 2 inputs .*; got a str 'ab'"):
            oi.submit("two", "ab")  # not a sequence of two inputs
        with pytest.raises(ic.InvalidInput, match=r"input 'scale': expected .* got None"):
            oi.submit("two", [np.ones(4, np.float32), None])
        assert oi.infer("mlp", x)["y"].shape == (10,)


def test_batches_form_under_load(mlp_path: Path) -> None:
    xs = np.zeros((2000, 64), np.float32)
    with ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        assert len(list(oi.map("mlp", xs))) == 2000
        stats = oi.stats().models["mlp"]
    assert stats.requests == 2000
    assert max(stats.batch_sizes) == 16
    assert stats.mean_batch_size > 4
    assert stats.latency_ms.p99 >= stats.latency_ms.p50 > 0


def test_map_unordered_yields_everything(mlp_path: Path) -> None:
    xs = np.random.default_rng(1).standard_normal((300, 64)).astype(np.float32)
    (expected,) = reference(mlp_path, {"x": xs})
    with ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        got = list(oi.map("mlp", xs, ordered=False, max_in_flight=32))
    assert len(got) == 300
    order = [int(np.argmin(np.abs(expected - g["y"]).sum(axis=1))) for g in got]
    assert sorted(order) == list(range(300))


def test_callbacks_run_off_the_worker_threads(mlp_path: Path) -> None:
    seen: list[tuple[int, str, S]] = []
    done = threading.Event()

    def callback(r: ic.Request) -> None:
        seen.append((r.id, threading.current_thread().name, r.state))
        if len(seen) == 10:
            done.set()

    with ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        reqs = [oi.submit("mlp", np.ones(64, np.float32), callback=callback) for _ in range(10)]
        assert done.wait(10)
    assert sorted(i for i, _, _ in seen) == [r.id for r in reqs]
    assert {name for _, name, _ in seen} == {"inferchain-callbacks"}
    assert all(state is S.DONE for _, _, state in seen)


def test_a_raising_callback_kills_nothing(mlp_path: Path) -> None:
    def bad(r: ic.Request) -> None:
        raise ValueError("user bug")

    with ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        oi.submit("mlp", np.ones(64, np.float32), callback=bad).result(timeout=10)
        assert oi.infer("mlp", np.ones(64, np.float32))["y"].shape == (10,)


def test_request_ids_increase_and_states_are_stamped(mlp_path: Path) -> None:
    with ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        reqs = oi.submit_many("mlp", list(np.ones((5, 64), np.float32)))
        oi.wait_all()
    assert [r.id for r in reqs] == sorted(r.id for r in reqs)
    assert len({r.id for r in reqs}) == 5
    for r in reqs:
        t = r.timings
        assert t["WAITING"] <= t["READY"] <= t["RUNNING"] <= t["DONE"]


def test_dependencies_and_their_failure(mlp_path: Path) -> None:
    x = np.ones(64, np.float32)
    with ic.OfflineInference(mlp_recipe(mlp_path, slots=1)) as oi:
        blocker = oi.submit("mlp", x)
        first = oi.submit("mlp", x)
        after = oi.submit("mlp", x, depends_on=[first])
        cancelled = oi.submit("mlp", x)
        cancelled.cancel()
        doomed = oi.submit("mlp", x, depends_on=[cancelled.id])
        oi.wait_all()
        assert after.state is S.DONE
        assert after.stamp(S.READY) >= first.stamp(S.DONE)  # type: ignore[operator]
        assert doomed.state is S.ERROR
        with pytest.raises(ic.DependencyFailed, match=f"depends on request {cancelled.id}"):
            doomed.result()
        assert blocker.state is S.DONE


def test_a_dependency_on_a_long_failed_id_still_fails(
    mlp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failed requests are kept whole up to a bound; past it only the fact of the failure
    is kept, and depends_on=[id] still fails with DependencyFailed, never counts as DONE."""
    import inferchain.core.inbox as inbox

    monkeypatch.setattr(inbox, "_FAILED_KEPT", 4)
    x = np.ones(64, np.float32)
    with ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        failed = oi.submit_many("mlp", [x] * 12, timeout=0.0)  # deadline already passed
        oi.wait_all()
        assert all(r.state is S.TIMED_OUT for r in failed)
        first = failed[0].id
        assert oi._engine is not None and first not in oi._engine._inbox.failed  # pushed out
        doomed = oi.submit("mlp", x, depends_on=[first])
        with pytest.raises(ic.DependencyFailed, match=f"depends on request {first}"):
            doomed.result(timeout=30)
        done = oi.submit("mlp", x)
        done.result(timeout=30)
        assert oi.submit("mlp", x, depends_on=[done.id]).result(timeout=30) is not None


def test_timeout_while_waiting(mlp_path: Path) -> None:
    x = np.ones(64, np.float32)
    with ic.OfflineInference(mlp_recipe(mlp_path, slots=1, max_batch_size=1)) as oi:
        reqs = oi.submit_many("mlp", [x] * 200)
        late = oi.submit("mlp", x, timeout=0.001)
        with pytest.raises(ic.RequestTimeout, match="passed its deadline"):
            late.result(timeout=10)
        assert all(r.result(timeout=10) for r in reqs)


def test_close_with_requests_in_flight_leaves_all_terminal(
    mlp_path: Path, no_thread_leak: None
) -> None:
    oi = ic.OfflineInference(mlp_recipe(mlp_path, slots=16)).init()
    reqs = oi.submit_many("mlp", list(np.ones((3000, 64), np.float32)))
    oi.close(drain_timeout=0.0)
    assert all(r.done() for r in reqs)
    states = {r.state for r in reqs}
    assert states <= {S.DONE, S.CANCELLED}
    assert S.CANCELLED in states
    with pytest.raises(ic.Closed):
        oi.submit("mlp", np.ones(64, np.float32))
    oi.close()  # twice is fine


def test_close_from_another_thread_and_from_a_callback(mlp_path: Path) -> None:
    oi = ic.OfflineInference(mlp_recipe(mlp_path)).init()
    closed = threading.Event()

    def close_inside(r: ic.Request) -> None:
        oi.close(drain_timeout=1.0)
        closed.set()

    oi.submit("mlp", np.ones(64, np.float32), callback=close_inside)
    assert closed.wait(20)
    t = threading.Thread(target=oi.close)
    t.start()
    t.join(10)
    assert not t.is_alive()
    # the callback thread exits right after close() returns inside it
    assert wait_until(lambda: not inferchain_threads())


def test_context_manager_closes_on_exception(mlp_path: Path, no_thread_leak: None) -> None:
    with pytest.raises(RuntimeError), ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        oi.submit_many("mlp", list(np.ones((100, 64), np.float32)))
        raise RuntimeError("user code failed")


def test_many_models_one_process(mlp_path: Path, two_io_path: Path) -> None:
    r = recipe(
        {"name": "mlp", "path": str(mlp_path), "max_batch_size": 8, "instances": 2},
        {"name": "two", "path": str(two_io_path), "max_batch_size": 4},
    )
    with ic.OfflineInference(r) as oi:
        a = oi.submit_many("mlp", list(np.ones((50, 64), np.float32)))
        b = oi.submit_many("two", [[np.ones(4, np.float32), np.ones(1, np.float32)]] * 50)
        assert oi.wait_all(timeout=30)
        stats = oi.stats()
    assert all(r.state is S.DONE for r in a + b)
    assert stats.models["mlp"].requests == 50
    assert stats.models["two"].requests == 50
    assert stats.requests == 100
    assert set(stats.to_dict()) >= {"throughput", "latency_ms", "stages", "models"}


def test_init_failure_is_clear_and_leaves_nothing(tmp_path: Path, no_thread_leak: None) -> None:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ic.LoadError, match="could not load model 'm'"):
        ic.OfflineInference(recipe({"name": "m", "path": str(bad)})).init()


def test_model_without_batching_takes_whole_inputs(mlp_path: Path) -> None:
    xs = np.ones((3, 64), np.float32)
    with ic.OfflineInference(mlp_recipe(mlp_path, max_batch_size=0)) as oi:
        out = oi.infer("mlp", xs)
    assert out["y"].shape == (3, 10)


def test_run_without_pipeline_maps_the_only_model(mlp_path: Path) -> None:
    xs = np.ones((5, 64), np.float32)
    with ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        results = list(oi.run(xs))
    assert [r["y"].shape for r in results] == [(10,)] * 5


def test_a_pipeline_may_import_its_siblings_and_a_broken_one_leaks_nothing(
    mlp_path: Path, tmp_path: Path, no_thread_leak: None
) -> None:
    (tmp_path / "helpers.py").write_text("def double(x):\n    return x * 2\n")
    (tmp_path / "pipeline.py").write_text(
        "from inferchain.pipeline import Pipeline\n"
        "from .helpers import double\n\n"
        "class P(Pipeline):\n"
        "    def process(self, item):\n"
        "        out = yield self.submit('m', double(item))\n"
        "        return out['y']\n"
    )
    (tmp_path / "broken.py").write_text("raise RuntimeError('broken pipeline module')\n")
    yaml = f"name: sib\nmodels: [{{name: m, path: {mlp_path}}}]\npipeline: pipeline.py:P\n"
    (tmp_path / "recipe.yaml").write_text(yaml)
    with ic.OfflineInference(ic.load_recipe(tmp_path)) as oi:
        (out,) = oi.run([np.ones(64, np.float32)])
        assert out.shape == (10,)
    (tmp_path / "recipe.yaml").write_text(yaml.replace("pipeline.py:P", "broken.py:P"))
    with pytest.raises(
        ic.ConfigError, match=r"broken\.py could not be imported: RuntimeError: broken pipeline"
    ):
        ic.OfflineInference(ic.load_recipe(tmp_path)).init()


def test_infer_runs_inline_when_idle_and_keeps_the_books(mlp_path: Path) -> None:
    """An idle model runs infer() on the caller's thread; slots and stats stay exact."""
    xs = np.random.default_rng(3).standard_normal((400, 64)).astype(np.float32)
    (expected,) = reference(mlp_path, {"x": xs})
    seen: list[str] = []
    with ic.OfflineInference(mlp_recipe(mlp_path, slots=2)) as oi:
        for i in range(100):
            np.testing.assert_allclose(oi.infer("mlp", xs[i])["y"], expected[i], rtol=1e-5)
        seen = [b.worker for b in oi.metrics.timeline()]
        errors: list[BaseException] = []

        def hammer(lo: int) -> None:
            try:
                for i in range(lo, lo + 50):
                    out = oi.infer("mlp", xs[i])["y"]
                    np.testing.assert_allclose(out, expected[i], rtol=1e-5, atol=1e-6)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=hammer, args=(100 + 50 * k,)) for k in range(4)]
        for t in threads:
            t.start()
        mapped = list(oi.map("mlp", xs[300:]))  # admission still works: no slot leaked
        for t in threads:
            t.join()
        stats = oi.stats().models["mlp"]
    assert not errors
    np.testing.assert_allclose(np.stack([m["y"] for m in mapped]), expected[300:], rtol=1e-5)
    assert stats.requests == 400
    assert seen == ["mlp#0"] * 100  # accounted to the worker whose session ran it


@pytest.mark.parametrize("ordered", [True, False])
def test_map_on_error_return_yields_a_failed_input_check_in_its_place(
    mlp_path: Path, ordered: bool
) -> None:
    """A wrong shape among good items is yielded as its InvalidInput at its place (ordered)
    and every other item still has its outputs."""
    rng = np.random.default_rng(1)
    good = list(rng.standard_normal((20, 64)).astype(np.float32))
    items: list[np.ndarray] = [*good[:7], np.zeros(63, np.float32), *good[7:]]
    (expected,) = reference(mlp_path, {"x": np.stack(good)})
    with ic.OfflineInference(mlp_recipe(mlp_path, max_batch_size=4)) as oi:
        results = list(oi.map("mlp", items, ordered=ordered, on_error="return"))
        with pytest.raises(ic.InvalidInput, match=r"expected shape \(64\), got \(63\)"):
            list(oi.map("mlp", items))
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(results) == 21 and len(errors) == 1
    assert isinstance(errors[0], ic.InvalidInput) and "got (63)" in str(errors[0])
    outputs = [r["y"] for r in results if not isinstance(r, BaseException)]
    if ordered:
        assert isinstance(results[7], ic.InvalidInput)
        np.testing.assert_allclose(np.stack(outputs), expected, rtol=1e-5, atol=1e-5)
    else:
        order = np.lexsort(np.stack(outputs).T)
        np.testing.assert_allclose(
            np.stack(outputs)[order], expected[np.lexsort(expected.T)], rtol=1e-5, atol=1e-5
        )


def test_map_batches_on_error_return_yields_the_bad_rows_error_and_goes_on(
    mlp_path: Path,
) -> None:
    """map_batches: the failed item is a range of its own; the rows around it keep their
    outputs, in order; an array of rows of the wrong shape is one error for its rows."""
    good = np.random.default_rng(2).standard_normal((10, 64)).astype(np.float32)
    items: list[np.ndarray] = [*good[:3], np.zeros((2, 2), np.float32), *good[3:]]
    (expected,) = reference(mlp_path, {"x": good})
    with ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        out = list(oi.map_batches("mlp", items, batch_size=4, on_error="return"))
        block = list(oi.map_batches("mlp", np.zeros((5, 3), np.float32), on_error="return"))
    errors = [o for o in out if isinstance(o, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], ic.InvalidInput)
    arrays = [o["y"] for o in out if not isinstance(o, BaseException)]
    np.testing.assert_allclose(np.concatenate(arrays), expected, rtol=1e-5, atol=1e-5)
    assert isinstance(out[1], ic.InvalidInput)  # rows 0-2, then the bad one, then the rest
    assert len(block) == 1 and isinstance(block[0], ic.InvalidInput)


class HangsOnTwo(ic.Pipeline):
    """Item 2 waits for a request nobody runs; the others go through the model."""

    def process(self, item: np.ndarray) -> Any:
        if item[0] == 2:
            yield ic.Request(10**9, "mlp")
        out = yield self.submit("mlp", item)
        return out["y"]


def test_run_item_timeout_ends_a_hanging_item_in_its_place(
    mlp_path: Path, no_thread_leak: None
) -> None:
    xs = [np.full(64, i, np.float32) for i in range(6)]
    with ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        oi._pipeline = HangsOnTwo(oi)
        results = list(oi.run(xs, on_error="return", item_timeout=5.0))
        with pytest.raises(ic.ConfigError, match="item_timeout must be > 0"):
            list(oi.run(xs, item_timeout=0))
    assert isinstance(results[2], ic.RequestTimeout)
    assert str(results[2]) == "timed out after 5 s"
    assert all(isinstance(r, np.ndarray) for i, r in enumerate(results) if i != 2)
