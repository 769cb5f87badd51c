"""The ONNX Runtime backend: providers and their options reach the session; CPU fallback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import structlog
from conftest import recipe

import inferchain as ic
from inferchain.backends import onnxruntime as backend
from inferchain.backends.onnxruntime import OnnxRuntimeBackend, providers, session_options
from inferchain.config import SessionOptions
from inferchain.errors import ConfigError
from inferchain.testing.onnx_models import write_mlp64, write_time_major

CUDA = {"CUDAExecutionProvider": {"device_id": 1, "arena_extend_strategy": "kSameAsRequested"}}
CANN = {"CANNExecutionProvider": {"device_id": 0, "precision_mode": "force_fp16"}}


def test_available_providers_pass_with_options_in_order() -> None:
    names, opts = providers(
        [CUDA, CANN, "CPUExecutionProvider"],
        ["CANNExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    assert names == ["CUDAExecutionProvider", "CANNExecutionProvider", "CPUExecutionProvider"]
    assert opts == [
        {"device_id": "1", "arena_extend_strategy": "kSameAsRequested"},
        {"device_id": "0", "precision_mode": "force_fp16"},
        {},
    ]


def test_missing_provider_falls_back_to_cpu_with_a_warning() -> None:
    with structlog.testing.capture_logs() as logs:
        names, opts = providers([CUDA], ["CPUExecutionProvider"])
    assert names == ["CPUExecutionProvider"] and opts == [{}]
    assert logs[0]["event"] == "provider_unavailable"
    assert logs[0]["provider"] == "CUDAExecutionProvider"
    assert logs[0]["log_level"] == "warning"


def test_session_gets_the_recipe_providers_and_options(
    mlp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No GPU or NPU here: check what reaches InferenceSession, then build the real one."""
    seen: dict[str, Any] = {}
    real = ort.InferenceSession

    def capture(path: str, sess_options: Any, providers: Any, provider_options: Any) -> Any:
        seen.update(providers=providers, provider_options=provider_options, so=sess_options)
        return real(path, sess_options=sess_options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(
        backend.ort,
        "get_available_providers",
        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    monkeypatch.setattr(backend.ort, "InferenceSession", capture)
    r = recipe(
        {"name": "m", "path": str(mlp_path)},
        providers=[CUDA, CANN],
        session_options={"intra_op_num_threads": 3, "graph_optimization_level": "basic"},
    )
    session = OnnxRuntimeBackend(r).load(r.models[0], device=0)
    assert seen["providers"] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert seen["provider_options"][0]["device_id"] == "1"
    assert seen["so"].intra_op_num_threads == 3
    assert seen["so"].graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert [t.name for t in session.inputs] == ["x"]


def test_session_options_mapping() -> None:
    so = session_options(SessionOptions(2, 1, "disable", "parallel"))
    assert (so.intra_op_num_threads, so.inter_op_num_threads) == (2, 1)
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert so.execution_mode == ort.ExecutionMode.ORT_PARALLEL


def test_fixed_batch_model_is_padded(tmp_path: Path) -> None:
    import numpy as np

    from inferchain.testing.onnx_models import write_mlp64

    path = write_mlp64(tmp_path / "fixed.onnx", batch=4)
    r = recipe({"name": "m", "path": str(path), "max_batch_size": 4})
    session = OnnxRuntimeBackend(r).load(r.models[0], device=0)
    assert session.max_batch_size == 4
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    full = session.run([x], 4)[0]
    part = session.run([x[:3]], 3)[0]
    np.testing.assert_allclose(part[:3], full[:3], rtol=1e-6)


def test_a_provider_name_onnxruntime_does_not_know_is_a_config_error(tmp_path: Path) -> None:
    """A misspelling refuses to start, naming the key and the closest name; a known provider
    this build lacks still falls back (above)."""
    write_mlp64(tmp_path / "m.onnx")
    r = recipe({"name": "m", "path": str(tmp_path / "m.onnx")}, providers=["CPUExecutonProvider"])
    with pytest.raises(
        ConfigError,
        match=r"key 'providers\[0\]': .*'CPUExecutonProvider' "
        r"\(did you mean 'CPUExecutionProvider'\?\)",
    ):
        OnnxRuntimeBackend(r)
    with pytest.raises(ConfigError, match="did you mean"):
        ic.OfflineInference(r).init()
    names, _ = providers([CUDA], ["CPUExecutionProvider"], ort.get_all_providers())
    assert names == ["CPUExecutionProvider"]


@pytest.mark.parametrize("level", [None, 2, 3])
def test_onnxruntime_log_severity_per_recipe_and_from_the_log_level(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], level: int | None
) -> None:
    """onnxruntime's own warnings about a model whose declared output shape lies (shape
    merging at load, `VerifyOutputSizes` at run) are silenced by `session_options:
    {log_severity_level: 3}`, and by the process default that `--log-level error` sets
    (`set_log_level`)."""
    path = write_time_major(tmp_path / "t.onnx", batch=1, declared=(1, 3, 6))
    x = {"x": np.ones((1, 6), np.float32)}
    try:
        backend.set_log_level("warning" if level is not None else "error")
        so = session_options(SessionOptions(log_severity_level=level))
        ort.InferenceSession(str(path), sess_options=so).run(None, x)
        err = capfd.readouterr().err
    finally:
        backend.set_log_level("warning")
    assert ("[W:onnxruntime" in err) is (level == 2)
    with pytest.raises(ConfigError, match=r"log_severity_level must be 0 \(verbose\)"):
        SessionOptions.from_dict({"log_severity_level": 5}, "session_options", Path("r.yaml"))
