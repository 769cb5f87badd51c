"""The records passed between the layers: what goes down (a Batch) and what comes up.

Every record here is frozen. The ones made for every batch (`Slice`, `Batch`, `BatchTiming`,
`BatchResult`) are named tuples: immutable, and built in a third of a frozen attrs class's
time. Times are `time.perf_counter()` seconds, like every stamp in inferchain.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from types import MappingProxyType
from typing import NamedTuple

import attrs
import numpy as np

from inferchain.core.work import Work
from inferchain.shapes import ShapeKey

BatchKey = Hashable  # what the rows of one batch share: a ShapeKey (and unbatched values)
NO_STAGES: Mapping[str, float] = MappingProxyType({})  # shared by batches without a split


class Slice(NamedTuple):
    """Rows [start, stop) of one Work, placed at rows [offset, offset + stop - start) of
    a batch."""

    work: Work
    start: int  # first row of the work
    stop: int  # one past the last row of the work
    offset: int  # first row of the batch

    @property
    def rows(self) -> int:
        return self.stop - self.start


class Batch(NamedTuple):
    """What the engine hands one worker: rows of one model and shape key, on one stream."""

    model: str
    worker: int  # index of the worker among the model's instances
    stream: int  # which of the worker's streams (0 <= stream < its num_streams)
    slices: tuple[Slice, ...]  # in batch-row order
    rows: int  # rows in the batch (sum of the slices' rows)
    shape_key: ShapeKey  # item shape of each input, shared by every row
    dispatched: float  # when the engine handed it over

    @property
    def size(self) -> int:
        return self.rows


class BatchTiming(NamedTuple):
    """When one batch ran on which worker."""

    model: str
    worker: str  # e.g. "det#0"
    size: int  # rows in the batch
    shape_key: ShapeKey  # item shape of each input
    ok: bool
    picked: float  # the worker took the batch from its queue
    run_start: float  # the backend was called (inputs in place)
    run_end: float  # the backend returned the outputs
    end: float  # the result record was posted
    stages: Mapping[str, float] = NO_STAGES  # backend split, e.g. h2d/compute/d2h
    stream: int = 0  # the worker's stream it ran on
    steps: int = 0  # sequence steps run: rows that are steps, times the steps of a multi-step batch
    elements: int = 0  # input elements the model ran (batched inputs, padding included)
    padded: int = 0  # of which padding: rows up to a fixed batch, dims up to the shape key
    # when the device ran it (perf_counter seconds, one span per model run), where the
    # backend times its device (`Session.take_device_spans`); () = the worker's times stand
    device: tuple[tuple[float, float], ...] = ()


class BatchResult(NamedTuple):
    """What a worker posts when a batch has finished: outputs or the error, and timing."""

    batch: Batch
    outputs: tuple[np.ndarray, ...] | None  # `batch.rows` rows each (whole, if unbatched)
    error: BaseException | None  # set when the batch failed as a whole
    timing: BatchTiming
    recovering: bool = False  # the worker turned unhealthy with it: a WorkerChanged follows


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
