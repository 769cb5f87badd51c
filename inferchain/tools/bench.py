"""Benchmarks without writing code: drive a recipe's models and report what `oi.stats()` keeps.

Two sources of work:
- synthetic (default): per model, random items made from `oi.model_info(name)` by
  `inferchain.tools.feeds.random_array` (its values; a dynamic dim other than the batch dim
  gets `DYNAMIC_DIM`, 32). Each model gets `requests` items, all models at once (one feeder
  thread per model), at most twice the model's slots in flight. A stateful model gets
  `requests` steps instead, in sequences of `STEPS_PER_SEQUENCE` (`drive_sequences`).
- pipeline: the recipe's own inputs through its pipeline, `requests` items (the inputs
  repeated as needed); the pipeline's own steps are timed as the `pre` and `post` stages.

The figures are the OfflineInference's since `init()`; `run_bench` uses a fresh one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from inferchain.config import Recipe
from inferchain.core.request import Request
from inferchain.driver import PipelineDriver
from inferchain.errors import ConfigError
from inferchain.layout import Axis, Layout, item_shape
from inferchain.metrics import Percentiles
from inferchain.offline import OfflineInference
from inferchain.pipeline import Pipeline, PipelineWrapper, Process, Step
from inferchain.tensors import ModelInfo, TensorDesc
from inferchain.tools.bench_report import BenchReport, Inputs, ItemStats, Source
from inferchain.tools.feeds import DYNAMIC_DIM, random_array

POOL = 64  # distinct synthetic items per model, cycled through
OnDone = Callable[[int], None]  # called with 0 when driving starts, then with how many more
# requests (or items) finished


# -- synthetic inputs ----------------------------------------------------------------------


def synthetic_shape(
    desc: TensorDesc, batching: bool, dynamic_dim: int = DYNAMIC_DIM, axis: Axis = 0
) -> tuple[int, ...]:
    """One item's shape: the model's, without the batch dim (on `axis`; None: unbatched,
    all of it) when batching; dynamic dims filled (a non-batching model's dynamic leading
    dim gets 1)."""
    if batching:
        dims = list(item_shape(desc.shape, axis))
    else:
        dims = list(desc.shape)
        if dims and dims[0] is None:
            dims[0] = 1
    return tuple(dynamic_dim if d is None else d for d in dims)


def synthetic_items(
    info: ModelInfo,
    count: int = POOL,
    *,
    dynamic_dim: int = DYNAMIC_DIM,
    seed: int = 0,
    layout: Layout | None = None,
) -> list[tuple[np.ndarray, ...]]:
    """`count` distinct random items for the model described by `info`, whose inputs hold
    their rows where `layout` says (default: axis 0)."""
    rng = np.random.default_rng(seed)
    batching = info.max_batch_size > 0
    axes = (layout or Layout.plain(len(info.inputs), 0)).inputs
    shapes = [
        synthetic_shape(t, batching, dynamic_dim, a) for t, a in zip(info.inputs, axes, strict=True)
    ]
    return [
        tuple(
            random_array(s, t.dtype, rng, t.name) for s, t in zip(shapes, info.inputs, strict=True)
        )
        for _ in range(count)
    ]


# -- drivers -------------------------------------------------------------------------------


def drive(
    oi: OfflineInference,
    model: str,
    items: Sequence[Any],
    requests: int,
    on_done: OnDone | None = None,
) -> None:
    """Submit `requests` items to `model`, cycling through `items`, with at most twice the
    model's slots in flight; returns when all are finished (failures are counted in stats)."""
    window = 2 * oi.recipe.model(model).num_slots
    chunk = max(1, window // 2)
    pending: deque[Request] = deque()
    sent = 0
    while sent < requests or pending:
        if sent < requests and len(pending) <= window - chunk:
            k = min(chunk, requests - sent)
            pending.extend(
                oi.submit_many(model, [items[(sent + i) % len(items)] for i in range(k)])
            )
            sent += k
            continue
        pending.popleft().wait()
        if on_done is not None:
            on_done(1)


class TimedPipeline(PipelineWrapper):
    """Wraps a pipeline's `process` (the one method the driver calls) to time each item's
    steps: `pre` (item -> first request) and `post` (outputs received -> next request or
    result), recorded in `oi.metrics` for every item that finished or failed."""

    def __init__(self, inner: Pipeline) -> None:
        super().__init__(inner)
        self.latencies_s: list[float] = []  # per finished item: first step to result
        self.errors = 0  # items that failed
        self._lock = threading.Lock()  # items finish on several host threads

    def process(self, item: Any) -> Process | Any:
        started = time.perf_counter()
        try:
            gen = self.inner.process(item)
        except Exception:
            self._finished(started, ok=False)
            raise
        if not isinstance(gen, Generator):  # all its work happened in the call
            self.oi.metrics.record_item({"pre": time.perf_counter() - started})
            self._finished(started, ok=True)
            return gen
        return self._timed(gen, started)

    def _finished(self, started: float, *, ok: bool) -> None:
        with self._lock:
            self.latencies_s.append(time.perf_counter() - started)
            self.errors += not ok

    def _timed(self, gen: Process, item_started: float) -> Process:
        spent = {"pre": 0.0, "post": 0.0}
        ok = False
        stage, value, error = "pre", None, None
        closed = False  # by the driver, before the item finished: not a sample
        try:
            while True:
                started = time.perf_counter()
                try:
                    step: Step = gen.send(value) if error is None else gen.throw(error)
                except StopIteration as stop:
                    spent[stage] += time.perf_counter() - started
                    ok = True
                    return stop.value
                spent[stage] += time.perf_counter() - started
                stage = "post"
                try:
                    value, error = (yield step), None
                except GeneratorExit:
                    closed = True
                    gen.close()
                    raise
                except Exception as e:
                    value, error = None, e
        finally:
            if not closed:
                self.oi.metrics.record_item(spent)
                self._finished(item_started, ok=ok)


STEPS_PER_SEQUENCE = 64  # synthetic sequences: steps each (the last one may be shorter)


class SequenceSteps(Pipeline):
    """Synthetic sequences of a stateful model: an item is a number of steps; each step
    feeds the next synthetic item's inputs that are not carried."""

    def __init__(self, oi: OfflineInference, model: str, items: Sequence[Any]) -> None:
        super().__init__(oi)
        self.model = model
        carried = set(oi.recipe.model(model).state.values())
        names = [t.name for t in oi.model_info(model).inputs]
        self.feeds = [
            {n: a for n, a in zip(names, item, strict=True) if n not in carried} for item in items
        ]

    def process(self, item: Any) -> Process:
        feeds = self.feeds
        with self.oi.sequence(self.model) as seq:
            for k in range(int(item)):
                yield seq.step(feeds[k % len(feeds)])
        return None


def drive_sequences(
    oi: OfflineInference,
    model: str,
    items: Sequence[Any],
    requests: int,
    on_done: OnDone | None = None,
) -> None:
    """`requests` steps of the stateful `model` in sequences of `STEPS_PER_SEQUENCE`, as
    many live at once as two batches hold (at most `max_sequences`): sequences end and new
    ones start between steps."""
    config = oi.recipe.model(model)
    lengths = [STEPS_PER_SEQUENCE] * (requests // STEPS_PER_SEQUENCE)
    if requests % STEPS_PER_SEQUENCE:
        lengths.append(requests % STEPS_PER_SEQUENCE)
    live = max(1, min(config.max_sequences, 2 * config.batch_rows))
    driver = PipelineDriver(SequenceSteps(oi, model, items), max_in_flight=live, on_error="return")
    for n, length in zip(driver.run(lengths), lengths, strict=True):  # results in order
        if on_done is not None:
            on_done(length if n is None else 0)


def drive_pipeline(
    oi: OfflineInference, items: Sequence[Any], count: int, on_done: OnDone | None = None
) -> TimedPipeline:
    """`count` items (cycling through `items`) through the recipe's pipeline, timed; the
    timed pipeline holds each item's latency."""
    timed = TimedPipeline(oi.pipeline)
    driver = PipelineDriver(timed, on_error="return")
    for _ in driver.run(items[i % len(items)] for i in range(count)):
        if on_done is not None:
            on_done(1)
    return timed


def recipe_items(oi: OfflineInference) -> list[Any]:
    """The recipe's `inputs:` files, loaded by its pipeline."""
    recipe = oi.recipe
    if not recipe.inputs:
        raise ConfigError(f"{recipe.source}: the pipeline source needs `inputs:` in the recipe")
    files = oi.pipeline.input_files(recipe.root / recipe.inputs)
    if not files:
        raise ConfigError(f"{recipe.source}: no input files in {recipe.root / recipe.inputs}")
    return [oi.pipeline.load(f) for f in files]


# -- a whole run ---------------------------------------------------------------------------


def drive_all(
    oi: OfflineInference,
    pools: dict[str, list[tuple[np.ndarray, ...]]],
    requests: int,
    on_done: OnDone | None = None,
) -> None:
    """`drive` every model of `pools` at once, one feeder thread each."""
    with ThreadPoolExecutor(len(pools), thread_name_prefix="bench") as feeders:
        futures = [
            feeders.submit(
                drive_sequences if oi.recipe.model(m).state else drive, oi, m, p, requests, on_done
            )
            for m, p in pools.items()
        ]
        for f in futures:
            f.result()


def _shapes(oi: OfflineInference, pools: dict[str, list[tuple[np.ndarray, ...]]]) -> Inputs:
    shapes: Inputs = {}
    for model, pool in pools.items():
        descs = oi.model_info(model).inputs
        shapes[model] = {t.name: list(a.shape) for t, a in zip(descs, pool[0], strict=True)}
    return shapes


def bench(
    oi: OfflineInference,
    *,
    models: Sequence[str] | None = None,
    requests: int = 1000,
    source: Source = "synthetic",
    on_done: OnDone | None = None,
    dynamic_dim: int = DYNAMIC_DIM,
) -> BenchReport:
    """Drive a running OfflineInference and report; `models` (synthetic only) picks models,
    `dynamic_dim` is the size of synthetic inputs' dynamic dims."""
    if requests < 1 or dynamic_dim < 1:
        raise ConfigError(f"requests and dynamic_dim must be >= 1, got {requests}, {dynamic_dim}")
    if models and source == "pipeline":
        raise ConfigError("models cannot be chosen for the pipeline source")
    names = list(models) if models else [m.name for m in oi.models]
    for name in names:
        oi.recipe.model(name)  # ConfigError naming the known models
    items = recipe_items(oi) if source == "pipeline" else []
    pools = (
        {}
        if items
        else {
            n: synthetic_items(
                oi.model_info(n), dynamic_dim=dynamic_dim, layout=oi.shape_policy(n).layout
            )
            for n in names
        }
    )
    if on_done is not None:
        on_done(0)
    started = time.perf_counter()
    timed = None
    if items:
        timed = drive_pipeline(oi, items, requests, on_done)
    else:
        drive_all(oi, pools, requests, on_done)
    oi.wait_all()
    wall_s = time.perf_counter() - started
    item_stats = None
    if timed is not None:
        done = len(timed.latencies_s)
        rate = done / wall_s if wall_s > 0 else 0.0
        latency = Percentiles.of(np.asarray(timed.latencies_s))
        item_stats = ItemStats(done, timed.errors, rate, latency)
    return BenchReport(
        recipe=oi.recipe.name,
        backend=oi.recipe.backend,
        source=source,
        requested=requests,
        wall_s=wall_s,
        inputs=_shapes(oi, pools),
        workers=tuple(f"{m.name}#{i}" for m in oi.models for i in range(m.instances)),
        stats=oi.stats(),
        timeline=tuple(oi.metrics.timeline()),
        latencies_s=oi.metrics.samples("end_to_end"),
        items=item_stats,
        host_steps=tuple(oi.metrics.host.snapshot()[3]),
    )


def run_bench(
    recipe: Recipe,
    *,
    models: Sequence[str] | None = None,
    requests: int = 1000,
    source: Source = "synthetic",
    on_done: OnDone | None = None,
    dynamic_dim: int = DYNAMIC_DIM,
    acl_module: object | None = None,
) -> BenchReport:
    """`bench` on a fresh OfflineInference of `recipe`, closed afterwards."""
    with OfflineInference(recipe, acl_module=acl_module) as oi:
        return bench(
            oi,
            models=models,
            requests=requests,
            source=source,
            on_done=on_done,
            dynamic_dim=dynamic_dim,
        )
