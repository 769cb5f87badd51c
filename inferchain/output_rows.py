"""What a model really returns: its outputs hold a batch's rows where the recipe says.

A model's declared output shapes can be wrong (an exporter writes `[1, seqlen]` for an output
that is really `(seq, batch, classes)`), and cutting such an output by rows on the wrong
axis would hand one request another request's rows. So nothing a model declares is trusted:

- `check_rows` runs on every batch, on the worker, before any row reaches a request: each
  batched output must have the batch's rows (or the fixed batch the session padded to) on
  its batch axis, or the batch fails with `OutputMismatch`, naming the output, the axis,
  the rows found and expected, and the recipe key that fixes it;
- `probe` runs a model at `init()` at one or two batch sizes (two where its batch is
  dynamic) and `judge` compares each output's real shape with its declaration and its
  batch axis: a wrong batch axis is refused before any item runs; a declared dim that the
  real output contradicts is a warning. `inferchain info` shows both shapes side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs
import numpy as np

from inferchain.errors import OutputMismatch
from inferchain.layout import Axis, Layout
from inferchain.tensors import TensorDesc

if TYPE_CHECKING:
    from inferchain.backends.base import Session

Shape = tuple[int, ...]


def _fix(name: str, axis: int) -> str:
    return f"`outputs: {{{name}: {{batch_axis: {axis}}}}}`"


def _hint(name: str, shapes: Sequence[Shape], rows: Sequence[Sequence[int]]) -> str:
    """What to do: the axis whose size is the batch's rows in every shape, if one is."""
    if not shapes:
        return ""
    ndim = min(len(s) for s in shapes)
    axes = [
        k
        for k in range(ndim)
        if all(s[k] in allowed for s, allowed in zip(shapes, rows, strict=True))
    ]
    if len(axes) == 1:
        return f"; its rows look to be on axis {axes[0]}: set {_fix(name, axes[0])} in the recipe"
    return "; compare its declared and real shapes with `inferchain info` and set its batch_axis"


def check_rows(
    model: str,
    descs: Sequence[TensorDesc],
    axes: Sequence[int],
    outputs: Sequence[np.ndarray],
    rows: int,
    padded: int | None = None,
) -> None:
    """`OutputMismatch` unless each output (in the model's layout) has `rows` rows on its
    batch axis in `axes`, or `padded` (the fixed batch a session padded the batch to)."""
    for t, axis, out in zip(descs, axes, outputs, strict=True):
        shape = np.shape(out)
        found = shape[axis] if axis < len(shape) else None
        if found == rows or (padded is not None and found == padded):
            continue
        allowed = (rows,) if padded is None else (rows, padded)
        where = f"has {len(shape)} dims" if found is None else f"has {found} rows on"
        raise OutputMismatch(
            f"model {model!r}: output {t.name!r} {where} its batch axis {axis} (real shape "
            f"{shape}, declared {t.describe()}), expected {rows} rows for a batch of "
            f"{rows}{_hint(t.name, [shape], [allowed])}"
        )


@attrs.frozen
class OutputProbe:
    """A model's real output shapes, at the batch sizes it was run with at `init()`."""

    batch_sizes: tuple[int, ...]  # rows fed per run
    shapes: tuple[tuple[Shape, ...], ...]  # per run, per output (model order), its shape
    padded: int | None = None  # the fixed batch the session pads every batch to, if any

    def of(self, output: int) -> tuple[Shape, ...]:
        """Output `output`'s shape in each run."""
        return tuple(run[output] for run in self.shapes)


def zeros_feed(
    items: Sequence[tuple[int, ...]],
    dtypes: Sequence[np.dtype[np.generic]],
    axes: Sequence[Axis],
    rows: int,
) -> list[np.ndarray]:
    """Zeros for `rows` items of shapes `items` (rows-first item shapes) in the model's
    layout: the rows on each input's batch axis; an unbatched input its one value."""
    feed = []
    for shape, dtype, axis in zip(items, dtypes, axes, strict=True):
        if axis is None:
            feed.append(np.zeros(shape, dtype))
        else:
            feed.append(np.zeros((*shape[:axis], rows, *shape[axis:]), dtype))
    return feed


