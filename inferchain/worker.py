"""The ModelWorker: one model instance on its own thread, with pre-allocated host buffers.

Device work (load, run, release) happens only on the worker's thread, as pyACL contexts
require. The engine sees a worker through `busy` and `dispatch()`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import attrs
import numpy as np
import structlog

from inferchain.backends.base import Backend, Session
from inferchain.config import ModelConfig
from inferchain.engine import Batch
from inferchain.errors import BackendError, ConfigError, InferchainError
from inferchain.logs import get_logger, log_safely
from inferchain.metrics import NO_STAGES, BatchTiming, ModelMetrics
from inferchain.request import Request, RequestState
from inferchain.shapes import ShapeKey, ShapePolicy, crop, stack_rows

log = get_logger(__name__)


@attrs.frozen(eq=False)
class _Prepare:
    """A queue item: adopt a shape policy and warm its shapes up on the worker thread."""

    policy: ShapePolicy
    warm: bool
    done: threading.Event


_MAX_SHAPE_BUFFERS = 16  # buffer sets kept for dynamic shapes (LRU)


class ModelWorker:
    """Owns one backend Session, its buffers and its thread.

    Life: `start()` -> `wait_ready()` (raises what `init` raised) -> `dispatch()` batches ->
    `stop()` -> `join()`. The session is released on the worker's thread after the last
    batch, so nothing is in flight when it is torn down.
    """

    def __init__(
        self,
        model: ModelConfig,
        index: int,
        backend: Backend,
        device: int,
        metrics: ModelMetrics,
        on_idle: Callable[[], None],
        finishing: Callable[[], AbstractContextManager[None]],
    ) -> None:
        """`on_idle()` tells the scheduler the worker can take work again; inside
        `finishing()` the requests' terminal hooks only queue, and leaving it runs one
        scheduling pass for the whole batch."""
        self.model = model
        self.name = f"{model.name}#{index}"
        self.busy = False  # set by the engine on dispatch, cleared here when the run returns
        self.healthy = True  # False while re-initialising after failures, or once dead
        self.dead = False  # the thread ended or the model could not be reloaded
        self.consecutive_failures = 0
        self.session: Session | None = None
        self._backend = backend
        self._device = device
        self._metrics = metrics
        self._on_idle = on_idle
        # per-batch lines only where the application configured logging (bound once: cheap)
        self._batch_log = log.bind() if structlog.is_configured() else None
        self._finishing = finishing
        self._batching = model.max_batch_size > 0
        self._queue: queue.SimpleQueue[Batch | _Prepare | None] = queue.SimpleQueue()
        self.shapes: ShapePolicy | None = None  # set by prepare(), before the first batch
        self._max_buffers = _MAX_SHAPE_BUFFERS
        self._buffers: OrderedDict[ShapeKey, list[np.ndarray]] = OrderedDict()
        self._ready = threading.Event()
        self._init_error: BaseException | None = None
        self._idle = threading.Condition()
        self._num_pending = 0  # batches dispatched and not finished
        self._run_start = self._run_end = 0.0  # perf_counter around the current Session.run
        self._thread = threading.Thread(
            target=self._main, name=f"inferchain-worker-{self.name}", daemon=True
        )

    # -- control (any thread) -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def wait_ready(self) -> Session:
        """Block until the session is loaded; re-raise the error if loading failed."""
        self._ready.wait()
        if self._init_error is not None:
            raise self._init_error
        assert self.session is not None
        return self.session

    def dispatch(self, batch: Batch) -> None:
        with self._idle:
            self._num_pending += 1
        self._queue.put(batch)

    def run_inline(self, request: Request) -> None:
        """Run a batch of one RUNNING request on the calling thread (the engine marked this
        worker busy for it). Only for sessions any thread may use (`thread_affine` False)."""
        with self._idle:
            self._num_pending += 1
        batch = Batch(self.model.name, (request,), request.shape_key, time.perf_counter())
        try:
            self._execute(batch)
        except BaseException:  # e.g. KeyboardInterrupt in the caller: the worker is fine
            if not self.dead:
                self.healthy = True
                self._on_idle()
            raise

    def wait_all(self, timeout: float | None = None) -> bool:
        """WaitForAllTaskDone: True once every dispatched batch has finished."""
        with self._idle:
            return self._idle.wait_for(lambda: self._num_pending == 0, timeout)

    def stop(self) -> None:
        """Finish the queued batches, then release the session on the worker thread."""
        self._queue.put(None)

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the worker thread ----------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._init()
        except BaseException as e:  # reported to init() through wait_ready
            self._init_error = e
            self._ready.set()
            self._release()
            return
        self._ready.set()
        try:
            while (item := self._queue.get()) is not None:
                if isinstance(item, _Prepare):
                    self._prepare(item)
                else:
                    self._execute(item)
        except BaseException as e:  # the thread is dying: nothing queued may be stranded
            self._die(e)
        finally:
            self._release()

    def _die(self, error: BaseException) -> None:
        self.dead = True
        self.healthy = False
        cause = BackendError(f"{self.name} died: {type(error).__name__}: {error}")
        while True:  # fail everything queued before anything else can go wrong
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Batch):
                self._fail(item.requests, cause, None)
                self._batch_finished()
            elif isinstance(item, _Prepare):
                item.done.set()
        self._on_idle()
        log_safely(
            log.error,
            "worker_died",
            worker=self.name,
            error=type(error).__name__,
            detail=str(error),
        )

    def _init(self) -> None:
        session = self._backend.load(self.model, self._device)
        self.session = session
        limit = session.max_batch_size
        if self._batching and limit is not None and self.model.max_batch_size > limit:
            raise ConfigError(
                f"model {self.model.name!r}: max_batch_size {self.model.max_batch_size} "
                f"exceeds the {limit} the loaded model accepts"
            )
        self._output_names = tuple(t.name for t in session.outputs)
        log.debug("worker_ready", worker=self.name, inputs=[t.describe() for t in session.inputs])

    def prepare(self, policy: ShapePolicy, warm: bool) -> None:
        """Adopt the model's shape policy; allocate (and, with `warm`, run once at the max
        batch) the buffers of every shape known now. Blocks until the worker thread did it."""
        done = threading.Event()
        self._queue.put(_Prepare(policy, warm, done))
        done.wait()
        if self._init_error is not None:
            raise self._init_error

    def _prepare(self, item: _Prepare) -> None:
        self.shapes = item.policy
        self._max_buffers = max(_MAX_SHAPE_BUFFERS, 2 * len(item.policy.buckets))
        try:
            for key in item.policy.warm_keys() if self._batching else ():
                feed = self._buffers_for(key)
                if item.warm:
                    for b in feed:
                        b.fill(0)
                    assert self.session is not None
                    self.session.run(feed, len(feed[0]))
        except Exception as e:
            self._init_error = e
        finally:
            item.done.set()

    def _buffers_for(self, key: ShapeKey) -> list[np.ndarray]:
        """Host input buffers for `key`, made once per shape (LRU for dynamic shapes)."""
        buffers = self._buffers.get(key)
        if buffers is None:
            assert self.session is not None
            rows = self.model.batch_rows
            buffers = [
                np.empty((rows, *shape), dtype=t.dtype)
                for shape, t in zip(key, self.session.inputs, strict=True)
            ]
            self._buffers[key] = buffers
            if len(self._buffers) > self._max_buffers:
                self._buffers.popitem(last=False)
        else:
            self._buffers.move_to_end(key)
        return buffers

    def _execute(self, batch: Batch) -> None:
        requests = batch.requests
        picked = time.perf_counter()
        self._run_start = self._run_end = picked
        try:
            outputs = self._run(batch)
        except BaseException as e:
            self.consecutive_failures += 1
            unhealthy = self.consecutive_failures >= self.model.health.max_failures
            if unhealthy or not isinstance(e, Exception):
                self.healthy = False  # before the engine hears we are idle
            with self._finishing():
                self._fail(requests, e, self._timing(batch, picked, ok=False))
                self.busy = False
            if not isinstance(e, Exception):
                raise  # the thread dies; _main fails whatever is still queued
            if unhealthy:
                self._recover()
        else:
            self.consecutive_failures = 0
            with self._finishing():  # the requests' hooks only queue; one pass at the end
                self._deliver(requests, outputs, self._timing(batch, picked, ok=True))
                self.busy = False
        finally:
            self._batch_finished()

    def _batch_finished(self) -> None:
        with self._idle:
            self._num_pending -= 1
            if self._num_pending == 0:
                self._idle.notify_all()

    def _recover(self) -> None:
        """Re-initialise the session after `max_failures` failed batches in a row."""
        log_safely(
            log.warning, "worker_unhealthy", worker=self.name, failures=self.consecutive_failures
        )
        self._release()
        try:
            self._init()
        except Exception as e:
            self._die(e)
            return
        self.consecutive_failures = 0
        self.healthy = True
        log_safely(log.info, "worker_recovered", worker=self.name)
        self._on_idle()

    def _run(self, batch: Batch) -> Sequence[np.ndarray]:
        session = self.session
        if session is None:
            raise BackendError(f"{self.name} has no loaded model (it failed to re-initialise)")
        requests = batch.requests
        n = len(requests)
        if not self._batching:
            self._run_start = time.perf_counter()
            outputs = session.run(requests[0].inputs, 1)
            self._run_end = time.perf_counter()
            return outputs
        feed = []
        pad = self.shapes.pad_value if self.shapes is not None else 0.0
        for i, buffer in enumerate(self._buffers_for(batch.shape_key)):
            view = buffer[:n]
            stack_rows(view, [r.inputs[i] for r in requests], pad)
            feed.append(view)
        self._run_start = time.perf_counter()
        outputs = session.run(feed, n)
        self._run_end = time.perf_counter()
        if session.reuses_outputs:
            return [np.array(o[:n]) for o in outputs]
        return [o[:n] for o in outputs]

    def _timing(self, batch: Batch, picked: float, ok: bool) -> BatchTiming:
        stages = getattr(self.session, "last_stages", None)
        return BatchTiming(
            model=batch.model,
            worker=self.name,
            size=batch.size,
            shape_key=batch.shape_key,
            ok=ok,
            picked=picked,
            run_start=self._run_start,
            run_end=self._run_end,
            end=time.perf_counter(),
            stages=dict(stages) if stages else NO_STAGES,
        )

    def _deliver(
        self, requests: Sequence[Request], outputs: Sequence[np.ndarray], timing: BatchTiming
    ) -> None:
        names = self._output_names
        done = RequestState.DONE
        if self._batching:
            crops = self.shapes.crops if self.shapes is not None else ()
            for request, row in zip(requests, zip(*outputs, strict=True), strict=False):
                if crops and request.shape_key != tuple(a.shape for a in request.inputs):
                    row = tuple(crop(row, request.inputs, crops))
                request.try_transition(done, outputs=dict(zip(names, row, strict=True)))
        else:
            requests[0].try_transition(done, outputs=dict(zip(names, outputs, strict=True)))
        self._metrics.record_batch(requests, ok=True, timing=timing)
        if self._batch_log is not None and self._batch_log.is_enabled_for(logging.INFO):
            log_safely(  # the canonical line per batch
                self._batch_log.info,
                "batch",
                model=self.model.name,
                worker=self.name,
                size=len(requests),
                shape=[list(s) for s in timing.shape_key],
                run_ms=round((timing.run_end - timing.run_start) * 1e3, 3),
                batch_ms=round((timing.end - timing.picked) * 1e3, 3),
                request_ids=[requests[0].id, requests[-1].id],
            )

    def _fail(
        self, requests: Sequence[Request], error: BaseException, timing: BatchTiming | None
    ) -> None:
        if not isinstance(error, InferchainError):
            error = BackendError(f"{self.name}: {type(error).__name__}: {error}")
        for request in requests:  # first: nothing may stay unfinished, whatever comes next
            request.try_transition(RequestState.ERROR, error=error)
        self._metrics.record_batch(requests, ok=False, timing=timing)
        log_safely(
            log.error,
            "batch_failed",
            worker=self.name,
            request_id=[r.id for r in requests],
            error=type(error).__name__,
            code=getattr(error, "code", None),
            code_name=getattr(error, "name", None),
            detail=str(error),
        )

    def _release(self) -> None:
        session, self.session = self.session, None
        self._buffers.clear()
        if session is None:
            return
        try:
            session.close()
        except Exception:
            log.exception("session_close_failed", worker=self.name)
