"""OfflineInference: the entry layer. Inputs become Requests; init once, infer many times."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from inferchain.backends.base import Backend, make_backend
from inferchain.callbacks import CallbackThread
from inferchain.config import ModelConfig, Recipe, load_recipe
from inferchain.engine import ExecutionEngine
from inferchain.errors import Closed, ConfigError, InvalidInput
from inferchain.inputs import InputSpec
from inferchain.logs import get_logger
from inferchain.memory import MemoryPlan
from inferchain.metrics import Metrics, Stats
from inferchain.models import LoadedModel, all_workers, load_models, stop_workers
from inferchain.pipeline import Pipeline, PipelineDriver, load_pipeline
from inferchain.request import Callback, Outputs, Request, RequestState
from inferchain.scheduler import Scheduler
from inferchain.shapes import ShapePolicy
from inferchain.streaming import stream
from inferchain.tensors import ModelInfo

log = get_logger(__name__)

_Phase = Literal["new", "running", "closing", "closed"]
_FAILED_KEPT = 65536  # failed requests remembered for depends_on by id


class OfflineInference:
    """Runs a recipe's models in this process.

    `init()` loads every model once (each worker on its own thread) and starts the threads;
    `submit`/`infer`/`map`/`run` may then be called any number of times, from any thread;
    `close()` stops intake, drains, cancels what is left and joins every thread it started.
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
        self._lock = threading.Lock()
        self._local = threading.local()  # per thread: inside a worker's _finishing()?
        self._ids = itertools.count(1)
        self._live: dict[int, Request] = {}  # submitted, not yet terminal
        self._failed: dict[int, Request] = {}  # the latest that ended without outputs, by id
        self._outstanding = 0  # submitted, not yet terminal
        self._drained = threading.Condition(self._lock)
        self._models: dict[str, LoadedModel] = {}  # after init()
        self._callbacks = CallbackThread()
        self._scheduler: Scheduler | None = None
        self._pipeline: Pipeline | None = None
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
        backend = self._backend or make_backend(self.recipe, acl_module=self._acl_module)
        self._backend = backend
        try:
            self._models = load_models(
                self.recipe, backend, self.metrics, self._wake, self._finishing
            )
        except BaseException:
            backend.close()
            self._phase = "closed"
            raise
        engine = ExecutionEngine(
            self.recipe.models, {name: m.workers for name, m in self._models.items()}
        )
        self._scheduler = Scheduler(
            self.recipe.scheduler,
            self.recipe.models,
            engine,
            {name: p.request_bytes for name, p in self.memory.items()},
        )
        self._scheduler.start()
        self._callbacks.start()
        self._phase = "running"
        if self.recipe.pipeline:
            try:
                self._pipeline = load_pipeline(self.recipe, self)
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

    @contextlib.contextmanager
    def _finishing(self) -> Iterator[None]:
        """A worker finishing a batch: terminal hooks only queue; one pass at the end."""
        local = self._local
        local.deferred = True
        try:
            yield
        finally:
            local.deferred = False
            self._wake()

    def _wake(self) -> None:
        """A worker became idle or healthy again: schedule now, on its thread if possible."""
        if self._scheduler is not None:
            self._scheduler.poke()

    def close(self, drain_timeout: float | None = None) -> None:
        """Stop intake, drain (bounded), cancel the rest, join every thread, release models.

        Safe to call twice, from any thread, including from a callback.
        """
        with self._lock:
            if self._phase in ("closing", "closed"):
                return
            was_running = self._phase == "running"
            self._phase = "closing"
        if was_running:
            timeout = (
                self.recipe.scheduler.drain_timeout_s if drain_timeout is None else drain_timeout
            )
            if not self.wait_all(timeout):
                self.cancel_all()
                self.wait_all(None if self._on_worker_thread() else 30.0)
            assert self._scheduler is not None
            self._scheduler.stop()
        stop_workers(all_workers(m.workers for m in self._models.values()))
        if self._backend is not None:
            self._backend.close()
        self._callbacks.stop()
        self._phase = "closed"
        log.info("closed", recipe=self.recipe.name)

    def _on_worker_thread(self) -> bool:
        me = threading.current_thread().name
        return me.startswith("inferchain-")

    def __enter__(self) -> Self:
        return self.init()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(drain_timeout=0.0 if exc is not None else None)

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
        items: Iterable[Any],
        *,
        priority: int | None = None,
        timeout: float | None = None,
        depends_on: Iterable[Request | int] = (),
        callback: Callback | None = None,
        block: bool = True,
    ) -> list[Request]:
        """`submit` for many items at once: all are checked before any is queued."""
        scheduler = self._running_scheduler()
        requests = self._make_requests(
            model, items, priority, timeout, self._resolve(depends_on), callback
        )
        try:
            scheduler.submit(requests, block=block)
        except BaseException:
            for r in requests:
                r.cancel()
            raise
        return requests

    def _make_requests(
        self,
        model: str,
        items: Iterable[Any],
        priority: int | None,
        timeout: float | None,
        deps: tuple[Request, ...],
        callback: Callback | None,
    ) -> list[Request]:
        """Checked, registered WAITING requests (not yet queued anywhere)."""
        spec = self._spec(model)
        config = self.recipe.model(model)
        prio = config.priority if priority is None else priority
        timeout = config.timeout_s if timeout is None else timeout
        deadline = None if timeout is None else time.perf_counter() + timeout
        hook = self._finished if callback is None else self._finished_with_callback
        arrays = [spec.normalize(item) for item in items]
        policy = self._models[model].shapes
        keys = [policy.key(a) for a in arrays]
        room = self._models[model].memory.request_bytes
        if room is not None:
            for a in arrays:
                if (size := sum(x.nbytes for x in a)) > room:
                    raise InvalidInput(
                        f"model {model!r}: an item of {size} bytes does not fit what "
                        f"memory_budget_mb {config.memory_budget_mb} leaves for requests "
                        f"({room} bytes)"
                    )
        with self._lock:
            if self._phase != "running":
                raise Closed(f"cannot submit: the OfflineInference is {self._phase}")
            requests = [
                Request(
                    next(self._ids),
                    model,
                    a,
                    priority=prio,
                    deadline=deadline,
                    depends_on=deps,
                    callback=callback,
                    on_terminal=hook,
                    shape_key=key,
                )
                for a, key in zip(arrays, keys, strict=True)
            ]
            self._outstanding += len(requests)
            live = self._live
            for r in requests:
                live[r.id] = r
        return requests

    def _running_scheduler(self) -> Scheduler:
        if self._phase != "running" or self._scheduler is None:
            hint = "call init() first" if self._phase == "new" else "create a new OfflineInference"
            raise Closed(f"cannot submit: the OfflineInference is {self._phase} ({hint})")
        return self._scheduler

    def _spec(self, model: str) -> InputSpec:
        return self._model(model).spec

    def _model(self, model: str) -> LoadedModel:
        found = self._models.get(model)
        if found is None:
            raise InvalidInput(f"no model named {model!r} (models: {', '.join(self._models)})")
        return found

    def _resolve(self, depends_on: Iterable[Request | int]) -> tuple[Request, ...]:
        deps = []
        for d in depends_on:
            if isinstance(d, Request):
                deps.append(d)
                continue
            found = self._live.get(d) or self._failed.get(d)
            if found is not None:
                deps.append(found)
            elif not 0 < d < self._next_id():
                raise InvalidInput(f"depends_on: no request with id {d} was submitted here")
            # else: it finished DONE, so the dependency holds
        return tuple(deps)

    def _next_id(self) -> int:
        with self._lock:
            nxt = next(self._ids)
            self._ids = itertools.count(nxt)
        return nxt

    def _finished(self, request: Request) -> None:
        """Terminal hook of every Request (runs on the finishing thread)."""
        self._live.pop(request.id, None)
        if request.outputs is None:  # remembered so that depends_on=[id] fails later too
            failed = self._failed
            failed[request.id] = request
            if len(failed) > _FAILED_KEPT:
                failed.pop(next(iter(failed)), None)
        scheduler = self._scheduler
        if scheduler is not None:
            scheduler.notify_finished(request, wake=not getattr(self._local, "deferred", False))
        with self._lock:
            self._outstanding -= 1
            if self._outstanding == 0:
                self._drained.notify_all()

    def _finished_with_callback(self, request: Request) -> None:
        self._finished(request)
        self._callbacks.put(request)

    # -- convenience ----------------------------------------------------------------------

    def infer(self, model: str, inputs: Any, timeout: float | None = None) -> Outputs:
        """Run one item and wait: its outputs, or raise the request's error.

        When the model is idle (nothing waiting or ready, a worker free) and its backend lets
        any thread run a session (ONNX Runtime; not pyACL), the batch of one runs right here
        on the calling thread, through the same worker code: no thread hand-off at all.
        """
        scheduler = self._running_scheduler()
        (request,) = self._make_requests(model, (inputs,), None, timeout, (), None)
        loaded = self._models[model]
        worker = None
        if not getattr(self._backend, "thread_affine", True):
            worker = scheduler.claim_idle(model, request, loaded.workers)
        if worker is not None:
            worker.run_inline(request)
        else:
            try:
                scheduler.submit([request])
            except BaseException:
                request.cancel()
                raise
        return request.result()

    def map(
        self,
        model: str,
        inputs: Iterable[Any],
        *,
        ordered: bool = True,
        max_in_flight: int | None = None,
        priority: int | None = None,
    ) -> Iterator[Outputs]:
        """Stream items through `model`, keeping at most `max_in_flight` submitted.

        Yields outputs in input order (or as they finish with `ordered=False`). An item's
        error is raised at its turn; what is still in flight is then cancelled.
        """
        config = self.recipe.model(model)
        limit = max_in_flight or 2 * config.num_slots
        return stream(
            lambda items: self.submit_many(model, items, priority=priority),
            inputs,
            limit=limit,
            ordered=ordered,
        )

    def run(
        self,
        items: Iterable[Any],
        *,
        max_in_flight: int = 64,
        on_error: Literal["raise", "return"] = "raise",
    ) -> Iterator[Any]:
        """The recipe's pipeline over `items`: one result per item, in order, streaming.

        Without a pipeline, a one-model recipe maps items through that model. With
        `on_error="return"` a failed item yields its exception instead of raising.
        """
        pipeline = self._pipeline or self._default_pipeline()
        driver = PipelineDriver(pipeline, max_in_flight=max_in_flight, on_error=on_error)
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

    # -- waiting, cancelling, introspection -----------------------------------------------

    def wait_all(self, timeout: float | None = None) -> bool:
        """WaitForAllTaskDone: True once every submitted request is terminal."""
        with self._drained:
            ok = self._drained.wait_for(lambda: self._outstanding == 0, timeout)
        if ok:
            for w in all_workers(m.workers for m in self._models.values()):
                w.wait_all(timeout)
        return ok

    def cancel_all(self) -> int:
        """Cancel every request not yet running; returns how many were cancelled."""
        cancelled = 0
        for request in list(self._live.values()):
            if request.state <= RequestState.READY and request.cancel():
                cancelled += 1
        return cancelled

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

    def queue_depths(self) -> Mapping[str, int]:
        return self._scheduler.queue_depths() if self._scheduler else {}

    @property
    def num_outstanding(self) -> int:
        return self._outstanding