def probe(
    run: Callable[[list[np.ndarray], int], Sequence[np.ndarray]],
    feed: Callable[[int], list[np.ndarray]],
    sizes: Sequence[int],
    padded: int | None,
) -> OutputProbe:
    """Run the model once per batch size in `sizes` (`run(inputs, rows)`, `feed(rows)`)
    and note each output's shape."""
    shapes = tuple(tuple(np.shape(o) for o in run(feed(n), n)) for n in sizes)
    return OutputProbe(tuple(sizes), shapes, padded)


def probe_sizes(batch_rows: int, fixed: int | None) -> tuple[int, ...]:
    """The batch sizes to probe with: the max batch (the run a warm-up makes anyway), and
    one row too where the batch is dynamic, so that the batch axis is the dim that follows
    them; only the max batch where the session pads to a fixed batch."""
    if fixed is not None or batch_rows < 2:
        return (batch_rows,)
    return (batch_rows, 1)


@attrs.frozen
class Verdict:
    """What `judge` found: problems that must refuse the model, and warnings."""

    errors: tuple[str, ...]
    warnings: tuple[str, ...]


def judge(
    model: str, descs: Sequence[TensorDesc], axes: Sequence[int], seen: OutputProbe
) -> Verdict:
    """Compare each output's real shapes with its batch axis (errors) and with its declared
    shape (warnings)."""
    errors: list[str] = []
    warnings: list[str] = []
    allowed = [(n,) if seen.padded is None else (n, seen.padded) for n in seen.batch_sizes]
    for i, (t, axis) in enumerate(zip(descs, axes, strict=True)):
        shapes = seen.of(i)
        runs = ", ".join(f"{s} for {n} rows" for n, s in zip(seen.batch_sizes, shapes, strict=True))
        bad = [
            s for s, ok in zip(shapes, allowed, strict=True) if len(s) <= axis or s[axis] not in ok
        ]
        if bad:
            errors.append(
                f"model {model!r}: output {t.name!r} does not hold the batch's rows on its batch "
                f"axis {axis}: it returns {runs} (declared {t.describe()})"
                f"{_hint(t.name, shapes, allowed)}"
            )
            continue
        declared = _declared_mismatch(t, shapes[0], axis)
        if declared:
            warnings.append(
                f"model {model!r}: output {t.name!r} is declared {t.describe()} but returns "
                f"{runs} ({declared}); its batch axis {axis} holds the rows, so it is used as it "
                "really is"
            )
    return Verdict(tuple(errors), tuple(warnings))


def _declared_mismatch(t: TensorDesc, shape: Shape, axis: int) -> str:
    """How `shape` contradicts `t`'s declared shape ("" where it does not; a declaration
    without a rank says nothing; the batch axis holds the batch's rows, whatever it says)."""
    if not t.shape:
        return ""
    if len(t.shape) != len(shape):
        return f"{len(shape)} dims, not {len(t.shape)}"
    dims = [f"dim {k} is {s}, not {d}" for k, (d, s) in enumerate(zip(t.shape, shape, strict=True))
            if d is not None and d != s and k != axis]  # fmt: skip
    return "; ".join(dims)


def probe_session(
    model: str,
    session: Session,
    layout: Layout,
    batch_rows: int,
    key: Sequence[tuple[int, ...]],
    run: Callable[[list[np.ndarray], int], Sequence[np.ndarray]] | None = None,
    padded: int | None = None,
) -> tuple[OutputProbe, Verdict]:
    """Probe a loaded `session` with zeros of item shapes `key` and judge what it returns
    (`init()` on a worker's thread, `inferchain info` on its own); `run`: what runs it
    (default `session.run`); `padded`: the batch the session pads every batch to (default
    its fixed batch; a deterministic model's rows)."""
    dtypes = [t.dtype for t in session.inputs]
    fixed = session.max_batch_size if padded is None else padded
    seen = probe(
        run or session.run,
        lambda n: zeros_feed(key, dtypes, layout.inputs, n),
        probe_sizes(batch_rows, fixed),
        fixed,
    )
    return seen, judge(model, session.outputs, layout.outputs, seen)


def real_shapes(seen: OutputProbe | None, count: int) -> Mapping[int, str]:
    """Per output index, its real shapes as `inferchain info` prints them."""
    if seen is None:
        return {}
    return {
        i: "; ".join(f"{n}: {list(s)}" for n, s in zip(seen.batch_sizes, seen.of(i), strict=True))
        for i in range(count)
    }
