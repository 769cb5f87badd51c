"""Batch invariance: does a model give an item the same outputs whatever shares its batch?

`inferchain compare --batch-invariance RECIPE` records what the recipe's pipeline gives each
model over the recipe's own inputs: the items submitted to a stateless model
(`capture_items`), and the rows of the step batches a stateful model runs, its carried
state among their inputs (`inferchain.tools.batch_rows`). It then runs them again through
the model in batches of exactly 1, a middle size and the maximum, in input order, and at
the maximum in a shuffled order (`check_invariance`); a step row runs as an item of the
model without `state:` (a step is a function of its inputs). Batches of one are the
reference.

Only real items' rows are compared, each on its own part where a batch is padded to its
longest row (the part of the shape both have): padded rows and padded positions are never
counted. A model whose inputs say how they are padded (`inputs: {NAME: {pad: ...}}`, e.g. a
mask) is run padded to each batch's longest row, as a pipeline that pads its rows (a
stepper) would. A model is invariant when every element is within
`|x - ref| <= atol + rtol * |ref|` (default 0 and 0: bit-identical, what a resume promises).
With `strict` the models run as `deterministic: true` makes them.

The step rows of a model whose steps never share a batch with rows of another shape (every
`Stepper` of it groups its sequences, `Stepper.group`, so that a step batch is of one
shape: `apart`) run only in batches of one shape, as they do in the job: rows of another
width are never padded to each other there, so the check does not pad them either.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from inferchain.config import ModelConfig, deterministic, load_recipe
from inferchain.errors import ConfigError
from inferchain.offline import OfflineInference
from inferchain.sequence import groups_sequences
from inferchain.tools.table import render

Outputs = Mapping[str, np.ndarray]


@attrs.frozen
class RunDiff:
    """One output of one model, run one way (e.g. `batch 64`, `shuffled, batch 256`),
    against batches of one."""

    model: str
    output: str
    run: str  # how the batches were made
    max_abs: float  # the largest |x - ref| over every item's elements (inf: shapes differ)
    identical: float  # share of items whose output is bit-identical to the reference
    mismatched: int  # items with an element beyond tolerance
    items: int

    @property
    def passed(self) -> bool:
        return self.mismatched == 0


@attrs.frozen
class InvarianceReport:
    """What `check_invariance` found: a `RunDiff` per model, output and run."""

    recipe: str
    rtol: float
    atol: float
    diffs: tuple[RunDiff, ...]
    apart: tuple[str, ...] = ()  # models whose rows ran in batches of one shape each
    claimed: tuple[str, ...] = ()  # models the recipe says are `batch_invariant`

    @property
    def passed(self) -> bool:
        return all(d.passed for d in self.diffs)

    def invariant(self, model: str) -> bool:
        return all(d.passed for d in self.diffs if d.model == model)

    def format(self) -> str:
        """A table, then one verdict line per model."""
        rows = [
            [
                d.model,
                d.output,
                d.run,
                f"{d.max_abs:.2e}",
                f"{d.identical:.1%}",
                f"{d.mismatched}/{d.items}",
                "ok" if d.passed else "FAIL",
            ]
            for d in self.diffs
        ]
        headers = ["model", "output", "batches", "max abs", "bit-identical", "beyond tol"]
        verdicts = [self.verdict(m) for m in dict.fromkeys(d.model for d in self.diffs)]
        return "\n".join(
            [
                f"recipe: {self.recipe}; reference: batches of 1",
                f"tolerance: |x - ref| <= atol + rtol * |ref|, rtol {self.rtol:g}, "
                f"atol {self.atol:g}",
                "",
                render([*headers, "result"], rows),
                *(
                    f"{m}: step rows in batches of one shape each, as its steppers group "
                    "them (Stepper.group)"
                    for m in self.apart
                ),
                *verdicts,
            ]
        )

    def verdict(self, model: str) -> str:
        """One line: whether `model` is invariant; where not, its largest difference."""
        if self.invariant(model):
            return f"{model}: batch-invariant within tolerance"
        worst = max((d for d in self.diffs if d.model == model), key=lambda d: d.max_abs)
        claim = "; the recipe's `batch_invariant: true` is false" if model in self.claimed else ""
        return (
            f"{model}: NOT batch-invariant (outputs depend on what shares the batch): largest "
            f"difference {worst.max_abs:.3g} ({worst.output}, {worst.run}){claim}"
        )


@contextlib.contextmanager
def capture_items(oi: OfflineInference) -> Iterator[dict[str, list[Any]]]:
    """While in the block, every item submitted through `oi.submit_many` (and so through
    `oi.submit` and a pipeline's `self.submit`) is also kept, by model: model -> items in
    submission order."""
    kept: dict[str, list[Any]] = {}
    submit_many = oi.submit_many

    def recording(model: str, items: Any, **options: Any) -> Any:
        given = list(items)  # an array's rows are its items
        requests = submit_many(model, given, **options)
        kept.setdefault(model, []).extend(given)
        return requests

    oi.submit_many = recording  # type: ignore[method-assign]
    try:
        yield kept
    finally:
        del oi.submit_many  # the class's method again


@contextlib.contextmanager
def capture_steppers(oi: OfflineInference) -> Iterator[dict[str, list[Any]]]:
    """While in the block, every `Stepper` that `oi.run_sequence` is given is also kept,
    by model: model -> its steppers, each once."""
    kept: dict[str, list[Any]] = {}
    run_sequence = oi.run_sequence

    def recording(model: str, stepper: Any, item: Any, **options: Any) -> Any:
        steppers = kept.setdefault(model, [])
        if all(s is not stepper for s in steppers):
            steppers.append(stepper)
        return run_sequence(model, stepper, item, **options)

    oi.run_sequence = recording  # type: ignore[method-assign]
    try:
        yield kept
    finally:
        del oi.run_sequence  # the class's method again


def kept_apart(steppers: Mapping[str, Sequence[Any]]) -> list[str]:
    """The models whose every stepper groups its sequences (`Stepper.group`): their step
    batches are each of one group, one shape where the group is the shape."""
    return [m for m, given in steppers.items() if given and all(map(groups_sequences, given))]


def check_invariance(
    recipe: str | Path,
    items: Mapping[str, Sequence[Any]],
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    seed: int = 0,
    strict: bool = False,
    apart: Collection[str] = (),
) -> InvarianceReport:
    """Run each model's `items` in batches of 1, a middle size and the maximum, and at the
    maximum shuffled, and compare every run with the batches of 1 (`strict`: every model
    `deterministic`; `apart`: the models whose rows batch only with rows of their shape)."""
    base = load_recipe(recipe)
    overrides = {name: _checked(base.model(name)) for name in items}
    check = load_recipe(recipe, models=overrides, pipeline=None)
    if strict:
        check = deterministic(check)
    diffs: list[RunDiff] = []
    with OfflineInference(check) as oi:
        for name, given in items.items():
            rows = list(given)
            if rows:
                largest = check.model(name).batch_rows
                run = functools.partial(_run_apart if name in apart else _run, oi, name)
                diffs += _runs(run, name, rows, largest, rtol, atol, seed)
    shown = tuple(m for m in items if m in apart)
    claimed = tuple(m for m in items if base.model(m).batch_invariant)
    return InvarianceReport(str(recipe), rtol, atol, tuple(diffs), shown, claimed)


def _checked(model: ModelConfig) -> dict[str, Any]:
    """How the check runs `model`: fill batching (a batch is exactly the rows submitted
    together, sent by a flush), no warm-up; a stateful model without its state (its step
    rows are items); padded to each batch's longest row where its inputs say how."""
    if not model.max_batch_size:
        raise ConfigError(
            f"model {model.name!r}: batch invariance is checked for models that batch "
            "(max_batch_size >= 1)"
        )
    override: dict[str, Any] = {"batching": "fill", "warmup": False}
    if model.state:  # a carried output keeps its rows where its input has them
        axes = {out: model.inputs.get(i) for out, i in model.state.items()}
        outputs = {o: {"batch_axis": c.batch_axis} for o, c in axes.items() if c is not None}
        override |= {"state": {}, "constant": [], "outputs": outputs}
    padded = any(c.pad is not None for c in model.inputs.values())
    if padded and model.shapes.strategy == "dynamic":
        override["shapes"] = {**_shapes(model), "strategy": "longest"}
    return override


def _shapes(model: ModelConfig) -> dict[str, Any]:
    """The model's `shapes:` as recipe keys."""
    shapes = attrs.asdict(model.shapes)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in shapes.items()}


