"""Batch axes and unbatched inputs: the recipe keys checked against the loaded model, item
shapes without the batch axis, and end to end on ONNX Runtime a model that keeps its rows on
axis 1 of its state and takes a scalar once per batch, row for row equal to plain ORT."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from conftest import recipe

import inferchain as ic
from inferchain.config import ModelConfig
from inferchain.layout import Layout, item_shape
from inferchain.tensors import TensorDesc
from inferchain.testing.onnx_models import write_stateful
from inferchain.tools.synthetic import synthetic_items

F32 = np.float32
HIDDEN = 4
AXES = {"inputs": {"state": {"batch_axis": 1}, "gain": {"batched": False}}}
MOVED = {**AXES, "outputs": {"stateN": {"batch_axis": 1}}}

# silero-vad's IO as ONNX Runtime reports it
SILERO_IN = (
    TensorDesc("input", (None, None), F32),
    TensorDesc("state", (2, None, 128), F32),
    TensorDesc("sr", (), np.int64),
)
SILERO_OUT = (TensorDesc("output", (None, 1), F32), TensorDesc("stateN", (None, None, None), F32))


def model(**keys: Any) -> ModelConfig:
    return ModelConfig.from_dict({"name": "vad", "path": "unused", **keys}, "models[0]", Path("r"))


@pytest.fixture(scope="module")
def stateful(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """x f32[N, 4], state f32[2, N, 4], gain f32[] -> y f32[N, 4], stateN f32[2, N, 4]."""
    return write_stateful(tmp_path_factory.mktemp("layout") / "stateful.onnx", hidden=HIDDEN)


@pytest.fixture(scope="module")
def stateful4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same with a fixed batch of 4 (on axis 0 of x, axis 1 of state)."""
    path = tmp_path_factory.mktemp("layout") / "stateful4.onnx"
    return write_stateful(path, hidden=HIDDEN, batch=4)


def reference(path: Path, x: np.ndarray, state: np.ndarray, gain: float) -> list[np.ndarray]:
    """Plain ONNX Runtime on one row alone (x [4], state [2, 4]: the model's layout)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), so)
    feed = {"x": x[None], "state": state[:, None], "gain": np.array(gain, F32)}
    y, state_n = session.run(["y", "stateN"], feed)
    return [y[0], state_n[:, 0]]


def items(n: int, gains: list[float], seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((n, HIDDEN)).astype(F32)
    states = rng.standard_normal((n, 2, HIDDEN)).astype(F32)
    return [(xs[i], states[i], np.array(gains[i % len(gains)], F32)) for i in range(n)]


# -- the layout -------------------------------------------------------------------------------


def test_an_item_is_the_model_shape_without_its_batch_axis() -> None:
    assert item_shape((2, None, 128), 1) == (2, 128)
    assert item_shape((None, 576), 0) == (576,)
    assert item_shape((), None) == ()  # unbatched: the whole value
    silero = model(
        inputs={"state": {"batch_axis": 1}, "sr": {"batched": False}},
        outputs={"stateN": {"batch_axis": 1}},
    )
    layout = Layout.of(silero, SILERO_IN, SILERO_OUT)
    assert layout.inputs == (0, 1, None) and layout.outputs == (0, 1)
    assert layout.item_shapes(SILERO_IN) == ((None,), (2, 128), ())
    assert layout.unbatched == (2,) and layout.moved_outputs == ((1, 1),)


def test_the_batch_limit_is_read_on_each_inputs_batch_axis() -> None:
    """silero-vad's state has a fixed 2 on axis 0: read there, it was taken for a batch of 2."""
    silero = model(inputs={"state": {"batch_axis": 1}, "sr": {"batched": False}})
    assert Layout.of(silero, SILERO_IN, SILERO_OUT).batch_limit(SILERO_IN) is None
    plain_descs = SILERO_IN[:2]
    assert Layout.plain(2, 0).batch_limit(plain_descs) == 2
    fixed = (TensorDesc("x", (4, 3), F32), TensorDesc("state", (2, 4, 3), F32))
    assert Layout((0, 1), ()).batch_limit(fixed) == 4


SR = {"sr": {"batched": False}}


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            {"inputs": {"State": {"batch_axis": 1}}},
            r"key 'inputs\.State' names no input of the loaded model \(its inputs: input, state",
        ),
        (
            {"outputs": {"state_n": {"batch_axis": 1}}},
            r"key 'outputs\.state_n' names no output .*\(its outputs: output, stateN\)",
        ),
        (
            {"inputs": {"state": {"batch_axis": 3}, **SR}},
            r"key 'inputs\.state\.batch_axis' is 3, but input 'state' has 3 dims",
        ),
        (
            {"inputs": SR, "outputs": {"output": {"batch_axis": 2}}},
            r"key 'outputs\.output\.batch_axis' is 2, but output 'output' has 2 dims",
        ),
    ],
)
def test_keys_are_checked_against_the_loaded_model(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ic.ConfigError, match=message) as e:
        Layout.of(model(**keys), SILERO_IN, SILERO_OUT)
    assert "model 'vad'" in str(e.value)


def test_a_scalar_input_left_batched_is_refused_where_a_model_is_run() -> None:
    layout = Layout.of(model(inputs={"state": {"batch_axis": 1}}), SILERO_IN, SILERO_OUT)
    assert layout.inputs == (0, 1, 0)  # `inferchain info` may still describe it
    with pytest.raises(ic.ConfigError, match=r"input 'sr' has no dims .* \{sr: \{batched: false"):
        layout.check_batchable("vad", SILERO_IN)
    Layout.of(model(inputs={"sr": {"batched": False}}), SILERO_IN, SILERO_OUT).check_batchable(
        "vad", SILERO_IN
    )


