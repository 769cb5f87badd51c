"""A model's outputs are checked against the batch, never trusted from its declaration.

The model here declares its output `probs` as [N, seqlen, classes] (rows on axis 0) but
returns (steps, N, classes), rows on axis 1, as exported sequence recognisers often do. Cut
on axis 0, each request would get one time step of every row of its batch: other requests'
data. Every test pins that no request ever receives such rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import recipe

import inferchain as ic
from inferchain.output_rows import OutputProbe, check_rows, judge
from inferchain.tensors import TensorDesc
from inferchain.testing.onnx_models import write_time_major

FEATURES = 6


def expected(x: np.ndarray, steps: int) -> np.ndarray:
    """One item's real output: (steps, features)."""
    return x[None, :] * (np.arange(steps, dtype=np.float32) + 1)[:, None]


def model(path: Path, **keys: Any) -> ic.Recipe:
    return recipe({"name": "tm", "path": str(path), "max_batch_size": 4, **keys})


@pytest.fixture(scope="module")
def time_major(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """steps 3, dynamic batch."""
    return write_time_major(tmp_path_factory.mktemp("tm") / "tm.onnx", steps=3)


def items(n: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, FEATURES)).astype(np.float32)


def test_a_wrong_batch_axis_is_refused_at_init_with_the_key_that_fixes_it(
    time_major: Path,
) -> None:
    with pytest.raises(ic.ConfigError) as caught:
        ic.OfflineInference(model(time_major)).init()
    message = str(caught.value)
    assert "output 'probs'" in message
    assert "batch axis 0" in message
    assert "(3, 4, 6) for 4 rows" in message and "(3, 1, 6) for 1 rows" in message
    assert "`outputs: {probs: {batch_axis: 1}}`" in message


def test_the_probe_catches_a_time_axis_as_long_as_the_batch(tmp_path: Path) -> None:
    """4 steps and a max batch of 4: at the max batch axis 0 looks right; the one-row run
    tells the batch axis apart."""
    path = write_time_major(tmp_path / "tm4.onnx", steps=4)
    with pytest.raises(ic.ConfigError, match=r"batch_axis: 1"):
        ic.OfflineInference(model(path)).init()


def test_without_a_probe_every_batch_is_checked_and_no_request_gets_other_rows(
    time_major: Path,
) -> None:
    """warmup: false runs nothing at init; the batches themselves fail, naming the fix."""
    xs = items(10)
    with ic.OfflineInference(model(time_major, warmup=False)) as oi:
        results = list(oi.map("tm", xs, on_error="return"))
        with pytest.raises(ic.OutputMismatch, match=r"batch_axis: 1") as caught:
            oi.infer("tm", xs[0])
    assert len(results) == 10
    assert all(isinstance(r, ic.OutputMismatch) for r in results)
    assert isinstance(caught.value, ic.BackendError)
    assert "output 'probs' has 3 rows on its batch axis 0" in str(caught.value)


def test_the_batch_check_does_not_count_as_a_worker_failure(time_major: Path) -> None:
    """Re-loading the session would not help: the worker stays healthy."""
    with ic.OfflineInference(model(time_major, warmup=False, health={"max_failures": 1})) as oi:
        for x in items(3):
            with pytest.raises(ic.OutputMismatch):
                oi.infer("tm", x)
        assert oi.stats().models["tm"].errors == 3
        assert all(w.healthy for w in oi._model("tm").workers)


def test_the_right_batch_axis_gives_each_request_its_own_rows(time_major: Path) -> None:
    xs = items(10)
    with ic.OfflineInference(model(time_major, outputs={"probs": {"batch_axis": 1}})) as oi:
        outs = list(oi.map("tm", xs))
        probed = oi._model("tm").workers[0].probed
    assert probed is not None and probed.batch_sizes == (4, 1)
    assert probed.shapes == (((3, 4, 6),), ((3, 1, 6),))
    for x, out in zip(xs, outs, strict=True):
        np.testing.assert_array_equal(out["probs"], expected(x, 3))


def test_a_fixed_batch_of_one_is_probed_too(tmp_path: Path) -> None:
    path = write_time_major(tmp_path / "tm1.onnx", steps=3, batch=1, declared=(1, "seqlen", 6))
    with pytest.raises(ic.ConfigError, match=r"rows look to be on axis 1"):
        ic.OfflineInference(model(path, max_batch_size=1)).init()
    ok = model(path, max_batch_size=1, outputs={"probs": {"batch_axis": 1}})
    with ic.OfflineInference(ok) as oi:
        x = items(1)[0]
        np.testing.assert_array_equal(oi.infer("tm", x)["probs"], expected(x, 3))


def test_check_rows_accepts_the_rows_or_the_padded_batch() -> None:
    desc = (TensorDesc("y", [None, 2], np.float32),)
    check_rows("m", desc, (0,), [np.zeros((3, 2))], 3)
    check_rows("m", desc, (0,), [np.zeros((8, 2))], 3, padded=8)
    with pytest.raises(ic.OutputMismatch, match=r"has 5 rows on its batch axis 0"):
        check_rows("m", desc, (0,), [np.zeros((5, 2))], 3, padded=8)
    with pytest.raises(ic.OutputMismatch, match=r"has 1 dims its batch axis 1"):
        check_rows("m", desc, (1,), [np.zeros(5)], 5)


def test_judge_warns_of_declared_dims_the_output_contradicts() -> None:
    desc = (TensorDesc("y", [None, 99], np.float32),)
    seen = OutputProbe((4, 1), (((4, 10),), ((1, 10),)))
    verdict = judge("m", desc, (0,), seen)
    assert verdict.errors == ()
    (warning,) = verdict.warnings
    assert "dim 1 is 10, not 99" in warning
    # the batch axis may say anything (a fixed batch, a gear): it is not compared
    fixed = (TensorDesc("y", [8, 10], np.float32),)
    assert judge("m", fixed, (0,), seen) == judge("m", fixed, (0,), seen)
    assert judge("m", fixed, (0,), seen).warnings == ()
