"""The public surface: what `import inferchain` offers, and that it needs no device runtime."""

from __future__ import annotations

import subprocess
import sys

import inferchain as ic

# What users (OfflineInference, recipes, errors, a run's results read back) and recipe
# authors (the pipeline base classes, the generator type of `process`, steppers, a recipe's
# own modules) need: the surface changes only on purpose.
PUBLIC = {
    "BackendError",
    "Closed",
    "ConfigError",
    "DependencyFailed",
    "DeviceTensor",
    "ImagePipeline",
    "InferchainError",
    "InvalidInput",
    "InvalidTransition",
    "LiveSequence",
    "LoadError",
    "MissingDependency",
    "ModelConfig",
    "ModelInfo",
    "OfflineInference",
    "OutputMismatch",
    "Pipeline",
    "Process",
    "QueueFull",
    "Recipe",
    "Request",
    "RequestCancelled",
    "RequestError",
    "RequestState",
    "RequestTimeout",
    "StateLost",
    "Stats",
    "Stepper",
    "TensorDesc",
    "__version__",
    "import_recipe_module",
    "load_recipe",
    "read_results",
    "result_arrays",
}


def test_public_names_are_exactly_the_curated_surface() -> None:
    assert ic.__all__ == sorted(ic.__all__)
    assert set(ic.__all__) == PUBLIC
    assert all(hasattr(ic, name) for name in ic.__all__)
    assert [s.name for s in ic.RequestState] == [
        "WAITING",
        "READY",
        "RUNNING",
        "DONE",
        "ERROR",
        "CANCELLED",
        "TIMED_OUT",
    ]


def test_every_error_sits_in_the_documented_tree() -> None:
    """Start-up failures are not request errors; a batch's runtime failure is one."""
    import inferchain.errors as errors
    from inferchain.integrations.ray import RayNotInstalled

    assert issubclass(ic.LoadError, ic.InferchainError)
    assert not issubclass(ic.LoadError, ic.RequestError)
    assert issubclass(ic.BackendError, ic.RequestError)
    assert issubclass(RayNotInstalled, errors.MissingDependency)
    assert issubclass(errors.MissingDependency, ImportError)
    tree = errors.__doc__ or ""
    public = [n for n, v in vars(errors).items() if isinstance(v, type) and not n.startswith("_")]
    for name in [*public, "RayNotInstalled"]:
        if issubclass(getattr(errors, name, RayNotInstalled), Exception):
            assert name in tree, f"{name} is missing from the tree in inferchain/errors.py"
    error = ic.LoadError.from_backend(ic.BackendError("boom", code=7, name="X"))
    assert (str(error), error.code, error.name) == ("boom", 7, "X")


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
