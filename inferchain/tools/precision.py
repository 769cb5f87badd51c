"""`inferchain compare --precision P RECIPE`: one model of a recipe at a lower precision
against itself at f32, on the user's inputs, with the measures and the tolerance that
`init()` checks (`inferchain.precision`), reported instead of refused."""

from __future__ import annotations

import contextlib
from pathlib import Path

import attrs
import numpy as np

from inferchain.backends.base import Session
from inferchain.backends.factory import make_backend
from inferchain.config import ModelConfig, Recipe, load_recipe
from inferchain.errors import ConfigError, InvalidInput
from inferchain.precision import check_feed, diff_output, run_rows
from inferchain.tensors import TensorDesc
from inferchain.tools.compare import CompareReport


def compare_precision(
    recipe: str | Path,
    precision: str,
    inputs: str | Path | None = None,
    *,
    model: str | None = None,
    backend_a: str | None = None,
    backend_b: str | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    acl_module: object | None = None,
) -> CompareReport:
    """Run the recipe's model (`model`, or its only one) at f32 (A, on `backend_a`, default
    the recipe's) and at `precision` (B, on `backend_b`) on the same inputs: `inputs` (an
    .npz by input name with the batch dim), else the model's `reference:`, else seeded
    random ones; compared within the model's `tolerance:` (`rtol`/`atol` replace its
    elementwise part)."""
    base = load_recipe(recipe)
    name = model or _only_model(base)
    base.model(name)  # ConfigError naming it when there is none
    sides = [
        load_recipe(recipe, backend=backend or base.backend, models={name: {"precision": p}})
        for backend, p in ((backend_a, "f32"), (backend_b, precision))
    ]
    config = sides[1].model(name)
    tolerance = config.tolerance
    if rtol is not None or atol is not None:
        tolerance = attrs.evolve(tolerance, rtol=rtol or 0.0, atol=atol or 0.0)
    where = f"{base.source}: model {name!r}"
    fed, source, names, runs = _run_both(sides, name, inputs, where, acl_module)
    diffs = tuple(
        diff_output(i, n, n, a, b, tolerance=tolerance)
        for i, (n, a, b) in enumerate(zip(names, *runs, strict=True))
    )
    return CompareReport(
        f"{name} at f32 ({config.path})",
        sides[0].backend,
        f"{name} at {precision}",
        sides[1].backend,
        fed,
        source,
        tolerance.rtol or 0.0,
        tolerance.atol or 0.0,
        diffs,
        tolerance,
    )


def _run_both(
    sides: list[Recipe], name: str, inputs: str | Path | None, where: str, acl: object | None
) -> tuple[tuple[TensorDesc, ...], str, list[str], list[list[np.ndarray]]]:
    """Load the model on both sides (this thread, as pyACL wants), run the same inputs
    through each and release them: (what was fed, its source, output names, outputs)."""
    with contextlib.ExitStack() as stack:
        sessions: list[Session] = []
        for r in sides:
            backend = make_backend(r, acl_module=acl, check_precision=False)
            stack.callback(backend.close)
            sessions.append(backend.load(r.model(name), r.device))
            stack.callback(sessions[-1].close)
        first = sessions[0]
        feed, rows, source = _feed(sides[1].model(name), first, inputs, where)
        runs = [
            run_rows(s, r.model(name), feed, rows) for s, r in zip(sessions, sides, strict=True)
        ]
        pairs = zip(first.inputs, feed, strict=True)
        fed = tuple(TensorDesc(t.name, a.shape, a.dtype) for t, a in pairs)
        return fed, source, [t.name for t in first.outputs], runs


def _only_model(recipe: Recipe) -> str:
    names = [m.name for m in recipe.models]
    if len(names) > 1:
        raise ConfigError(f"{recipe.source}: models {', '.join(names)}: pick one with --model NAME")
    return names[0]


def _feed(
    model: ModelConfig, session: Session, inputs: str | Path | None, where: str
) -> tuple[list[np.ndarray], int, str]:
    """The arrays both sides run, their rows, and where they came from."""
    if inputs is None:
        feed, rows = check_feed(model, session, where)
        return feed, rows, str(model.reference) if model.reference else "random, seed 0"
    checked = attrs.evolve(model, reference=str(inputs))
    try:
        feed, rows = check_feed(checked, session, where)
    except ConfigError as e:
        raise InvalidInput(str(e).replace("key 'reference'", f"--inputs {inputs}")) from None
    return feed, rows, str(inputs)
