"""Anchored runs: which run of input positions the pipeline item being advanced belongs to.

A model with `batching: fill` may give a row outputs that depend on what shares its batch
(padding to the longest row). `PipelineDriver` with an `anchor` sets `current_run` while it
advances an item's generator (on its own thread), `OfflineInference` stamps the Works of fill
models with it, and the batcher never mixes two runs in a batch: a run's batch leaves full,
or once a later run of the same driver has rows there, or on a flush. So batches are a
function of input positions, not of timing or of what a resumed job has left to do.
"""

from __future__ import annotations

import contextvars
import itertools

Run = tuple[int, int]  # (the driver's number, the run's index: input position // anchor)

current_run: contextvars.ContextVar[Run | None] = contextvars.ContextVar(
    "inferchain_current_run", default=None
)
_drivers = itertools.count(1)


def new_driver() -> int:
    """A number for one driver's runs, unique in this process (runs of two drivers never
    order each other)."""
    return next(_drivers)
