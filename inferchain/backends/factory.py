"""The one place that maps a recipe's `backend:` to a concrete backend (imported lazily, so
`import inferchain` needs no runtime and the interface in `base.py` knows no backend)."""

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
