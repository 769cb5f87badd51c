"""OfflineInference: the entry layer. Inputs become Works and Requests; init once, infer many.

A facade over `inferchain.core`: it checks inputs, turns each call into records (one `Work`
per run of same-shape items, with per-item `Request`s where the caller wants them) and hands
them to the ExecutionEngine, which runs the loop.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Self, overload

import numpy as np

from inferchain.backends.base import Backend
from inferchain.backends.factory import make_backend
from inferchain.config import ModelConfig, Recipe, load_recipe
from inferchain.core.engine import ExecutionEngine
from inferchain.core.inbox import Inbox
from inferchain.core.request import Callback, Outputs, Request, RequestState
from inferchain.core.scheduler import Scheduler
from inferchain.core.sequences import Sequences, StatefulModel
from inferchain.core.state_pool import StatePool
from inferchain.core.work import Work
from inferchain.core.workers import WorkerSet
from inferchain.driver import PipelineDriver, idle_flush
from inferchain.errors import Closed, ConfigError, InvalidInput
from inferchain.host_processes import HostProcesses
from inferchain.in_flight import in_flight
from inferchain.intake import WorkSpec
from inferchain.logs import get_logger
from inferchain.memory import MemoryPlan
from inferchain.metrics import Metrics, Stats
from inferchain.pipeline import PathLoader, Pipeline, pipeline_class
from inferchain.registry import LoadedModel, load_models, step_batcher
from inferchain.sequence import LiveSequence, Stepper
from inferchain.shapes import ShapePolicy
from inferchain.tensors import ModelInfo
from inferchain.threads import planned

log = get_logger(__name__)

_Phase = Literal["new", "running", "closing", "closed"]
OnError = Literal["raise", "return"]


class OfflineInference:
    """Runs a recipe's models in this process.

    `init()` loads every model once (each worker on its own thread) and starts the engine;
    `submit`/`infer`/`map`/`map_batches`/`run` may then be called any number of times, from
    any thread; `close()` stops intake, drains, cancels what is left and joins every thread
    it started.
    """

    def __init__(
        self,
        recipe: Recipe | str | Path,
        *,
        acl_module: object | None = None,
        backend: Backend | None = None,
    ) -> None:
        recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
        # `threads: auto`: what was chosen for this machine's cores, and why
        self.recipe, self.thread_plan = planned(recipe)
        self._acl_module = acl_module
        self._backend = backend
        self._phase: _Phase = "new"
        self._lock = threading.Lock()  # guards _phase and _next_id
        self._next_id = 1
        self._models: dict[str, LoadedModel] = {}  # after init()
        self._specs: dict[str, WorkSpec] = {}  # after init(): each model's intake
        self._engine: ExecutionEngine | None = None
        self._inbox = Inbox()  # the engine's (made at init)
        self._sequences = Sequences()  # the sequence layer: step batchers, runners (init)
        self._pipeline: Pipeline | None = None
        self._idle_flush = idle_flush(self)  # what map() calls before it blocks
        # processes for a pipeline's GIL-bound host code, started on first use
        self.host_processes = HostProcesses(self.recipe.source, self.recipe.host_processes)
        self.metrics = Metrics(m.name for m in self.recipe.models)

    # -- life cycle -----------------------------------------------------------------------

    def init(self) -> Self:
        """Load every model, pre-allocate buffers and start the threads (once)."""
        if self._phase != "new":
            raise Closed(
                f"init() called on an OfflineInference that is {self._phase}: init() runs once; "
                "create a new OfflineInference"
            )
        started = time.perf_counter()
        # the pipeline and what it imports are checked before any model loads
        pipeline = pipeline_class(self.recipe) if self.recipe.pipeline else None
        backend = self._backend or make_backend(self.recipe, acl_module=self._acl_module)
        self._backend = backend
        inbox = Inbox(self.metrics.engine_activity, self.recipe.scheduler.max_queue_size)
        try:  # the workers post their runs' results to `inbox`
            self._models = load_models(self.recipe, backend, inbox.post)
        except BaseException:
            backend.close()
            self._phase = "closed"
            raise
        scheduler = Scheduler(
            self.recipe.scheduler,
            self.recipe.models,
            {name: m.memory.request_bytes for name, m in self._models.items()},
        )
        self._sequences = Sequences(inbox, self._stateful(), self._take_ids)
        inline = not backend.thread_affine  # a caller's thread may run a session
        engine = ExecutionEngine(
            scheduler,
            [WorkerSet(m.config, m.workers, m.shapes, inline) for m in self._models.values()],
            self._sequences,
            self.metrics,
            inbox,
        )
        engine.start()
        self._specs = {
            name: WorkSpec(m, self._take_ids, inbox.cancel) for name, m in self._models.items()
        }
        self._engine = engine
        self._inbox = inbox  # the engine's: requests by id (`depends_on`) and the books
        self._phase = "running"
        if pipeline is not None:
            try:
                self._pipeline = pipeline(self)
            except BaseException:
                self.close()  # nothing started may outlive a failed init()
                raise
        log.info(
            "initialized",
            recipe=self.recipe.name,
            backend=backend.name,
            models=[m.name for m in self.recipe.models],
            seconds=round(time.perf_counter() - started, 3),
        )
        return self

    def _stateful(self) -> dict[str, StatefulModel]:
        """What the sequence layer needs of each stateful model (its step queue made now)."""
        found = {}
        for name, m in self._models.items():
            if m.pool is not None:
                c = m.config
                found[name] = StatefulModel(
                    m.pool, step_batcher(m, self.metrics.models[name]), m.spec, m.step_names,
                    m.shapes, c.batch_rows, c.priority, c.timeout_s,
                    self.metrics.models[name].record_steps_formed,
                )  # fmt: skip
        return found

    def close(self, drain_timeout: float | None = None) -> None:
        """Stop intake, drain (bounded), cancel the rest, join every thread, release models.

        Both waits are bounded by `drain_timeout` (default the recipe's `drain_timeout_s`),
        and so is the wait for user callbacks still running (by `drain_timeout_s` where
        `drain_timeout` is 0); one still running after it is left to finish on its own.
        Safe to call twice, from any thread, including from a callback.
        """
        with self._lock:
            if self._phase in ("closing", "closed"):
                return
            self._phase = "closing"
        engine = self._engine
        if engine is not None:
            self.flush()  # what waits to form a batch runs before the drain
            timeout = (
                self.recipe.scheduler.drain_timeout_s if drain_timeout is None else drain_timeout
            )
            if not engine.wait_all(timeout):
                engine.cancel_all()
                engine.wait_all(timeout)
            engine.close(callbacks_timeout=timeout or self.recipe.scheduler.drain_timeout_s)
        # sequences still waiting for a step
        self._sequences.abort(Closed("the OfflineInference was closed before the sequence ended"))
        self.host_processes.close()
        if self._backend is not None:
            self._backend.close()
        self._phase = "closed"
        log.info("closed", recipe=self.recipe.name)

    def __enter__(self) -> Self:
        return self.init()

    def __exit__(self, *exc_info: object) -> None:
        """`close()`; after an exception in the block without waiting for work in flight."""
        self.close(drain_timeout=0.0 if exc_info[1] is not None else None)

    # -- submission -----------------------------------------------------------------------

    def submit(
        self,
        model: str,
        inputs: Any,
        *,
        priority: int | None = None,
        timeout: float | None = None,
        depends_on: Iterable[Request | int] = (),
        callback: Callback | None = None,
        block: bool = True,
    ) -> Request:
        """Queue one item for `model` and return its Request at once.

        Inputs are checked here: a mismatch raises `InvalidInput` and nothing else is affected.
        `timeout` (seconds) bounds the time before the request starts running; `callback`
        runs on the callback thread once the request is terminal.
        """
        return self.submit_many(
            model,
            (inputs,),
            priority=priority,
            timeout=timeout,
            depends_on=depends_on,
            callback=callback,
            block=block,
        )[0]

    def submit_many(
        self,
        model: str,
        items: Iterable[Any] | np.ndarray,
        *,
        priority: int | None = None,
        timeout: float | None = None,
        depends_on: Iterable[Request | int] = (),
        callback: Callback | None = None,
        block: bool = True,
    ) -> list[Request]:
        """`submit` for many items at once (an iterable of items, or for a one-input model
        an array whose rows are the items): all are checked before any is queued."""
        engine = self._running_engine()
        works = self._spec(model).works(
            items,
            per_item=True,
            priority=priority,
            timeout=timeout,
            depends_on=self._resolve(depends_on),
            callback=callback,
        )
        requests = [r for w in works for r in w.requests or ()]
        for i, work in enumerate(works):
            try:
                engine.submit(work, block=block)
            except BaseException:
                for w in works[i:]:
                    for r in w.requests or ():
                        r.try_transition(RequestState.CANCELLED)
                raise
        return requests

    def sequence(
        self,
        model: str,
        *,
        rows: int = 1,
        state: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> LiveSequence:
        """Open a sequence of the stateful `model` (recipe key `state:`): `rows` lanes of
        its carried state (one per row, e.g. per beam), zeros or `state` (carried input name
        -> one item for every row, or `rows` items). Waits up to `timeout` seconds for free
        lanes (`max_sequences` in all), then raises `QueueFull`. Use it as a context
        manager; see `inferchain.sequence`."""
        self._running_engine()
        pool = self._pool(model, "submit() its items instead")
        if rows < 1:
            raise InvalidInput(f"model {model!r}: a sequence has rows >= 1, got {rows}")
        unknown = sorted(set(state or ()) - set(pool.inputs))
        if unknown:
            raise InvalidInput(
                f"model {model!r}: {unknown} are not carried inputs (carried: {list(pool.inputs)})"
            )
        lanes = pool.acquire(dict(state or {}), timeout, rows)
        return LiveSequence(model, pool, lanes, self._sequences)

    def run_sequence(
        self, model: str, stepper: Stepper, item: Any, *, timeout: float | None = None
    ) -> Request:
        """Run one whole sequence of the stateful `model` for `item`, its host logic in
        `stepper` (an `inferchain.Stepper`: every step of all the sequences run with this
        stepper is computed for them together, in one call per step batch). Returns a
        Request that ends DONE with `stepper.result(state)` as its outputs (or ERROR with
        what failed); cancel it to end the sequence at its next step. With `timeout`
        (seconds), it ends TIMED_OUT once that has passed, between two of its steps or
        while it waits for lanes (the engine's loop wakes for it), and its lanes are freed.
        See docs/sequences.md."""
        self._running_engine()
        self._pool(model, "run_sequence() needs a stateful model")
        return self._sequences.start(model, stepper, item, timeout)

    def _pool(self, model: str, instead: str) -> StatePool:
        """The lanes of the stateful `model`; `ConfigError` (saying what to do `instead`)
        for a model without state."""
        pool = self._model(model).pool
        if pool is None:
            raise ConfigError(
                f"{self.recipe.source}: model {model!r} carries no state between steps "
                f"(recipe key `state:`, e.g. {{stateN: state}}); {instead}"
            )
        return pool

    def flush(self, *, steps: bool = True, batches: bool | Literal["if_stalled"] = True) -> None:
        """Send what waits for others to form a batch now: the queued `steps` of sequences
        (which else leave once every live sequence has stepped, a cohort is complete, or the
        batching window ends), and (`batches`) the partial batches of `batching: fill`
        models; with `batches="if_stalled"`, those only when nothing else is left to run.
        `run()` flushes fill batches when its input ends (and, if stalled, when it cannot
        start more items); `wait_all()` and `close()` flush everything first."""
        if steps and self._engine is not None:
            self._sequences.flush()
        if batches and self._engine is not None:
            self._engine.flush(if_stalled=batches == "if_stalled")

    def infer(self, model: str, inputs: Any, timeout: float | None = None) -> Outputs:
        """Run one item and wait: its outputs, or raise its error.

        When the model is idle and its sessions may run on any thread (ONNX Runtime; not
        pyACL), the engine runs its batch right here on the calling thread.
        """
        engine, spec = self._engine, self._specs.get(model)
        if spec is None or engine is None or self._phase != "running":
            engine, spec = self._running_engine(), self._spec(model)  # raises
        work = spec.item(inputs, timeout)
        if not engine.run_until(work):
            work.wait()
        result = work.item(0)
        if isinstance(result, BaseException):
            raise result
        return result

    @overload
    def map(
        self,
        model: str,
        inputs: Iterable[Any] | np.ndarray,
        *,
        ordered: bool = ...,
        max_in_flight: int | None = ...,
        priority: int | None = ...,
        on_error: Literal["raise"] = ...,
    ) -> Iterator[Outputs]: ...

    @overload
    def map(
        self,
        model: str,
        inputs: Iterable[Any] | np.ndarray,
        *,
        ordered: bool = ...,
        max_in_flight: int | None = ...,
        priority: int | None = ...,
        on_error: Literal["return"],
    ) -> Iterator[Outputs | BaseException]: ...

    def map(
        self,
        model: str,
        inputs: Iterable[Any] | np.ndarray,
        *,
        ordered: bool = True,
        max_in_flight: int | None = None,
        priority: int | None = None,
        on_error: OnError = "raise",
    ) -> Iterator[Outputs | BaseException]:
        """Stream items through `model`, keeping at most `max_in_flight` rows submitted.

        Yields each item's outputs in input order (or by finished work with `ordered=False`).
        An item's error is raised at its turn (what is still in flight is then cancelled),
        or with `on_error="return"` yielded in place of its outputs: an item that fails its
        input check too (its `InvalidInput`), and the items after it go on
        """
        stream = self._in_flight_works(
            model, inputs, ordered, max_in_flight, priority, on_error=on_error
        )
        raising = on_error == "raise"  # chained: no frame of this method's per row
        return itertools.chain.from_iterable(work.items(raising) for work in stream)

    def map_batches(
        self,
        model: str,
        inputs: Iterable[Any] | np.ndarray,
        *,
        batch_size: int | None = None,
        max_in_flight: int | None = None,
        priority: int | None = None,
        on_error: OnError = "raise",
    ) -> Iterator[dict[str, np.ndarray] | BaseException]:
        """Stream items through `model` and yield outputs as arrays of many rows (name ->
        array, rows in input order), like Ray Data's `map_batches`.

        `inputs` is best an array whose rows are the items (a one-input model), or any
        iterable of items. Each yielded mapping covers consecutive rows (at most
        `batch_size`, default the model's max batch); with `on_error="return"` a failed
        range yields its error instead (an item that fails its input check: its
        `InvalidInput`, as a range of its own, and the rows after it go on).
        """
        size = batch_size or self.recipe.model(model).batch_rows
        stream = self._in_flight_works(
            model, inputs, True, max_in_flight, priority, chunk=size, on_error=on_error
        )
        for work in stream:
            for _, _, value in work.arrays():
                if isinstance(value, BaseException) and on_error == "raise":
                    raise value
                yield value

    def _in_flight_works(
        self,
        model: str,
        inputs: Iterable[Any] | np.ndarray,
        ordered: bool,
        max_in_flight: int | None,
        priority: int | None,
        chunk: int | None = None,
        on_error: OnError = "raise",
    ) -> Iterator[Work]:
        """Works for `inputs` in a bounded window; with `on_error="return"` an item that
        fails its input check becomes a settled Work of its error, in its place."""
        engine = self._running_engine()
        spec = self._spec(model)
        config = self.recipe.model(model)
        limit = max_in_flight or 2 * config.num_slots
        size = chunk or config.batch_rows
        if isinstance(inputs, np.ndarray):  # rows cost nothing to cut: few, large Works
            size = max(size, size * (limit // (4 * size)))

        def submit(
            items: Sequence[Any] | np.ndarray, notify: Callable[[Work], None] | None
        ) -> list[Work]:
            try:
                works = spec.works(items, priority=priority, listener=notify)
            except InvalidInput:
                if on_error == "raise":
                    raise
                works = spec.works_apart(items, priority, notify)
            for w in works:
                if not w.done:
                    engine.run_until(w)
                elif notify is not None:
                    notify(w)
            return works

        return in_flight(
            submit,
            inputs,
            limit=max(limit, size),
            chunk=size,
            ordered=ordered,
            on_idle=self._idle_flush,
        )

    def run(
        self,
        items: Iterable[Any],
        *,
        max_in_flight: int | None = None,
        on_error: OnError = "raise",
        item_timeout: float | None = None,
    ) -> Iterator[Any]:
        """The recipe's pipeline over `items`: one result per item, in order, streaming.

        An item that is a path (`pathlib.Path`, any `os.PathLike`; a `str` too where the
        pipeline's `path_items` says its items are file names, as an `ImagePipeline`'s are)
        is read with the pipeline's `load` as it starts (as `inferchain run` reads its files;
        one that cannot be read fails alone); any other item goes to `process` as it is.
        Without a pipeline, a one-model recipe maps items through that model. With
        `on_error="return"` a failed item yields its exception instead of raising. At most
        `max_in_flight` items are in flight (default: the pipeline's `max_in_flight`, 64).
        An item not finished `item_timeout` seconds after it started ends with
        `RequestTimeout` in its place.
        """
        pipeline = PathLoader(self._pipeline or self._default_pipeline())
        driver = PipelineDriver(
            pipeline, max_in_flight=max_in_flight, on_error=on_error, item_timeout=item_timeout
        )
        return driver.run(items)

    def _default_pipeline(self) -> Pipeline:
        if len(self.recipe.models) != 1:
            raise ConfigError(
                f"{self.recipe.source}: run() needs a `pipeline:` for a recipe with "
                f"{len(self.recipe.models)} models"
            )
        self._pipeline = Pipeline(self)
        return self._pipeline

    @property
    def pipeline(self) -> Pipeline:
        """The recipe's pipeline object (the default one-model pass-through if none)."""
        return self._pipeline or self._default_pipeline()

    # -- turning inputs into records ------------------------------------------------------

    def _spec(self, model: str) -> WorkSpec:
        """The intake of `model` (`InvalidInput` naming the models there are)."""
        found = self._specs.get(model)
        if found is None:
            self._model(model)  # raises
            raise Closed(f"cannot submit: the OfflineInference is {self._phase}")
        return found

    def _take_ids(self, n: int) -> int:
        with self._lock:
            if self._phase != "running":
                raise Closed(
                    f"cannot submit: the OfflineInference is {self._phase} "
                    "(create a new OfflineInference)"
                )
            first = self._next_id
            self._next_id += n
        return first

    def _running_engine(self) -> ExecutionEngine:
        if self._phase != "running" or self._engine is None:
            hint = "call init() first" if self._phase == "new" else "create a new OfflineInference"
            raise Closed(f"cannot submit: the OfflineInference is {self._phase} ({hint})")
        return self._engine

    def _model(self, model: str) -> LoadedModel:
        found = self._models.get(model)
        if found is None:
            raise InvalidInput(f"no model named {model!r} (models: {', '.join(self._models)})")
        return found

    def _resolve(self, depends_on: Iterable[Request | int]) -> tuple[Request, ...]:
        self._running_engine()
        deps = []
        for d in depends_on:
            if isinstance(d, Request):
                deps.append(d)
                continue
            found = self._inbox.lookup(d)
            if found is not None:
                deps.append(found)
            elif not 0 < d < self._next_id:
                raise InvalidInput(f"depends_on: no request with id {d} was submitted here")
            # else: it finished DONE, so the dependency holds
        return tuple(deps)

    # -- waiting, cancelling, introspection -----------------------------------------------

    def wait_all(self, timeout: float | None = None) -> bool:
        """WaitForAllTaskDone: True once everything submitted has ended (within `timeout`
        seconds in all)."""
        if self._engine is None:
            return True
        self.flush()
        return self._engine.wait_all(timeout)

    def cancel_all(self) -> int:
        """Cancel everything not yet running; returns how many requests were cancelled."""
        return self._engine.cancel_all() if self._engine is not None else 0

    def model_info(self, model: str) -> ModelInfo:
        """Inputs and outputs of a loaded model: names, shapes, dtypes."""
        return self._model(model).info

    @property
    def memory(self) -> dict[str, MemoryPlan]:
        """The memory budget table: one plan per model (after init)."""
        return {name: m.memory for name, m in self._models.items()}

    def shape_policy(self, model: str) -> ShapePolicy:
        """How `model`'s items are grouped into batches (its buckets, once known)."""
        return self._model(model).shapes

    @property
    def models(self) -> Sequence[ModelConfig]:
        return self.recipe.models

    def stats(self) -> Stats:
        """Throughput, batch sizes and latency percentiles per stage, per model."""
        return self.metrics.stats()
