"""Benchmarks without writing code: drive a recipe's models and report what `oi.stats()` keeps.

Two sources of work:
- synthetic (default): per model, random items in the shapes of the recipe's buckets, or of
  the model with its dynamic dims set to `dynamic_dim` (`inferchain.tools.synthetic`, which
  says which). Each model gets `requests` items, all models at once (one feeder thread per
  model), fed at the rate the model drains them: at most `in_flight` requests at once,
  by default two batches per worker stream (one running, one forming), so the latency is
  the service's, not that of a queue of all requests. A stateful model gets `requests`
  steps instead, in sequences of `STEPS_PER_SEQUENCE` (`drive_sequences`).
- pipeline: the recipe's own inputs (or the files given, as `inferchain run` reads them)
  through its pipeline, `requests` items (the inputs repeated as needed), at most the
  pipeline's `max_in_flight` at once; the pipeline's own steps are timed as the `pre` and
  `post` stages.

Each request's latency is reported whole and split: waiting (queue, batch_wait and
worker_wait: for admission, a batch and a worker) and service (execute). The figures are the
OfflineInference's since `init()`; `run_bench` uses a fresh one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from inferchain.config import Recipe
from inferchain.core.request import Request
from inferchain.driver import PipelineDriver
from inferchain.errors import ConfigError
from inferchain.metrics import Percentiles
from inferchain.offline import OfflineInference
from inferchain.pipeline import Pipeline, PipelineWrapper, Process, Step
from inferchain.sources import input_files, input_items, load_item, sources_of
from inferchain.tools.bench_report import BenchReport, Inputs, ItemStats, Source
from inferchain.tools.feeds import DYNAMIC_DIM
from inferchain.tools.synthetic import Items, model_pool

OnDone = Callable[[int], None]  # called with 0 when driving starts, then with how many more
# requests (or items) finished


# -- drivers -------------------------------------------------------------------------------


def paced(oi: OfflineInference, model: str) -> int:
    """Requests of `model` in flight that keep its workers fed without queueing: two
    batches per worker stream (one running, one forming), within the model's slots."""
    config = oi.recipe.model(model)
    streams = config.instances * (config.streams or 1)
    return min(config.num_slots, 2 * streams * config.batch_rows)


def drive(
    oi: OfflineInference,
    model: str,
    items: Sequence[Any],
    requests: int,
    on_done: OnDone | None = None,
    in_flight: int | None = None,
) -> None:
    """Submit `requests` items to `model`, cycling through `items`, with at most
    `in_flight` in flight (default `paced`); returns when all are finished (failures are
    counted in stats)."""
    window = in_flight or paced(oi, model)
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


def recipe_items(oi: OfflineInference, paths: Sequence[Path] | None = None) -> list[Any]:
    """The items of `paths` (files or folders, as `inferchain run` reads them), or of the
    recipe's `inputs:`, loaded by its pipeline."""
    recipe, pipeline = oi.recipe, oi.pipeline
    if not paths and not recipe.inputs:
        raise ConfigError(
            f"{recipe.source}: the pipeline source needs `inputs:` in the recipe, or --input"
        )
    items = input_items(input_files(sources_of(recipe, paths), pipeline), pipeline)
    return [load_item(pipeline, item) for item in items]


# -- a whole run ---------------------------------------------------------------------------


def drive_all(
    oi: OfflineInference,
    pools: dict[str, Items],
    requests: int,
    on_done: OnDone | None = None,
    in_flight: int | None = None,
) -> None:
    """`drive` every model of `pools` at once, one feeder thread each."""
    with ThreadPoolExecutor(len(pools), thread_name_prefix="bench") as feeders:
        futures = [
            feeders.submit(drive_sequences, oi, m, p, requests, on_done)
            if oi.recipe.model(m).state
            else feeders.submit(drive, oi, m, p, requests, on_done, in_flight)
            for m, p in pools.items()
        ]
        for f in futures:
            f.result()


def _shapes(oi: OfflineInference, pools: dict[str, Items]) -> Inputs:
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
    inputs: Sequence[Path] | None = None,
    in_flight: int | None = None,
) -> BenchReport:
    """Drive a running OfflineInference and report; `models` (synthetic only) picks models,
    `dynamic_dim` is the size of synthetic inputs' dynamic dims where the recipe has no
    buckets, `inputs` the files or folders of the pipeline source (default: the recipe's
    `inputs:`), `in_flight` the synthetic requests in flight per model (default `paced`)."""
    if requests < 1 or dynamic_dim < 1 or (in_flight is not None and in_flight < 1):
        raise ConfigError(
            f"requests, dynamic_dim and in_flight must be >= 1, got {requests}, {dynamic_dim}, "
            f"{in_flight}"
        )
    if source != "pipeline" and inputs:
        raise ConfigError("input files are for the pipeline source (bench --pipeline --input)")
    if models and source == "pipeline":
        raise ConfigError("models cannot be chosen for the pipeline source")
    names = list(models) if models else [m.name for m in oi.models]
    for name in names:
        oi.recipe.model(name)  # ConfigError naming the known models
    items = recipe_items(oi, inputs) if source == "pipeline" else []
    made = {} if items else {n: model_pool(oi, n, dynamic_dim) for n in names}
    pools = {n: pool for n, (pool, _) in made.items()}
    if on_done is not None:
        on_done(0)
    started = time.perf_counter()
    timed = drive_pipeline(oi, items, requests, on_done) if items else None
    if not items:
        drive_all(oi, pools, requests, on_done, in_flight)
    oi.wait_all()
    wall_s = time.perf_counter() - started
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
        items=None if timed is None else _item_stats(timed, wall_s),
        host_steps=tuple(oi.metrics.host.snapshot()[3]),
        shape_notes={n: note for n, (_, note) in made.items() if note},
        in_flight={n: in_flight or paced(oi, n) for n in pools if not oi.recipe.model(n).state},
        waiting_ms=Percentiles.of(_waiting(oi)),
        service_ms=Percentiles.of(oi.metrics.samples("execute")),
    )


WAITING = ("queue", "batch_wait", "worker_wait")  # a request's stages before its batch runs


def _waiting(oi: OfflineInference) -> np.ndarray:
    """Seconds each request waited before its batch ran (the `WAITING` stages summed)."""
    queue, batch, worker = (oi.metrics.samples(stage) for stage in WAITING)
    waited: np.ndarray = queue + batch + worker
    return waited


def _item_stats(timed: TimedPipeline, wall_s: float) -> ItemStats:
    done = len(timed.latencies_s)
    rate = done / wall_s if wall_s > 0 else 0.0
    return ItemStats(done, timed.errors, rate, Percentiles.of(np.asarray(timed.latencies_s)))


def run_bench(recipe: Recipe, *, acl_module: object | None = None, **options: Any) -> BenchReport:
    """`bench(oi, **options)` on a fresh OfflineInference of `recipe`, closed afterwards."""
    with OfflineInference(recipe, acl_module=acl_module) as oi:
        return bench(oi, **options)