def test_a_model_that_does_not_batch_moves_nothing_but_names_are_still_checked() -> None:
    whole = model(max_batch_size=0, inputs={"state": {"batch_axis": 1}})
    assert Layout.of(whole, SILERO_IN, SILERO_OUT) == Layout.plain(3, 2)
    with pytest.raises(ic.ConfigError, match="names no input"):
        Layout.of(model(max_batch_size=0, inputs={"nope": {}}), SILERO_IN, SILERO_OUT)


# -- end to end on ONNX Runtime ---------------------------------------------------------------


def stateful_recipe(path: Path, **keys: Any) -> ic.Recipe:
    return recipe({"name": "s", "path": str(path), "max_batch_size": 8, **MOVED, **keys})


def test_rows_on_axis_1_and_a_shared_scalar_give_what_each_row_gives_alone(
    stateful: Path,
) -> None:
    rows = items(20, [2.0])
    expected = [reference(stateful, x, s, float(g)) for x, s, g in rows]
    with ic.OfflineInference(stateful_recipe(stateful)) as oi:
        one = oi.infer("s", {"x": rows[0][0], "state": rows[0][1], "gain": 2.0})
        requests = oi.submit_many("s", rows)
        mapped = list(oi.map("s", rows))
        got = [r.result(timeout=10) for r in requests]
        assert oi.model_info("s").inputs[1].shape == (2, None, HIDDEN)  # as the model says
    assert one["stateN"].shape == (2, HIDDEN) and one["y"].shape == (HIDDEN,)
    for outputs in ([one], got, mapped):
        for out, (y, state_n) in zip(outputs, expected, strict=False):
            np.testing.assert_array_equal(out["y"], y)
            np.testing.assert_array_equal(out["stateN"], state_n)


def test_rows_with_interleaved_unbatched_values_each_run_with_their_own(stateful: Path) -> None:
    """Rows batch together only with an equal value: a row run with another's gain would
    give other numbers."""
    rows = items(24, [2.0, 3.0, 0.5])  # no two neighbours share a gain
    expected = [reference(stateful, x, s, float(g)) for x, s, g in rows]
    with ic.OfflineInference(stateful_recipe(stateful, max_queue_delay_ms=50)) as oi:
        got = [r.result(timeout=10) for r in oi.submit_many("s", rows)]
    for out, (y, state_n) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(out["y"], y)
        np.testing.assert_array_equal(out["stateN"], state_n)


def test_a_fixed_batch_on_axis_1_is_padded_there_and_bounds_max_batch_size(
    stateful: Path, stateful4: Path
) -> None:
    rows = items(3, [2.0])
    expected = [reference(stateful, x, s, 2.0) for x, s, _ in rows]  # the same graph, any N
    with ic.OfflineInference(stateful_recipe(stateful4, max_batch_size=4)) as oi:
        got = [r.result(timeout=10) for r in oi.submit_many("s", rows)]
    for out, (y, state_n) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(out["y"], y)
        np.testing.assert_array_equal(out["stateN"], state_n)
    with pytest.raises(ic.ConfigError, match="max_batch_size 8 exceeds the 4"):
        ic.OfflineInference(stateful_recipe(stateful4)).init()


def test_a_name_the_model_lacks_fails_init_naming_the_key_and_the_file(
    stateful: Path, tmp_path: Path, no_thread_leak: None
) -> None:
    (tmp_path / "recipe.yaml").write_text(
        f"name: x\nmodels:\n  - name: s\n    path: {stateful}\n"
        "    inputs: {state: {batch_axis: 1}, gain: {batched: false}, h: {batch_axis: 1}}\n"
    )
    with pytest.raises(ic.ConfigError, match=r"model 's': key 'inputs\.h' names no input") as e:
        ic.OfflineInference(ic.load_recipe(tmp_path)).init()
    assert str(tmp_path / "recipe.yaml") in str(e.value)
    assert "its inputs: x, state, gain" in str(e.value)


def test_max_batch_size_0_passes_a_scalar_input_untouched(stateful4: Path) -> None:
    """The inputs are whole: nothing padded, no batch axis added (it failed on the scalar)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, HIDDEN)).astype(F32)
    state = rng.standard_normal((2, 4, HIDDEN)).astype(F32)
    session = ort.InferenceSession(str(stateful4))
    y, state_n = session.run(None, {"x": x, "state": state, "gain": np.array(0.5, F32)})
    whole = recipe({"name": "s", "path": str(stateful4), "max_batch_size": 0})
    with ic.OfflineInference(whole) as oi:
        out = oi.infer("s", {"x": x, "state": state, "gain": 0.5})
        with pytest.raises(ic.InvalidInput, match=r"input 'gain': expected shape \(\), got \(1\)"):
            oi.submit("s", {"x": x, "state": state, "gain": [0.5]})
    np.testing.assert_array_equal(out["y"], y)
    np.testing.assert_array_equal(out["stateN"], state_n)


def test_synthetic_bench_items_have_the_item_shapes(stateful: Path) -> None:
    with ic.OfflineInference(stateful_recipe(stateful)) as oi:
        pool = synthetic_items(oi.model_info("s"), 2, layout=oi.shape_policy("s").layout)
        assert [a.shape for a in pool[0]] == [(HIDDEN,), (2, HIDDEN), ()]
        assert oi.infer("s", pool[0])["stateN"].shape == (2, HIDDEN)
