"""The public surface: what `import inferchain` offers, and that it needs no device runtime."""

from __future__ import annotations

import subprocess
import sys

import inferchain as ic


def test_public_names() -> None:
    assert ic.__all__ == sorted(ic.__all__)
    assert set(ic.__all__) >= {
        "OfflineInference",
        "Request",
        "RequestState",
        "load_recipe",
        "InferchainError",
        "ConfigError",
        "InvalidInput",
        "BackendError",
        "RequestTimeout",
        "RequestCancelled",
        "QueueFull",
        "InvalidTransition",
        "Pipeline",
        "Stats",
        "TensorDesc",
        "ModelInfo",
    }
    assert [s.name for s in ic.RequestState] == [
        "WAITING",
        "READY",
        "RUNNING",
        "DONE",
        "ERROR",
        "CANCELLED",
        "TIMED_OUT",
    ]


def test_errors_share_one_root() -> None:
    for name in (
        "ConfigError",
        "InvalidInput",
        "BackendError",
        "RequestTimeout",
        "RequestCancelled",
        "QueueFull",
        "InvalidTransition",
        "DependencyFailed",
    ):
        assert issubclass(getattr(ic, name), ic.InferchainError)
    err = ic.BackendError("boom", code=207001, name="ACL_ERROR_RT_MEMORY_ALLOCATION")
    assert (err.code, err.name) == (207001, "ACL_ERROR_RT_MEMORY_ALLOCATION")


def test_import_needs_no_device_runtime() -> None:
    code = "import sys, inferchain; print('onnxruntime' in sys.modules, 'acl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_only_backends_import_device_runtimes() -> None:
    from pathlib import Path

    root = Path(ic.__file__).parent
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("backends/", "testing/")):
            continue
        text = path.read_text()
        assert "import onnxruntime" not in text, rel
        assert "import acl" not in text, rel