Runner = Callable[[Sequence[Any], int], list[Outputs]]  # rows, batch size -> their outputs


def _runs(
    run: Runner,
    name: str,
    rows: list[Any],
    largest: int,
    rtol: float,
    atol: float,
    seed: int,
) -> list[RunDiff]:
    """`rows` of model `name` at each batch size and shuffled, against batches of one."""
    reference = run(rows, 1)
    runs = {f"batch {b}": run(rows, b) for b in _sizes(largest)[1:]}
    order = np.random.default_rng(seed).permutation(len(rows))
    shuffled = run([rows[i] for i in order], largest)
    runs[f"shuffled, batch {largest}"] = [shuffled[j] for j in np.argsort(order)]
    return [
        _diff(name, output, run, reference, outputs, rtol, atol)
        for run, outputs in runs.items()
        for output in reference[0]
    ]


def _sizes(largest: int) -> list[int]:
    return sorted({1, max(1, largest // 2), largest})


def _run(oi: OfflineInference, model: str, rows: Sequence[Any], size: int) -> list[Outputs]:
    """Each row's outputs, from batches of exactly `size` consecutive rows (the last one
    shorter), each sent at once."""
    outputs: list[Outputs] = []
    for start in range(0, len(rows), size):
        requests = oi.submit_many(model, rows[start : start + size])
        oi.flush(steps=False, batches=True)
        outputs.extend({k: np.array(v) for k, v in r.result().items()} for r in requests)
    return outputs


def _run_apart(oi: OfflineInference, model: str, rows: Sequence[Any], size: int) -> list[Outputs]:
    """`_run` over the rows of each shape on their own (their order kept): no batch holds
    rows of two shapes."""
    by_shape: dict[tuple[Any, ...], list[int]] = {}
    for j, row in enumerate(rows):
        by_shape.setdefault(_shape_of(row), []).append(j)
    outputs: dict[int, Outputs] = {}
    for positions in by_shape.values():
        ran = _run(oi, model, [rows[j] for j in positions], size)
        outputs.update(zip(positions, ran, strict=True))
    return [outputs[j] for j in range(len(rows))]


def _shape_of(row: Any) -> tuple[Any, ...]:
    """The shapes of a row's inputs (by name where it is a mapping)."""
    if isinstance(row, Mapping):
        return tuple((name, np.shape(v)) for name, v in row.items())
    if isinstance(row, list | tuple):
        return tuple(np.shape(v) for v in row)
    return (np.shape(row),)


def _diff(
    model: str,
    output: str,
    run: str,
    reference: Sequence[Outputs],
    outputs: Sequence[Outputs],
    rtol: float,
    atol: float,
) -> RunDiff:
    worst = 0.0
    identical = mismatched = 0
    for ref_row, row in zip(reference, outputs, strict=True):
        ref, got = _same_part(ref_row[output], row[output])
        if ref.shape != got.shape:
            worst, mismatched = float("inf"), mismatched + 1
            continue
        if ref.tobytes() == got.tobytes():
            identical += 1
            continue
        if np.issubdtype(ref.dtype, np.number):
            delta = np.abs(got.astype(np.float64) - ref.astype(np.float64))
            worst = max(worst, float(np.nanmax(delta)) if delta.size else 0.0)
            close = np.isclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)
        else:
            close = np.asarray(got == ref)
        mismatched += int(not close.all())
    share = identical / len(reference) if reference else 1.0
    return RunDiff(model, output, run, worst, share, mismatched, len(reference))


def _same_part(ref: np.ndarray, got: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both outputs cut to the shape they share (a padded batch's output is its envelope:
    the item's own part comes first on every axis)."""
    if ref.shape == got.shape or ref.ndim != got.ndim:
        return ref, got
    part = tuple(slice(0, min(a, b)) for a, b in zip(ref.shape, got.shape, strict=True))
    return ref[part], got[part]


def items_of(results: Iterable[Any]) -> int:
    """Drain a pipeline's results (while `capture_items` records); how many there were."""
    return sum(1 for _ in results)
