"""The models a pipeline names, checked against its recipe once, before any model loads.

A pipeline that submits to a model its recipe does not have would fail every item with the
same error; `init()` (through `inferchain.pipeline.pipeline_class`) refuses it instead, in
one line with the closest model name. The names are the pipeline's `model_names` where it
declares them, else those its module's code gives as string literals to the calls that take
a model name (`submit`, `submit_many`, `infer`, `map`, `map_batches`, `model_info`,
`sequence`, `run_sequence`, `shape_policy`) on `self`, `self.oi` or `oi`. Names computed at
run time are not seen; declare them in `model_names` to have them checked.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import sys
from typing import TYPE_CHECKING, Any

from inferchain.errors import ConfigError

if TYPE_CHECKING:
    from inferchain.config import Recipe

CALLS = frozenset(
    ("submit", "submit_many", "infer", "map", "map_batches", "model_info", "sequence",
     "run_sequence", "shape_policy")
)  # fmt: skip


def named_models(cls: type[Any]) -> list[tuple[str, str]]:
    """(model name, where: `file:line`) for each literal model name in the code of `cls`'s
    module and of the modules of its bases that live beside it (the recipe's folder)."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    package = cls.__module__.rpartition(".")[0]
    for klass in cls.__mro__:
        module = sys.modules.get(klass.__module__)
        if module is None or module.__name__ in seen:
            continue
        if module.__name__.rpartition(".")[0] != package:
            continue  # inferchain's own classes, or a library's
        seen.add(module.__name__)
        try:
            source, file = inspect.getsource(module), inspect.getfile(module)
        except (OSError, TypeError):
            continue
        found.extend((name, f"{file}:{line}") for name, line in literal_names(source))
    return found


def literal_names(source: str) -> list[tuple[str, int]]:
    """(name, line) of each string literal passed as the model to a call of `CALLS` on
    `self`, `self.oi` or `oi` in `source`."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in CALLS or not _is_ours(node.func.value):
            continue
        arg = node.args[0] if node.args else None
        for keyword in node.keywords:
            if keyword.arg == "model":
                arg = keyword.value
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            names.append((arg.value, node.lineno))
    return names


def _is_ours(receiver: ast.expr) -> bool:
    """`self`, `oi` or `self.oi`: the pipeline or its OfflineInference."""
    if isinstance(receiver, ast.Name):
        return receiver.id in ("self", "oi")
    return (
        isinstance(receiver, ast.Attribute)
        and receiver.attr == "oi"
        and isinstance(receiver.value, ast.Name)
        and receiver.value.id == "self"
    )


def check_model_names(cls: type[Any], recipe: Recipe) -> None:
    """`ConfigError` for the first model name of pipeline `cls` (declared or found) that
    `recipe` has no model of, with the closest one ("did you mean")."""
    known = [m.name for m in recipe.models]
    declared = getattr(cls, "model_names", None)
    if declared is not None:
        uses = [(name, f"{cls.__name__}.model_names") for name in declared]
    else:
        uses = named_models(cls)
    for name, where in uses:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?; " if close else ""
            raise ConfigError(
                f"{recipe.source}: the pipeline uses model {name!r} ({where}), which the "
                f"recipe does not have ({hint}models: {', '.join(known)})"
            )
