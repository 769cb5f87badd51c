"""Precision as a checked choice: how far one run of a model is from another, and the refusal
of a lower `precision:` whose outputs move beyond the recipe's `tolerance:`.

The measures are those `inferchain compare` reports (max abs and rel error, cosine similarity,
elements beyond ``|B - A| <= atol + rtol * |A|``, and for classifiers the share of rows whose
top-k classes agree); `check_precision` applies them to a model's outputs at f32 and at the
precision its recipe asks for, on the model's `reference:` inputs or seeded random ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from inferchain.backends.base import Session
from inferchain.config import ModelConfig, ToleranceConfig
from inferchain.errors import ConfigError, InvalidInput
from inferchain.layout import Layout
from inferchain.tensors import TensorDesc
from inferchain.tools.feeds import DYNAMIC_DIM, fit_inputs, load_inputs, random_array

SEED = 0  # of the random check inputs of a model without `reference:`


@attrs.frozen
class OutputDiff:
    """How output `index` of run B differs from the same output of run A (the reference)."""

    index: int  # position in the models' output lists
    name_a: str
    name_b: str
    shape: tuple[int, ...]
    max_abs: float  # max |B - A|; inf when a NaN/inf is in one output only
    max_rel: float  # max |B - A| / |A| over elements where A != 0; inf as max_abs
    cosine: float  # cosine similarity of the flattened outputs; 1.0 = same direction
    mismatched: int  # elements beyond tolerance (NaN against NaN counts as equal)
    size: int  # elements in the output
    agreement: float | None = None  # share of rows with the same top-k classes (top_k given)
    tolerance: ToleranceConfig = attrs.field(factory=ToleranceConfig)  # what was checked

    @property
    def passed(self) -> bool:
        """Every measure the tolerance gives holds."""
        return not self.failures()

    def failures(self) -> list[str]:
        """Why the output is beyond the tolerance, one phrase per measure that fails."""
        t, out = self.tolerance, []
        if t.elementwise and self.mismatched:
            out.append(
                f"max abs {self.max_abs:.3g} (max rel {self.max_rel:.3g}): "
                f"{self.mismatched}/{self.size} elements beyond atol {t.atol or 0:g} + "
                f"rtol {t.rtol or 0:g} * |f32|"
            )
        if t.cosine is not None and self.cosine < t.cosine:
            out.append(f"cosine {self.cosine:.6f} below {t.cosine:g}")
        if self.agreement is not None and self.agreement < t.agreement:
            out.append(
                f"top-{t.top_k} classes the same on {self.agreement:.1%} of rows, "
                f"below {t.agreement:.1%}"
            )
        return out


def tolerance_of(rtol: float, atol: float, **more: float | int | None) -> ToleranceConfig:
    """An elementwise tolerance (compare's `--rtol/--atol`) with optional other measures."""
    return ToleranceConfig(rtol=rtol, atol=atol, **more)  # type: ignore[arg-type]


def diff_output(
    index: int,
    name_a: str,
    name_b: str,
    a: np.ndarray,
    b: np.ndarray,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    tolerance: ToleranceConfig | None = None,
) -> OutputDiff:
    """Compare one output of B against the same output of A (the reference), within
    `tolerance` (or an elementwise one of `rtol`/`atol`)."""
    if tolerance is None:
        tolerance = ToleranceConfig(rtol=rtol or 0.0, atol=atol or 0.0)
    if a.shape != b.shape:
        raise InvalidInput(
            f"output {index} ({name_a} / {name_b}): shape {a.shape} in A, {b.shape} in B"
        )
    for which, arr in (("A", a), ("B", b)):
        if arr.dtype.kind not in "biuf":
            raise InvalidInput(f"output {index} of {which} has dtype {arr.dtype}: not numeric")
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    close = np.isclose(y, x, rtol=tolerance.rtol or 0.0, atol=tolerance.atol or 0.0, equal_nan=True)
    finite = np.isfinite(x) & np.isfinite(y)
    xf, err = x[finite], np.abs(y[finite] - x[finite])
    nonzero = xf != 0
    if np.any(~finite & ~close):
        max_abs = max_rel = float("inf")
    else:
        max_abs = float(err.max()) if err.size else 0.0
        max_rel = float((err[nonzero] / np.abs(xf[nonzero])).max()) if nonzero.any() else 0.0
    return OutputDiff(
        index,
        name_a,
        name_b,
        tuple(a.shape),
        max_abs,
        max_rel,
        cosine(xf, y[finite]),
        int(np.count_nonzero(~close)),
        int(a.size),
        top_k_agreement(a, b, tolerance.top_k),
        tolerance,
    )


def cosine(x: np.ndarray, y: np.ndarray) -> float:
    """Cosine similarity of two flat arrays: exactly 1.0 when they are equal (both zero
    included), 0.0 when one of them is zero."""
    if np.array_equal(x, y):
        return 1.0
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 or ny == 0.0:
        return 0.0
    return float(np.clip(np.dot(x, y) / (nx * ny), -1.0, 1.0))


def top_k_agreement(a: np.ndarray, b: np.ndarray, k: int | None) -> float | None:
    """The share of rows (every position but the last axis, the classes) whose `k` best
    classes are the same, in the same order, in `a` and `b`; None without `k`, or for an
    output of fewer than 2 dims (not scores per class)."""
    if k is None or a.ndim < 2 or a.shape[-1] == 0:
        return None
    k = min(k, a.shape[-1])
    best_a = np.argsort(-a, axis=-1, kind="stable")[..., :k]
    best_b = np.argsort(-b, axis=-1, kind="stable")[..., :k]
    same = np.all(best_a == best_b, axis=-1)
    return float(same.mean()) if same.size else 1.0


# -- the check at init() -----------------------------------------------------------------------


def check_feed(model: ModelConfig, session: Session, where: str) -> tuple[list[np.ndarray], int]:
    """The inputs a lower precision is checked on, and their rows: the model's `reference:`
    arrays, or seeded random values (as `inferchain compare` makes them) for a batch of
    `batch_rows` rows on each input's batch axis (other dynamic dims `DYNAMIC_DIM`)."""
    layout = Layout.of(model, session.inputs, session.outputs)
    if model.reference is not None:
        try:
            feed = fit_inputs(session.inputs, load_inputs(model.reference, session.inputs), "A")
        except (ConfigError, InvalidInput) as e:
            raise ConfigError(f"{where}: key 'reference': {e}") from None
        batched = [(a, ax) for a, ax in zip(feed, layout.inputs, strict=True) if ax is not None]
        rows = int(batched[0][0].shape[batched[0][1]]) if batched else 0
        return feed, rows
    rng = np.random.default_rng(SEED)
    limit = session.max_batch_size
    rows = model.batch_rows if limit is None else min(model.batch_rows, limit)
    feed = []
    for t, axis in zip(session.inputs, layout.inputs, strict=True):
        shape = [(1 if axis is None else DYNAMIC_DIM) if d is None else d for d in t.shape]
        if axis is not None:
            shape[axis] = rows
        feed.append(random_array(tuple(shape), t.dtype, rng, t.name))
    return feed, rows if model.max_batch_size > 0 else 0


def run_rows(
    session: Session, model: ModelConfig, feed: Sequence[np.ndarray], rows: int
) -> list[np.ndarray]:
    """`session`'s outputs for `rows` rows of `feed`, run in batches the session takes
    (padded rows dropped), joined on each output's batch axis; a model that does not
    batch (`rows` 0) runs once."""
    layout = Layout.of(model, session.inputs, session.outputs)
    if rows == 0:
        return [np.array(o, copy=True) for o in session.run(list(feed), 0)]
    limit = session.max_batch_size or rows
    step = max(1, min(limit, model.batch_rows, rows))
    parts: list[list[np.ndarray]] = []
    for start in range(0, rows, step):
        n = min(step, rows - start)
        chunk = [
            a if ax is None else np.take(a, range(start, start + n), axis=ax)
            for a, ax in zip(feed, layout.inputs, strict=True)
        ]
        outs = session.run(chunk, n)
        parts.append(
            [np.take(o, range(n), axis=ax) for o, ax in zip(outs, layout.outputs, strict=True)]
        )
    columns = zip(*parts, strict=True)
    return [np.concatenate(col, axis=ax) for col, ax in zip(columns, layout.outputs, strict=True)]


def check_precision(
    model: ModelConfig, names: Sequence[str], f32: Sequence[np.ndarray],
    low: Sequence[np.ndarray], where: str,
) -> tuple[OutputDiff, ...]:  # fmt: skip
    """Each output at the model's `precision` (`low`) against f32, within its `tolerance`;
    a ConfigError naming the first output beyond it, the largest difference and the
    tolerance (`where`: the recipe file and model)."""
    diffs = tuple(
        diff_output(i, n, n, a, b, tolerance=model.tolerance)
        for i, (n, a, b) in enumerate(zip(names, f32, low, strict=True))
    )
    for d in diffs:
        if not d.passed:
            inputs = f"reference {model.reference}" if model.reference else "random inputs"
            raise ConfigError(
                f"{where}: precision {model.precision} moves output {d.name_a!r} beyond the "
                f"tolerance on {inputs}: {'; '.join(d.failures())} (widen `tolerance:`, give "
                "`reference:` inputs, or keep precision: f32)"
            )
    return diffs


def declared_precision(model: ModelConfig, tensors: Sequence[TensorDesc]) -> str | None:
    """Why a compiled model's declared data types (an `.om`'s inputs and outputs) do not
    fit the precision its recipe states, or None: float16 tensors need `precision: f16`
    (an `.om` is often fp16 throughout). A model declaring only float32 fits any precision:
    ATC keeps f32 at the edges of an fp16 model, which its description cannot tell."""
    half = [t.name for t in tensors if t.dtype == np.float16]
    if not half or model.precision == "f16":
        return None
    more = f" and {len(half) - 1} more" if len(half) > 1 else ""
    return (
        f"model {model.name!r} declares float16 for {half[0]!r}{more}, but its precision is "
        f"{model.precision}: say `precision: f16` (and compare the model with its original: "
        "`inferchain compare`), or convert it for f32 (ATC --precision_mode=force_fp32)"
    )
