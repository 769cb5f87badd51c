"""Builders of the core's records for tests that drive its layers without threads.

The batcher, the Scheduler and the engine's step are tested through these (`create_engine`
builds the engine as `OfflineInference` does, on fake workers), as vLLM tests its scheduler
through `create_scheduler` / `create_requests`: one place builds a Work the way
`OfflineInference` does (ids, per-item Requests tied to their rows), so the tests of every
layer see the same records.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from inferchain.config import ModelConfig, SchedulerConfig
from inferchain.core.batcher import ModelBatcher
from inferchain.core.engine import ExecutionEngine
from inferchain.core.inbox import Inbox
from inferchain.core.request import Request, RequestState
from inferchain.core.scheduler import Scheduler
from inferchain.core.sequences import Sequences, StatefulModel
from inferchain.core.work import Work
from inferchain.core.workers import WorkerSet
from inferchain.metrics import Metrics
from inferchain.shapes import ShapeKey, ShapePolicy
from inferchain.tensors import TensorDesc

S = RequestState


def create_model(
    name: str = "m",
    *,
    max_batch: int = 4,
    delay_ms: float = 50.0,
    batching: str = "window",
    slots: int | None = None,
) -> ModelConfig:
    """A model's config as the core reads it (its file is never opened); `slots` as the
    recipe's key (default: the recipe's default)."""
    model = ModelConfig(
        name=name,
        path="unused",
        max_batch_size=max_batch,
        max_queue_delay_ms=delay_ms,
        batching=batching,
    )
    return model if slots is None else attrs.evolve(model, slots=slots)


def create_batcher(
    max_batch: int = 4, delay_ms: float = 50.0, batching: str = "window"
) -> ModelBatcher:
    """The batcher of model "m"."""
    return ModelBatcher(create_model(max_batch=max_batch, delay_ms=delay_ms, batching=batching))


def create_scheduler(
    slots: Mapping[str, int],
    *,
    aging_s: float | None = None,
    budgets: Mapping[str, int | None] | None = None,
) -> Scheduler:
    """A Scheduler over models named by `slots` (name -> rows admitted at once)."""
    models = [ModelConfig(name=n, path="unused", slots=k) for n, k in slots.items()]
    return Scheduler(SchedulerConfig(aging_s=aging_s), models, budgets)


def create_request(id: int, model: str = "m") -> Request:
    """A standalone WAITING request, for use as a dependency."""
    return Request(id, model, (np.zeros(2, np.float32),))


def create_work(
    id: int,
    model: str = "m",
    *,
    rows: int = 1,
    width: int = 4,
    key: ShapeKey | None = None,
    batch_key: Hashable = None,
    priority: int = 0,
    deadline: float | None = None,
    depends_on: Sequence[Request] = (),
    submitted: float = 0.0,
    admitted: float | None = None,
    per_item: bool = False,
    on_cancel: Callable[[Request], None] | None = None,
) -> Work:
    """A WAITING Work of `rows` rows of float32[width] (row i holds id * 1000 + i; 4 * width
    bytes a row), batched under `key` (default: its own shape) and `batch_key` (default:
    the shape key). With `per_item`, one Request a row, numbered from `id` as
    `OfflineInference` numbers them and tied to its row (`on_cancel`: whom a cancel tells,
    e.g. `ExecutionEngine.cancelled`). With `admitted` (perf_counter s),
    the Work and its Requests are READY as the Scheduler leaves them then."""
    x = np.arange(rows * width, dtype=np.float32).reshape(rows, width) // width + id * 1000
    exact = ((width,),)
    work = Work.for_items(
        id,
        model,
        (x,),
        per_item=per_item,
        created=submitted,
        shape_key=exact if key is None else key,
        exact=exact,
        names=("y",),
        batch_key=batch_key,
        priority=priority,
        deadline=deadline,
        depends_on=tuple(depends_on),
        on_cancel=on_cancel,
    )
    if admitted is not None:
        work.admit(admitted)
        for r in work.requests or ():
            r.transition(S.READY)
    return work


def create_engine(
    model: ModelConfig,
    workers: Sequence[Any],
    *,
    inline: bool = False,
    width: int = 4,
    max_queue_size: int = 1000,
    stateful: Mapping[str, StatefulModel] | None = None,
    take_ids: Callable[[int], int] | None = None,
) -> ExecutionEngine:
    """An ExecutionEngine over `model` (x f32[N, width] -> y f32[N, width]) on `workers`:
    objects with a ModelWorker's surface (`index`, `name`, `num_streams`, `batch_s`,
    `healthy`, `dead`, `dispatch(run)`, `execute(run)`, `stop()`, `join()`), built whole as
    `OfflineInference.init()` builds it, its threads never started: a test steps it itself
    (`engine._step_and_after(now)`, or `engine.run_until(work)` from the test's thread).
    `inline`: the model's sessions may run on any thread (the inline executor);
    `stateful`, `take_ids`: the sequence layer's models and its id source."""
    desc = [TensorDesc("x", (None, width), np.float32)]
    shapes = ShapePolicy(model, desc, [TensorDesc("y", (None, width), np.float32)])
    metrics = Metrics([model.name])
    inbox = Inbox(metrics.engine_activity, max_queue_size)
    return ExecutionEngine(
        Scheduler(SchedulerConfig(), [model]),
        [WorkerSet(model, workers, shapes, inline)],
        Sequences(inbox, stateful, take_ids),
        metrics,
        inbox,
    )
