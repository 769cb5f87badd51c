"""The one place that maps a recipe's `backend:` to a concrete backend (imported lazily, so
`import inferchain` needs no runtime and the interface in `base.py` knows no backend), and
that sets a runtime's process-wide log level for the applications."""

from __future__ import annotations

from inferchain.backends.base import Backend
from inferchain.config import BACKENDS, Recipe
from inferchain.errors import ConfigError
from inferchain.extras import require


def make_backend(recipe: Recipe, **options: object) -> Backend:
    """The backend the recipe names (`acl_module=` passes a pyACL module or a fake;
    `check_precision=False` leaves a lower precision unchecked, for `inferchain compare`)."""
    if recipe.backend == "onnxruntime":
        from inferchain.backends.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(recipe)
    if recipe.backend == "openvino":
        require(["openvino"], "openvino", f"{recipe.source}: backend openvino")
        from inferchain.backends.openvino import OpenVinoBackend

        return OpenVinoBackend(recipe, check=bool(options.get("check_precision", True)))
    if recipe.backend == "acl":
        from inferchain.backends.acl import AclBackend

        return AclBackend(recipe, acl_module=options.get("acl_module"))
    raise ConfigError(
        f"{recipe.source}: backend {recipe.backend!r} is not one of {', '.join(BACKENDS)}"
    )


def set_runtime_log_level(level: str) -> None:
    """For applications (the command line, a Ray actor), beside
    `inferchain.logs.configure_output`: onnxruntime's own log (its C++ warnings) at `level`
    (a `--log-level` name) and up, for the sessions made after; nothing where onnxruntime
    cannot be imported."""
    try:
        from inferchain.backends.onnxruntime import set_log_level
    except ImportError:
        return
    set_log_level(level)
