"""Precision comparison of two models on the same inputs: a converted model against its original.

A converted model (an fp16 export, an `.om` from ATC, a re-exported graph) runs beside its
original on the same inputs (`inferchain.tools.feeds`: random within the first model's input
description, or arrays from an `.npz` file), and every output is compared by position (names
may differ, e.g. ATC's "op:edge:name"). Model A is the reference: an element of B is within
tolerance when ``|B - A| <= atol + rtol * |A|`` (`np.isclose(B, A, rtol, atol)`).

Each model is loaded through the real backends (`make_backend`), run once and released, all
on the calling thread, as pyACL wants for a context.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import attrs
import numpy as np

from inferchain.backends.base import Backend
from inferchain.backends.factory import make_backend
from inferchain.config import PKG, Recipe, ToleranceConfig, load_recipe, package_file
from inferchain.errors import ConfigError, InvalidInput
from inferchain.precision import OutputDiff, cosine, diff_output
from inferchain.tensors import TensorDesc
from inferchain.tools.feeds import by_name, fit_inputs, load_inputs, random_inputs
from inferchain.tools.table import render

DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-5
BACKENDS = ("onnxruntime", "openvino", "acl")
_SUFFIX_BACKENDS = {".om": "acl"}  # anything else: onnxruntime
_RECIPE_SUFFIXES = (".yaml", ".yml")

Inputs = str | Path | Mapping[str, np.ndarray] | None

__all__ = ["BACKENDS", "CompareReport", "OutputDiff", "compare_models", "cosine", "diff_output"]


@attrs.frozen
class CompareReport:
    """The result of `compare_models`: what ran, on what, and one `OutputDiff` per output."""

    model_a: str  # path
    backend_a: str
    model_b: str
    backend_b: str
    inputs: tuple[TensorDesc, ...]  # what both models were fed (concrete shapes, A's dtypes)
    source: str  # "random, seed N" or the .npz path
    rtol: float
    atol: float
    outputs: tuple[OutputDiff, ...]
    # the measures checked, where more than rtol/atol (`inferchain compare --precision`)
    tolerance: ToleranceConfig | None = None

    @property
    def passed(self) -> bool:
        """True when every output is within tolerance (every measure given holds)."""
        return all(d.passed for d in self.outputs)

    def format(self) -> str:
        """The report as printed by `inferchain compare`: a header, a table, a verdict."""
        feed = ", ".join(t.describe() for t in self.inputs)
        top_k = self.tolerance.top_k if self.tolerance is not None else None
        rows = [_row(d, top_k is not None) for d in self.outputs]
        headers = ["#", "output A", "output B", "shape", "max abs", "max rel", "cosine"]
        if top_k is not None:
            headers.append(f"top-{top_k} agree")
        failed = sum(not d.passed for d in self.outputs)
        verdict = (
            f"PASS: all {len(self.outputs)} outputs within tolerance"
            if not failed
            else f"FAIL: {failed} of {len(self.outputs)} outputs beyond tolerance"
        )
        return "\n".join(
            [
                f"A: {self.model_a} ({self.backend_a})",
                f"B: {self.model_b} ({self.backend_b})",
                f"inputs: {feed} ({self.source})",
                f"tolerance: {self._measures()}",
                "",
                render([*headers, "beyond tol", "result"], rows),
                verdict,
            ]
        )

    def _measures(self) -> str:
        elementwise = f"|B - A| <= atol + rtol * |A|, rtol {self.rtol:g}, atol {self.atol:g}"
        t = self.tolerance
        if t is None:
            return elementwise
        parts = [elementwise] if t.elementwise else []
        if t.cosine is not None:
            parts.append(f"cosine >= {t.cosine:g}")
        if t.top_k is not None:
            parts.append(f"top-{t.top_k} classes the same on >= {t.agreement:.0%} of rows")
        return "; ".join(parts) or "none (every output passes)"


def _row(d: OutputDiff, top_k: bool = False) -> list[object]:
    shape = "[" + ", ".join(map(str, d.shape)) + "]"
    agree = ["-" if d.agreement is None else f"{d.agreement:.1%}"] if top_k else []
    return [
        d.index,
        d.name_a,
        d.name_b,
        shape,
        f"{d.max_abs:.2e}",
        f"{d.max_rel:.2e}",
        f"{d.cosine:.6f}",
        *agree,
        f"{d.mismatched}/{d.size}" if d.tolerance.elementwise else "-",
        "ok" if d.passed else "FAIL",
    ]


# -- the comparison ---------------------------------------------------------------------------


def compare_models(
    a: str | Path,
    b: str | Path,
    inputs: Inputs = None,
    *,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    backend_a: str | None = None,
    backend_b: str | None = None,
    batch: int | None = None,
    seed: int = 0,
    device: int = 0,
    acl_module: object | None = None,
    model: str | None = None,
) -> CompareReport:
    """Run models `a` and `b` on the same inputs and compare their outputs by position.

    `inputs`: None for random inputs (`random_inputs(..., batch, seed)` from A's input
    description), an `.npz` path or a mapping of arrays by A's input names (with the batch
    dim). `backend_*`: "onnxruntime" or "acl"; None picks by suffix (`.om` -> acl).
    `a` and `b` are model files, or recipes with `model` naming the model to compare.
    `acl_module` stands in for pyACL (e.g. `inferchain.testing.fake_acl.FakeAcl()`).
    Raises ConfigError for bad arguments, InvalidInput when the inputs or outputs do not fit.
    """
    if rtol < 0 or atol < 0:
        raise ConfigError(f"tolerances must be >= 0, got rtol {rtol}, atol {atol}")
    if batch is not None and batch < 1:
        raise ConfigError(f"batch must be >= 1, got {batch}")
    recipes = [_recipe(p, name, device, model) for p, name in ((a, backend_a), (b, backend_b))]
    with contextlib.ExitStack() as stack:
        # both runtimes up front, so an acl model on each side shares one acl.init
        backends = [stack.enter_context(_opened(r, acl_module)) for r in recipes]
        run_a = _run(backends[0], recipes[0], lambda descs: _first_feed(descs, inputs, batch, seed))
        run_b = _run(backends[1], recipes[1], lambda descs: fit_inputs(descs, run_a.feed, "B"))
    source = f"random, seed {seed}" if inputs is None else _source(inputs)
    return CompareReport(
        str(recipes[0].models[0].path),
        recipes[0].backend,
        str(recipes[1].models[0].path),
        recipes[1].backend,
        run_a.fed(),
        source,
        rtol,
        atol,
        _diffs(run_a, run_b, rtol, atol),
    )


def _diffs(run_a: _Run, run_b: _Run, rtol: float, atol: float) -> tuple[OutputDiff, ...]:
    if len(run_a.outputs) != len(run_b.outputs):
        raise InvalidInput(
            f"model A has {len(run_a.outputs)} outputs, model B {len(run_b.outputs)}: "
            "outputs are compared by position"
        )
    pairs = zip(run_a.names, run_b.names, run_a.outputs, run_b.outputs, strict=True)
    return tuple(
        diff_output(i, na, nb, oa, ob, rtol=rtol, atol=atol)
        for i, (na, nb, oa, ob) in enumerate(pairs)
    )


def _source(inputs: Inputs) -> str:
    return str(inputs) if isinstance(inputs, str | Path) else "given arrays"


def _recipe(target: str | Path, backend: str | None, device: int, model: str | None) -> Recipe:
    """A one-model recipe for a model file, or for one model of a recipe (its backend unless
    `backend` says otherwise); `max_batch_size` 1 only turns batching on (sessions take any
    batch the loaded model accepts)."""
    if backend is not None and backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    path, recipe_backend = model_of(target, model)
    name = backend or recipe_backend or _SUFFIX_BACKENDS.get(path.suffix.lower(), "onnxruntime")
    entry = {"name": path.stem or "model", "path": str(path.resolve()), "max_batch_size": 1}
    data = {"name": "compare", "backend": name, "device": device, "models": [entry]}
    return Recipe.from_dict(data, "", path)


def model_of(target: str | Path, model: str | None = None) -> tuple[Path, str | None]:
    """The model file `target` names (a path or pkg://), or the model `model` of the recipe
    `target` names (a folder or YAML file; `model` may be left out when it has one model),
    with that recipe's backend."""
    text = str(target)
    path = package_file(text, text) if text.startswith(PKG) else Path(target)
    if path.is_file() and path.suffix.lower() not in _RECIPE_SUFFIXES:
        return path, None
    if not path.exists():
        raise ConfigError(f"{text}: not found; compare takes model files or recipe folders")
    recipe = load_recipe(target)
    names = [m.name for m in recipe.models]
    if model is None and len(names) > 1:
        raise ConfigError(
            f"{text}: a recipe with models {', '.join(names)}: pick one with --model NAME"
        )
    return Path(recipe.model(model or names[0]).path), recipe.backend


@contextlib.contextmanager
def _opened(recipe: Recipe, acl_module: object | None) -> Iterator[Backend]:
    backend = make_backend(recipe, acl_module=acl_module)
    try:
        yield backend
    finally:
        backend.close()


@attrs.frozen
class _Run:
    """One model's run: the inputs it was fed and its outputs (host copies)."""

    descs: tuple[TensorDesc, ...]
    feed: list[np.ndarray]
    names: list[str]
    outputs: list[np.ndarray]

    def fed(self) -> tuple[TensorDesc, ...]:
        """The inputs as fed: concrete shapes, the model's dtypes."""
        return tuple(
            TensorDesc(t.name, a.shape, a.dtype) for t, a in zip(self.descs, self.feed, strict=True)
        )


def _run(
    backend: Backend,
    recipe: Recipe,
    feed_for: Callable[[Sequence[TensorDesc]], list[np.ndarray]],
) -> _Run:
    """Load, run once and close the recipe's model on this thread."""
    session = backend.load(recipe.models[0], recipe.device)
    try:
        feed = feed_for(session.inputs)
        rows = int(feed[0].shape[0]) if feed and feed[0].ndim else 1
        outputs = session.run(feed, rows)
        padded = session.max_batch_size if (session.max_batch_size or 0) > rows else None
        kept = [
            np.array(o[:rows] if padded and o.ndim and o.shape[0] == padded else o, copy=True)
            for o in outputs
        ]
        return _Run(session.inputs, feed, [t.name for t in session.outputs], kept)
    finally:
        session.close()


# -- inputs ------------------------------------------------------------------------------------


def _first_feed(
    descs: Sequence[TensorDesc], inputs: Inputs, batch: int | None, seed: int
) -> list[np.ndarray]:
    if inputs is None:
        return random_inputs(descs, batch=batch, seed=seed)
    if isinstance(inputs, str | Path):
        arrays = load_inputs(inputs, descs)
    else:
        arrays = by_name(inputs, descs)
    return fit_inputs(descs, arrays, "A")
