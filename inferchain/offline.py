"""OfflineInference: the entry layer. Inputs become Works and Requests; init once, infer many.

A facade over `inferchain.core`: it checks inputs, turns each call into records (one `Work`
per run of same-shape items, with per-item `Request`s where the caller wants them) and hands
them to the ExecutionEngine, which runs the loop.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Self, overload

import numpy as np

from inferchain.anchors import current_run
from inferchain.backends.base import Backend
from inferchain.backends.factory import make_backend
from inferchain.config import ModelConfig, Recipe, load_recipe
from inferchain.core.engine import ExecutionEngine
from inferchain.core.request import Callback, Outputs, Request, RequestState
from inferchain.core.scheduler import Scheduler
from inferchain.core.sequence_runner import SequenceRunner
from inferchain.core.sequences import Sequences
from inferchain.core.step_batcher import StepBatcher
from inferchain.core.work import Work
from inferchain.driver import PipelineDriver, idle_flush
from inferchain.errors import Closed, ConfigError, InvalidInput
from inferchain.host_processes import HostProcesses
from inferchain.in_flight import in_flight
from inferchain.inputs import Item
from inferchain.logs import get_logger
from inferchain.memory import MemoryPlan
from inferchain.metrics import Metrics, Stats
from inferchain.pipeline import PathLoader, Pipeline, pipeline_class
from inferchain.registry import LoadedModel, load_models, step_batcher
from inferchain.sequence import LiveSequence, Stepper
from inferchain.shapes import ShapeKey, ShapePolicy
from inferchain.tensors import ModelInfo

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
        self.recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
        self._acl_module = acl_module
        self._backend = backend
        self._phase: _Phase = "new"
        self._lock = threading.Lock()  # guards _phase and _next_id
        self._next_id = 1
        self._models: dict[str, LoadedModel] = {}  # after init()
        self._lanes: dict[str, tuple[str, ...]] = {}  # after init(): see init()
        self._engine: ExecutionEngine | None = None
        self._sequences = Sequences()  # the step batchers and runners the engine drives
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
        engine = ExecutionEngine(self.metrics, self.recipe.scheduler.max_queue_size)
        try:
            self._models = load_models(self.recipe, backend, engine.post)
        except BaseException:
            backend.close()
            self._phase = "closed"
            raise
        scheduler = Scheduler(
            self.recipe.scheduler,
            self.recipe.models,
            {name: m.memory.request_bytes for name, m in self._models.items()},
        )
        for name, m in self._models.items():
            if m.pool is not None:
                m.steps = step_batcher(m, self.metrics.models[name])
                self._sequences.batchers[name] = m.steps
        # models whose one item may take the engine's one-item lane: their output names
        self._lanes = {n: m.output_names for n, m in self._models.items() if m.takes_lane}
        engine.start(
            scheduler,
            [(m.config, m.workers, m.shapes) for m in self._models.values()],
            self._sequences,
            inline=not backend.thread_affine,
        )
        self._engine = engine
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
        works = self._works(
            model,
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
        engine = self._running_engine()
        loaded = self._model(model)
        pool = loaded.pool
        if pool is None:
            raise ConfigError(
                f"{self.recipe.source}: model {model!r} carries no state between steps "
                "(recipe key `state:`, e.g. {stateN: state}); submit() its items instead"
            )
        if rows < 1:
            raise InvalidInput(f"model {model!r}: a sequence has rows >= 1, got {rows}")
        unknown = sorted(set(state or ()) - set(pool.inputs))
        if unknown:
            raise InvalidInput(
                f"model {model!r}: {unknown} are not carried inputs (carried: {list(pool.inputs)})"
            )
        lanes = pool.acquire(dict(state or {}), timeout, rows)
        steps = loaded.steps
        assert steps is not None
        cancel = functools.partial(self._cancel_step, steps)

        def one(inputs: Mapping[str, Any], lane: int, callback: Callback | None) -> Request:
            item, key = steps.item(inputs, lane)
            request = steps.request(self._take_ids(1), item, callback, cancel)
            self._queue_steps(steps, [request], [lane], [item], [key])
            return request

        def release(lanes: np.ndarray) -> None:  # waiting run_sequence()s may start now
            pool.release(lanes)
            engine.wake()

        submit = functools.partial(self._step, model)
        return LiveSequence(model, pool, lanes, submit, one, release)

    def _step(
        self,
        model: str,
        inputs: Mapping[str, Any],
        lanes: np.ndarray,
        options: dict[str, Any],
        many: bool,
        before: Callable[[], None] | None = None,
    ) -> list[Request]:
        """Submit one step of the sequence on `lanes`: `inputs` of its one row, or (`many`)
        one row per lane; `before` runs once the inputs are checked (a reorder of the
        sequence's state). Plain steps join the model's StepBatcher, which forms one Work
        per step batch; a step with a priority or a timeout is a Work of its own."""
        unknown = sorted(set(options) - {"priority", "timeout", "callback"})
        if unknown:
            raise TypeError(f"step() got unexpected options {unknown}")
        loaded = self._model(model)
        steps = loaded.steps
        assert steps is not None
        if many:
            items, keys = steps.rows(inputs, lanes)
        else:
            item, key = steps.item(inputs, int(lanes[0]))
            items, keys = [item], [key]
        if before is not None:
            before()
        first = self._take_ids(len(items))
        callback = options.get("callback")
        if options.keys() - {"callback"}:
            config = loaded.config
            priority = options.get("priority")
            prio = config.priority if priority is None else priority
            timeout = options.get("timeout", config.timeout_s)
            deadline = None if timeout is None else time.perf_counter() + timeout
            engine = self._running_engine()
            requests = [
                steps.request(first + j, it, callback, engine.cancelled, priority=prio,
                              deadline=deadline)
                for j, it in enumerate(items)
            ]  # fmt: skip
            work = steps.work_of(first, requests, lanes, items, priority=prio, deadline=deadline)
            engine.submit(work)
            return requests
        cancel = functools.partial(self._cancel_step, steps)
        requests = [steps.request(first + j, it, callback, cancel) for j, it in enumerate(items)]
        self._queue_steps(steps, requests, lanes.tolist(), items, keys)
        return requests

    def _queue_steps(
        self,
        steps: StepBatcher,
        requests: Sequence[Request],
        lanes: Sequence[int],
        items: Sequence[tuple[np.ndarray, ...]],
        keys: Sequence[Any],
    ) -> None:
        """Queue steps in their StepBatcher and submit the batches they complete, under its
        lock: a cancel of one of their steps then reaches the engine after the batch."""
        engine = self._running_engine()
        with steps.lock:
            formed, new_group = steps.add(requests, lanes, items, keys)
            for work in formed:
                engine.submit_steps(work)
        if new_group:
            engine.wake()  # the loop times the new group's window

    def _cancel_step(self, steps: StepBatcher, request: Request) -> None:
        """A step request was cancelled: it leaves its StepBatcher, or the engine hears of
        it where it is in a batch already."""
        if not steps.cancelled(request) and self._engine is not None:
            self._engine.cancelled(request)

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
        loaded = self._model(model)
        pool = loaded.pool
        if pool is None:
            raise ConfigError(
                f"{self.recipe.source}: model {model!r} carries no state between steps "
                "(recipe key `state:`); run_sequence() needs a stateful model"
            )

        def make() -> SequenceRunner:
            return SequenceRunner(
                pool,
                loaded.spec,
                stepper,
                names=loaded.step_names,
                shapes=loaded.shapes,
                batch_rows=loaded.config.batch_rows,
                cohorts=stepper.cohorts,
                take_id=lambda: self._take_ids(1),
                record=self.metrics.models[model].record_steps_formed,
            )

        runner = self._sequences.runner(model, id(stepper), make)
        deadline = None if timeout is None else time.perf_counter() + timeout

        def cancel(request: Request) -> None:
            self._submit_cohorts(runner, runner.cancelled(request))

        request = Request(self._take_ids(1), model, deadline=deadline, on_cancel=cancel)
        self._submit_cohorts(runner, runner.submit(request, item))
        if deadline is not None:
            self._running_engine().wake()  # the loop times the deadline while it waits
        return request

    def _submit_cohorts(self, runner: SequenceRunner, works: list[Work]) -> None:
        """Hand a runner's step batches to the engine; one it refuses ends its sequences."""
        for work in works:
            try:
                self._running_engine().submit_steps(work)
            except Exception as e:  # e.g. Closed: the engine is stopping
                runner.refused(work, e)

    def flush(self, *, steps: bool = True, batches: bool | Literal["if_stalled"] = True) -> None:
        """Send what waits for others to form a batch now: the queued `steps` of sequences
        (which else leave once every live sequence has stepped, a cohort is complete, or the
        batching window ends), and (`batches`) the partial batches of `batching: fill`
        models; with `batches="if_stalled"`, those only when nothing else is left to run.
        `run()` flushes fill batches when its input ends (and, if stalled, when it cannot
        start more items); `wait_all()` and `close()` flush everything first."""
        engine = self._engine
        for m in self._models.values():
            batcher = m.steps
            if steps and batcher is not None and batcher.num_pending and engine is not None:
                with batcher.lock:
                    for work in batcher.flush():
                        engine.submit_steps(work)
        if batches and self._engine is not None:
            self._engine.flush(if_stalled=batches == "if_stalled")

    def infer(self, model: str, inputs: Any, timeout: float | None = None) -> Outputs:
        """Run one item and wait: its outputs, or raise its error.

        When the model is idle and its sessions may run on any thread (ONNX Runtime; not
        pyACL), the engine runs the batch of one right here on the calling thread.
        """
        engine = self._running_engine()
        names = self._lanes.get(model)
        if names is not None:  # the one-item lane, while the model is idle
            found = self._infer_in_lane(engine, model, names, inputs, timeout)
            if found is not None:
                return found
        (work,) = self._works(model, (inputs,), timeout=timeout)
        engine.run_or_submit(work)
        work.wait()
        result = work.item(0)
        if isinstance(result, BaseException):
            raise result
        return result

    def _infer_in_lane(
        self,
        engine: ExecutionEngine,
        model: str,
        names: tuple[str, ...],
        inputs: Any,
        timeout: float | None,
    ) -> Outputs | None:
        """`infer` in the engine's one-item lane (`ExecutionEngine.run_item`); None where
        the lane is closed now."""
        loaded = self._models[model]
        submitted = time.perf_counter()
        arrays = loaded.spec.normalize(inputs)
        if len(arrays) == 1:  # the common case, without loops
            (a,) = arrays
            exact: ShapeKey = (a.shape,)
            feed, nbytes = [a[None]], a.nbytes
        else:  # every input is batched on axis 0: its item shape is the array's shape
            exact = tuple(a.shape for a in arrays)
            feed, nbytes = [a[None] for a in arrays], sum(a.nbytes for a in arrays)
        value = engine.run_item(
            model, feed, exact, nbytes, submitted,  # its key: its own shapes (`takes_lane`)
            lambda: self._works(model, (inputs,), timeout=timeout)[0],
        )  # fmt: skip
        if value is None:
            return None
        if isinstance(value, BaseException):
            raise value
        if len(value) == 1:
            return {names[0]: value[0][0]}
        return {n: o[0] for n, o in zip(names, value, strict=True)}

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
        config = self.recipe.model(model)
        limit = max_in_flight or 2 * config.num_slots
        size = chunk or config.batch_rows
        if isinstance(inputs, np.ndarray):  # rows cost nothing to cut: few, large Works
            size = max(size, size * (limit // (4 * size)))

        def submit(
            items: Sequence[Any] | np.ndarray, notify: Callable[[Work], None] | None
        ) -> list[Work]:
            try:
                works = self._works(model, items, priority=priority, listener=notify)
            except InvalidInput:
                if on_error == "raise":
                    raise
                works = self._works_apart(model, items, priority, notify)
            for w in works:
                if not w.done:
                    engine.run_or_submit(w, short_only=True)
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

    def _works(
        self,
        model: str,
        items: Iterable[Any] | np.ndarray,
        *,
        per_item: bool = False,
        priority: int | None = None,
        timeout: float | None = None,
        depends_on: tuple[Request, ...] = (),
        callback: Callback | None = None,
        listener: Callable[[Work], None] | None = None,
    ) -> list[Work]:
        """Checked WAITING works for `items`, one per run of same-shape items."""
        loaded = self._model(model)
        config, spec = loaded.config, loaded.spec
        groups = spec.groups(items)
        if loaded.memory.request_bytes is not None:
            self._check_room(loaded, groups)
        prio = config.priority if priority is None else priority
        timeout = config.timeout_s if timeout is None else timeout
        now = time.perf_counter()
        deadline = None if timeout is None else now + timeout
        engine = self._running_engine()
        run = current_run.get() if config.batching == "fill" else None
        works = []
        for inputs in groups:
            exact, key, joins = loaded.shapes.keys_of_rows(inputs, spec)
            if run is not None:
                joins = (run, joins)  # anchored: two runs never share a batch
            rows = len(inputs[0]) if spec.batching else 1
            work = Work.for_items(
                self._take_ids(rows if per_item else 1),
                model,
                inputs,
                per_item=per_item,
                callback=callback,
                created=now,
                shape_key=key,
                batch_key=joins,
                exact=exact,
                names=loaded.output_names,
                batched=spec.batching,
                priority=prio,
                deadline=deadline,
                depends_on=depends_on,
                on_cancel=engine.cancelled,
                listener=listener,
                run=run,
            )
            works.append(work)
        return works

    def _works_apart(
        self,
        model: str,
        items: Sequence[Any] | np.ndarray,
        priority: int | None,
        listener: Callable[[Work], None] | None,
    ) -> list[Work]:
        """`_works` for a chunk where some item fails its input check: the runs of good
        items as Works, each failed item (or a whole array of rows) as a rejected Work."""
        names = self._model(model).output_names

        def rejected(error: InvalidInput, rows: int) -> Work:
            return Work.rejected(self._take_ids(1), model, error, rows, names)

        if isinstance(items, np.ndarray) and self._model(model).spec.takes_rows:
            try:
                return self._works(model, items, priority=priority, listener=listener)
            except InvalidInput as e:  # the rows are checked as one array
                return [rejected(e, len(items))]
        works: list[Work] = []
        good: list[Any] = []
        for item in items:
            try:
                self._works(model, (item,))  # the check alone: nothing is submitted
            except InvalidInput as e:
                if good:
                    works += self._works(model, good, priority=priority, listener=listener)
                    good = []
                works.append(rejected(e, 1))
            else:
                good.append(item)
        if good:
            works += self._works(model, good, priority=priority, listener=listener)
        return works

    def _check_room(self, loaded: LoadedModel, groups: Sequence[Item]) -> None:
        room = loaded.memory.request_bytes
        assert room is not None
        for inputs in groups:
            rows = len(inputs[0]) if loaded.spec.batching and inputs[0].ndim else 1
            size = sum(a.nbytes for a in inputs) // max(rows, 1)
            if size > room:
                raise InvalidInput(
                    f"model {loaded.config.name!r}: an item of {size} bytes does not fit what "
                    f"memory_budget_mb {loaded.config.memory_budget_mb} leaves for requests "
                    f"({room} bytes)"
                )

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
        engine = self._running_engine()
        deps = []
        for d in depends_on:
            if isinstance(d, Request):
                deps.append(d)
                continue
            found = engine.lookup(d)
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
