"""Precision as a recipe key: its measures (top-k agreement beside compare's), the refusal text,
the keys' validation, and what each backend does with a precision below f32."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import recipe

import inferchain as ic
from inferchain.config import ModelConfig, Recipe, ToleranceConfig
from inferchain.errors import ConfigError
from inferchain.precision import (
    check_precision,
    declared_precision,
    diff_output,
    top_k_agreement,
)
from inferchain.tensors import TensorDesc
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_mlp64


def model(**keys: object) -> ModelConfig:
    return ModelConfig.from_dict({"name": "m", "path": "m.onnx", **keys}, "models[0]", Path("r"))


def test_top_k_agreement_counts_rows_whose_best_classes_match_in_order() -> None:
    a = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
    b = np.array([[0.25, 0.6, 0.15], [0.3, 0.5, 0.2], [0.2, 0.35, 0.45]])
    assert top_k_agreement(a, b, 1) == pytest.approx(2 / 3)  # row 1 flips
    assert top_k_agreement(a, b, 2) == pytest.approx(1 / 3)  # row 0 keeps its best, not its second
    assert top_k_agreement(a, b, None) is None
    assert top_k_agreement(a[0], b[0], 1) is None  # one dim: no rows of classes
    steps = np.stack([a, a])  # (N, T, classes): every position counts
    assert top_k_agreement(steps, np.stack([a, b]), 1) == pytest.approx(5 / 6)


def test_each_measure_given_must_hold() -> None:
    a = np.array([[0.1, 0.9], [0.6, 0.4]], np.float32)
    b = np.array([[0.12, 0.88], [0.4, 0.6]], np.float32)  # the second row flips
    loose = ToleranceConfig(rtol=None, atol=0.5, cosine=0.5)
    assert diff_output(0, "p", "p", a, b, tolerance=loose).passed
    strict = ToleranceConfig(rtol=None, atol=None, top_k=1)
    d = diff_output(0, "p", "p", a, b, tolerance=strict)
    assert not d.passed and d.agreement == 0.5
    assert d.failures() == ["top-1 classes the same on 50.0% of rows, below 100.0%"]
    half = ToleranceConfig(rtol=None, atol=None, top_k=1, agreement=0.5)
    assert diff_output(0, "p", "p", a, b, tolerance=half).passed
    tight = diff_output(
        0, "p", "p", a, b, tolerance=ToleranceConfig(rtol=0, atol=0.01, cosine=0.99)
    )
    assert [f.split(" ")[0] for f in tight.failures()] == ["max", "cosine"]


def test_the_refusal_names_the_output_the_difference_and_the_tolerance() -> None:
    m = model(precision="bf16", tolerance={"rtol": 0, "atol": 1e-3})
    f32 = [np.zeros(4, np.float32), np.ones(3, np.float32)]
    low = [np.zeros(4, np.float32), np.array([1, 1, 1.5], np.float32)]
    with pytest.raises(
        ConfigError,
        match=r"^here: precision bf16 moves output 'b' beyond the tolerance on random inputs: "
        r"max abs 0\.5 \(max rel 0\.5\): 1/3 elements beyond atol 0\.001 \+ rtol 0 \* \|f32\|",
    ):
        check_precision(m, ["a", "b"], f32, low, "here")
    assert len(check_precision(m, ["a", "b"], f32, f32, "here")) == 2


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"precision": "int8"}, "precision must be one of f32, bf16, f16"),
        ({"tolerance": {"cosine": 2}}, "cosine must be between 0 and 1"),
        ({"tolerance": {"top_k": 0}}, "top_k must be > 0"),
        ({"tolerance": {"rtl": 1}}, "unknown key 'models\\[0\\].tolerance.rtl'"),
        ({"paths": {"tpu": "x.onnx"}}, "paths must map backends"),
    ],
)
def test_bad_precision_keys_are_config_errors(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        model(**keys)


def test_reference_and_paths_resolve_against_the_recipe(tmp_path: Path) -> None:
    write_mlp64(tmp_path / "m.onnx")
    write_mlp64(tmp_path / "other.onnx")
    np.savez(tmp_path / "ref.npz", x=np.zeros((2, 64), np.float32))
    entry = {
        "name": "m",
        "path": "m.onnx",
        "reference": "ref.npz",
        "paths": {"openvino": "other.onnx"},
    }
    source = tmp_path / "recipe.yaml"
    on_ort = Recipe.from_dict({"name": "r", "models": [entry]}, "", source).models[0]
    on_ov = Recipe.from_dict({"name": "r", "backend": "openvino", "models": [entry]}, "", source)
    assert on_ort.path == str(tmp_path / "m.onnx") and on_ort.reference == str(tmp_path / "ref.npz")
    assert on_ov.models[0].path == str(tmp_path / "other.onnx")
    missing = {**entry, "reference": "nope.npz"}
    with pytest.raises(
        ConfigError, match=r"key 'models\[0\].reference': reference file 'nope.npz'"
    ):
        Recipe.from_dict({"name": "r", "models": [missing]}, "", source)


def test_onnxruntime_refuses_a_precision_below_f32(mlp_path: Path) -> None:
    r = recipe({"name": "m", "path": str(mlp_path), "precision": "f16"})
    with pytest.raises(ConfigError, match=r"key 'precision': onnxruntime runs .* not at f16"):
        ic.OfflineInference(r).init()


# -- acl: the .om's declared data types --------------------------------------------------------


def test_declared_types_fit_the_precision_or_say_why() -> None:
    half = (TensorDesc("x", (None, 4), np.float32), TensorDesc("y", (None, 2), np.float16))
    assert declared_precision(model(precision="f16"), half) is None
    assert declared_precision(model(), half[:1]) is None  # only f32 at the edges: cannot tell
    wrong = declared_precision(model(), half)
    assert wrong is not None and "declares float16 for 'y', but its precision is f32" in wrong
    assert "float16" in (declared_precision(model(precision="bf16"), half) or "")


@pytest.fixture(scope="module")
def fp16_io(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The benchmarks' MLP converted to fp16 throughout, inputs and outputs included, as
    ATC's force_fp16 leaves an .om."""
    onnx = pytest.importorskip("onnx")
    float16 = pytest.importorskip("onnxconverter_common.float16")
    folder = tmp_path_factory.mktemp("fp16io")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = float16.convert_float_to_float16(onnx.load(str(write_mlp64(folder / "m.onnx"))))
    onnx.save(converted, str(folder / "m16.onnx"))
    return folder / "m16.onnx"


def acl_recipe(path: Path, **keys: object) -> Recipe:
    entry = {"name": "m", "path": str(path), "max_batch_size": 4, "warmup": False, **keys}
    return Recipe.from_dict({"name": "t", "backend": "acl", "models": [entry]})


def test_on_acl_an_fp16_model_needs_precision_f16(fp16_io: Path) -> None:
    acl = FakeAcl(static_batch=4)
    with pytest.raises(ConfigError, match=r"model 'm' declares float16 for 'x' and 1 more"):
        ic.OfflineInference(acl_recipe(fp16_io), acl_module=acl).init()
    with ic.OfflineInference(acl_recipe(fp16_io, precision="f16"), acl_module=acl) as oi:
        y = oi.infer("m", np.ones(64, np.float16))["y"]
    assert y.dtype == np.float16 and y.shape == (10,)
    assert acl.live_handles() == dict.fromkeys(acl.live_handles(), 0)  # the refused one too
