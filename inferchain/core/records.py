"""The records passed between the layers: what goes down (a Run) and what comes up.

Every record here is frozen. The ones made for every run of batches (`Slice`, `Run`,
`RunTiming`, `RunResult`) are named tuples: immutable, and built in a third of a frozen attrs
class's time. Times are `time.perf_counter()` seconds, like every stamp in inferchain.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

import attrs
import numpy as np

from inferchain.core.work import Work
from inferchain.shapes import ShapeKey

BatchKey = Hashable  # what the rows of one batch share: a ShapeKey (and unbatched values)
NO_STAGES: Mapping[str, float] = MappingProxyType({})  # shared by batches without a split
Outcome = tuple[np.ndarray, ...] | BaseException  # one batch's outputs, or its error


class Slice(NamedTuple):
    """Rows [start, stop) of one Work, placed at rows [offset, offset + stop - start) of
    a run."""

    work: Work
    start: int  # first row of the work
    stop: int  # one past the last row of the work
    offset: int  # first row of the run

    @property
    def rows(self) -> int:
        return self.stop - self.start


class Run(NamedTuple):
    """What the engine hands an executor: rows of one model and shape key on one stream of
    one worker, run as batches of `size` rows (the last one may be shorter), one after the
    other. A run of several batches is one slice of one Work; a batch that holds rows of
    several Works is a run of its own."""

    model: str
    worker: int  # index of the worker among the model's instances
    stream: int  # which of the worker's streams (0 <= stream < its num_streams)
    slices: tuple[Slice, ...]  # in run-row order
    rows: int  # rows in the run (sum of the slices' rows)
    size: int  # rows per batch (the model's max batch), >= rows in a run of one batch
    shape_key: ShapeKey  # item shape of each input, shared by every row
    dispatched: float  # when the engine handed it over

    @property
    def batches(self) -> int:
        return -(-self.rows // self.size)

    def head(self, rows: int) -> Run:
        """The run of its first `rows` rows (a whole number of batches)."""
        kept = tuple(
            s if s.offset + s.stop - s.start <= rows else s._replace(stop=s.start + rows - s.offset)
            for s in self.slices
            if s.offset < rows
        )
        return self._replace(slices=kept, rows=rows)

    def rest(self, rows: int) -> Run:
        """The run of its rows after the first `rows` (a whole number of batches)."""
        kept = tuple(
            Slice(s.work, s.start + max(0, rows - s.offset), s.stop, max(0, s.offset - rows))
            for s in self.slices
            if s.offset + s.stop - s.start > rows
        )
        return self._replace(slices=kept, rows=self.rows - rows)


class RunTiming(NamedTuple):
    """When one run's batches ran on which worker: what the metrics, the busy clock and
    the timeline take, once per run."""

    model: str
    worker: str  # e.g. "det#0"
    stream: int  # the worker's stream it ran on
    shape_key: ShapeKey  # item shape of each input
    rows: int  # rows in the run
    size: int  # rows per batch (the last one may be shorter)
    picked: float  # the executor took the run
    starts: Sequence[float]  # per batch: the backend was called (inputs in place)
    ends: Sequence[float]  # per batch: the backend returned the outputs
    end: float  # the result record was made
    failed: tuple[int, ...] = ()  # the batches that failed (by index)
    stages: tuple[Mapping[str, float], ...] = ()  # per batch, a backend's split (h2d, ...)
    steps: int = 0  # sequence steps run: rows that are steps, times the steps of a batch
    elements: int = 0  # input elements the model ran (batched inputs, padding included)
    padded: int = 0  # of which padding: rows up to a fixed batch, dims up to the shape key
    # when the device ran it (perf_counter seconds, one span per model run), where the
    # backend times its device (`Session.take_device_spans`); () = the worker's times stand
    device: tuple[tuple[float, float], ...] = ()

    def sizes(self) -> list[int]:
        """Rows of each batch."""
        n, size = self.rows, self.size
        full, last = divmod(n, size)
        return [size] * full + ([last] if last else [])

    @property
    def ok(self) -> bool:
        """Every batch ran."""
        return not self.failed


class BatchTiming(NamedTuple):
    """When one batch ran on which worker: a batch of a `RunTiming`, as the timeline's
    readers (traces, plots, `bench`) see it (`batch_timings`)."""

    model: str
    worker: str  # e.g. "det#0"
    size: int  # rows in the batch
    shape_key: ShapeKey  # item shape of each input
    ok: bool
    picked: float  # the worker took the batch (its run, or the batch before it ended)
    run_start: float  # the backend was called (inputs in place)
    run_end: float  # the backend returned the outputs
    end: float  # its run's result record was made (the last batch), or run_end
    stages: Mapping[str, float] = NO_STAGES  # backend split, e.g. h2d/compute/d2h
    stream: int = 0  # the worker's stream it ran on
    steps: int = 0  # sequence steps run (the run's, on its first batch)
    elements: int = 0  # input elements the model ran (the run's, on its first batch)
    padded: int = 0  # of which padding (the run's, on its first batch)
    device: tuple[tuple[float, float], ...] = ()  # the run's device spans, on its first batch


def batch_timings(t: RunTiming) -> list[BatchTiming]:
    """The batches of run `t`, one record each (built when the timeline is read)."""
    sizes = t.sizes()
    last = len(sizes) - 1
    out = []
    picked = t.picked
    for i, n in enumerate(sizes):
        first = i == 0
        out.append(
            BatchTiming(
                t.model, t.worker, n, t.shape_key, i not in t.failed, picked, t.starts[i],
                t.ends[i], t.end if i == last else t.ends[i],
                t.stages[i] if t.stages else NO_STAGES, t.stream,
                t.steps if first else 0, t.elements if first else 0,
                t.padded if first else 0, t.device if first else (),
            )
        )  # fmt: skip
        picked = t.ends[i]
    return out


class RunResult(NamedTuple):
    """What an executor gives back once a run has finished: each batch's outputs or
    error, and the timing."""

    run: Run
    outcomes: Sequence[Outcome]  # per batch: its rows of each output, or its error
    timing: RunTiming
    # the caller's thread was interrupted (e.g. KeyboardInterrupt) in an inline run: the
    # batches not yet run ended with an error; the engine re-raises it on that thread
    interrupt: BaseException | None = None
    recovering: bool = False  # the worker turned unhealthy with it: a WorkerChanged follows
    continues: bool = False  # the run's rest follows on the same stream, after the re-load

    def log_fields(self) -> dict[str, object]:
        """The fields of the one log line per run (the engine's, at info level)."""
        t = self.timing
        return {
            "model": t.model,
            "worker": t.worker,
            "stream": t.stream,
            "rows": t.rows,
            "batches": len(t.ends),
            "failed": list(t.failed),
            "shape": [list(s) for s in t.shape_key],
            "run_ms": round(sum(e - s for s, e in zip(t.starts, t.ends, strict=True)) * 1e3, 3),
            "wall_ms": round((t.end - t.picked) * 1e3, 3),
            "work_ids": sorted({s.work.id for s in self.run.slices}),
        }


def failed_run(run: Run, worker: str, error: BaseException, at: float) -> RunResult:
    """The result of a run none of whose batches ran (`worker`'s), each ended by `error`."""
    n = run.batches
    stamps = [at] * n
    timing = RunTiming(run.model, worker, run.stream, run.shape_key, run.rows, run.size, at,
                       stamps, stamps, at, tuple(range(n)))  # fmt: skip
    return RunResult(run, [error] * n, timing)


class WorkerChanged(NamedTuple):
    """A worker became healthy again, or died: the engine re-plans its dispatch."""

    model: str
    worker: int


@attrs.frozen(eq=False)
class Plan:
    """What `Scheduler.schedule()` decided in one step."""

    admitted: tuple[Work, ...]  # now READY, in priority order; the engine owns them
    expired: tuple[Work, ...]  # past their deadline: rows not yet running time out
    failed: tuple[tuple[Work, BaseException], ...]  # a dependency ended without outputs


EMPTY_PLAN = Plan((), (), ())
