"""The ModelWorker: one model instance on its own thread, with its streams and buffers.

Device work (load, run, release) happens only on the worker's thread, as pyACL contexts
require. The engine hands it a `Batch` on one of its streams (`dispatch`); the worker fills
the stream's input buffers, launches the batch, keeps up to `num_streams` batches in flight,
and posts a `BatchResult` for each to its outbox. It never calls a layer above it. `healthy`
and `dead` are written only here; the engine reads them.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from inferchain.backends.base import Backend, Session
from inferchain.config import ModelConfig
from inferchain.core.buffers import HostBuffers
from inferchain.core.records import (
    NO_STAGES,
    Batch,
    BatchResult,
    BatchTiming,
    WorkerChanged,
)
from inferchain.core.state_pool import StatePool
from inferchain.errors import (
    BackendError,
    ConfigError,
    InferchainError,
    LoadError,
    OutputMismatch,
    StateLost,
)
from inferchain.layout import Axis, Layout, rows_first
from inferchain.logs import get_logger, log_safely
from inferchain.output_rows import OutputProbe, check_rows, probe_session
from inferchain.shapes import ShapeKey, ShapePolicy
from inferchain.tensors import StateRows, TensorDesc

log = get_logger(__name__)

Outbox = Callable[[BatchResult | WorkerChanged], None]


@attrs.frozen(eq=False)
class _Prepare:
    """A queue item: adopt a shape policy and warm its shapes up on the worker thread."""

    policy: ShapePolicy
    warm: bool
    done: threading.Event
    device_state: bool = False  # try to keep the pool's state in the session's device lanes
    probe: bool = False  # run the model at one or two batch sizes and check its real outputs


@attrs.define
class _InFlight:
    """A launched batch, until its stream is collected."""

    batch: Batch
    picked: float  # taken from the queue
    run_start: float  # the backend was called
    error: BaseException | None = None  # the launch failed
    # a multi-step batch, run at collect: its first step's feed and device state rows
    steps: tuple[list[np.ndarray], StateRows | None] | None = None


_RECOVER = object()  # a queue item: re-initialise the session (after an inline failure)


def _startup_error(error: BaseException) -> BaseException:
    """What `init()` raises for `error` met while loading or warming up: a runtime failure
    there is a LoadError (not a request's BackendError); anything else as it is."""
    if isinstance(error, BackendError):
        load_error = LoadError.from_backend(error)
        load_error.__cause__ = error
        return load_error
    return error


def _on_axes(layout: Layout) -> str:
    """For the max_batch_size message: the batch axes it was read on, when not all 0."""
    axes = [a for a in layout.inputs if a is not None]
    return f" (its fixed batch dims, on the inputs' batch axes {axes})" if any(axes) else ""


def _step_count(batch: Batch) -> int:
    """Steps the batch runs: K for a multi-step batch of sequence steps (alone in its
    batch), else 1."""
    steps = batch.slices[0].work.steps
    return 1 if steps is None else steps.count


def _state_rows(batch: Batch) -> StateRows | None:
    """Where the steps of `batch` keep their state on the device; None for a batch that
    holds no steps (steps batch only with steps, so it is all or none)."""
    parts = []
    for s in batch.slices:
        rows = s.work.state_rows
        if rows is None:
            return None
        parts.append(rows.part(s.start, s.stop))
    return StateRows.join(parts)


def _laid_out(rows: np.ndarray, axis: Axis) -> np.ndarray:
    """Rows (on axis 0) as one contiguous input with them on `axis` (a batched input's)."""
    assert axis is not None
    return np.ascontiguousarray(rows if axis == 0 else np.moveaxis(rows, 0, axis))


class ModelWorker:
    """Owns one backend Session, its streams, its buffers and its thread.

    Life: `start()` -> `wait_ready()` (raises what loading raised) -> `prepare()` ->
    `dispatch()` batches -> `stop()` -> `join()`. The session is released on the worker's
    thread after the last batch, so nothing is in flight when it is torn down.
    """

    def __init__(
        self, model: ModelConfig, index: int, backend: Backend, device: int, outbox: Outbox
    ) -> None:
        self.model = model
        self.index = index
        self.name = f"{model.name}#{index}"
        self.healthy = True  # False while re-initialising after failures, or once dead
        self.dead = False  # the thread ended or the model could not be reloaded
        self.num_streams = 1  # batches in flight at once (the session's, once loaded)
        self.consecutive_failures = 0
        self.session: Session | None = None
        self.shapes: ShapePolicy | None = None  # set by prepare(), before the first batch
        self.pool: StatePool | None = None  # a stateful model's lanes: carried outputs go there
        self.state_on_device = False  # ... or into the session's device lanes (prepare())
        # the session runs a batch in one call (`Session.run`, no launch ahead of collect)
        # and times neither stages nor its device: `run_timings` may time its batches
        self.at_once = False
        self._backend = backend
        self._device = device
        self._outbox = outbox
        self._batching = model.max_batch_size > 0
        self._queue: queue.SimpleQueue[Batch | _Prepare | object | None] = queue.SimpleQueue()
        self._buffers: HostBuffers | None = None
        self._moved_outputs: tuple[tuple[int, int], ...] = ()  # (output, its batch axis) != 0
        # what `collect` returns and where each keeps its rows (checked on every batch)
        self._returned: tuple[tuple[TensorDesc, ...], tuple[int, ...]] = ((), ())
        self._rows_first = True  # every output keeps its rows on axis 0
        # ... and the session returns new arrays of exactly the rows asked for (checked)
        self._plain_rows = False
        self.probed: OutputProbe | None = None  # the real output shapes (prepare with probe)
        self._sizes: dict[ShapeKey, int] = {}  # elements of one row, per item shape key
        self._layout: Layout | None = None
        self._unbatched = False  # the model has unbatched inputs (no warm-up with zeros)
        self._in_flight: deque[_InFlight] = deque()
        self._ready = threading.Event()
        self._init_error: BaseException | None = None
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

    def prepare(
        self, policy: ShapePolicy, warm: bool, device_state: bool = False, probe: bool = False
    ) -> None:
        """Adopt the model's shape policy; allocate (and, with `warm`, run once at the max
        batch) the buffers of every shape known now; with `device_state`, ask the session
        to keep the pool's state in device lanes (`state_on_device` says if it does); with
        `probe`, first run the model at one or two batch sizes and refuse it (`ConfigError`)
        where an output does not hold the rows on its batch axis (`probed` keeps what it
        returned). Blocks until the worker thread did it."""
        done = threading.Event()
        self._queue.put(_Prepare(policy, warm, done, device_state, probe))
        done.wait()
        if self._init_error is not None:
            raise self._init_error

    def dispatch(self, batch: Batch) -> None:
        """Queue a batch (the engine's loop thread)."""
        self._queue.put(batch)

    def run_inline(self, batch: Batch) -> BatchResult:
        """Run one batch on the calling thread and return its result, for the engine's
        run-now path (only for sessions any thread may use, on a worker the engine has
        reserved: nothing of it is in flight). A worker that turns unhealthy here is
        re-initialised on its own thread."""
        result, _ = self._collect(self._launch(batch), inline=True)
        if not self.healthy and not self.dead:
            self._queue.put(_RECOVER)
        return result

    @property
    def takes_items(self) -> bool:
        """Its session takes one item's arrays as they are with a row axis added (every
        input batched on axis 0, no sequence state): the engine's one-item lane may run it."""
        return self.pool is None and self._buffers is not None and self._buffers.plain

    def run_item(
        self, feed: list[np.ndarray], stream: int, rows: int = 1
    ) -> tuple[tuple[np.ndarray, ...] | Exception, float, float]:
        """Run a batch of `rows` rows, `feed` (the session's inputs as they are, rows on
        axis 0), on the calling thread, for the engine's one-item lane and run-now stretch
        (on a worker it reserved, with a session any thread may use: `takes_items`): its
        outputs (their rows checked as every batch's) or the exception the run raised
        (`failed_inline` handles it as the loop's), and when the run started and ended."""
        session = self.session
        run_start = time.perf_counter()
        try:
            if session is None:
                raise BackendError(f"{self.name} has no loaded model (it failed to re-initialise)")
            if self.at_once:
                outputs = self._outputs(session.run(feed, rows), rows)
            else:
                session.launch(feed, rows, stream)
                outputs = self._outputs(session.collect(stream), rows)
        except Exception as e:
            return e, run_start, time.perf_counter()
        self.consecutive_failures = 0
        return outputs, run_start, time.perf_counter()

    def failed_inline(
        self, batch: Batch, picked: float, run_start: float, error: Exception
    ) -> BatchResult:
        """What `run_inline(batch)` returns where its run raised `error`: the one-item
        lane's failure, counted, logged and re-initialised after as the loop's is."""
        flight = _InFlight(batch, picked, run_start, error)
        result, _ = self._collect(flight, inline=True)
        if not self.healthy and not self.dead:
            self._queue.put(_RECOVER)
        return result

    def item_timing(
        self,
        key: ShapeKey,
        stream: int,
        picked: float,
        run_start: float,
        run_end: float,
        rows: int = 1,
    ) -> BatchTiming:
        """The timing record of a `run_item` batch of `rows` rows of item shapes `key`."""
        if self.at_once:  # nothing to ask the session
            end = time.perf_counter()
            return self._run_timing(key, stream, rows, picked, max(run_start, picked), run_end,
                                    end, self._padding(key, rows))  # fmt: skip
        return self._timing_of(
            self.model.name, key, rows, stream, picked, run_start, run_end,
            self._padding(key, rows),
        )  # fmt: skip

    def run_timings(
        self, key: ShapeKey, stream: int, runs: Sequence[tuple[int, float, float]]
    ) -> list[BatchTiming]:
        """The timing records of `run_item` batches of item shapes `key` on a session that
        runs `at_once`, from (rows, run start, run end) each: the engine's run-now stretch
        times its batches so and makes their records once it has run them."""
        elements: dict[int, tuple[int, int]] = {}
        timings = []
        for rows, start, end in runs:
            counted = elements.get(rows)
            if counted is None:
                counted = elements[rows] = self._padding(key, rows)
            timings.append(self._run_timing(key, stream, rows, start, start, end, end, counted))
        return timings

    def _run_timing(
        self,
        key: ShapeKey,
        stream: int,
        rows: int,
        picked: float,
        start: float,
        end: float,
        posted: float,
        elements: tuple[int, int],
    ) -> BatchTiming:
        """A finished batch's timing record on a session that runs `at_once`."""
        return BatchTiming(self.model.name, self.name, rows, key, True, picked, start, end,
                           posted, NO_STAGES, stream, 0, *elements)  # fmt: skip

    def stop(self) -> None:
        """Finish the queued batches, then release the session on the worker thread."""
        self._queue.put(None)

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- the worker thread ----------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._init()
        except BaseException as e:  # reported to init() through wait_ready
            self._init_error = _startup_error(e)
            self._ready.set()
            self._release()
            return
        self._ready.set()
        try:
            self._serve()
        except BaseException as e:  # the thread is dying: nothing queued may be stranded
            self._die(e)
        finally:
            self._release()

    def _serve(self) -> None:
        in_flight = self._in_flight
        get = self._queue.get
        while True:
            if in_flight and (len(in_flight) >= self.num_streams or self._queue.empty()):
                self._finish(in_flight.popleft())
                continue
            item = get()
            if item is None:
                break
            if isinstance(item, _Prepare):
                self._prepare(item)
            elif isinstance(item, Batch):
                in_flight.append(self._launch(item))
            else:  # _RECOVER
                self._recover()
        while in_flight:
            self._finish(in_flight.popleft())

    def _finish(self, flight: _InFlight) -> None:
        """Collect a launched batch and post its result; then, after a crash, end the
        thread, or after too many failures in a row, re-initialise the session."""
        result, crash = self._collect(flight)
        self._outbox(result)
        if crash is not None:
            raise crash
        if not self.healthy:
            self._recover()

    def _init(self) -> None:
        session = self._backend.load(self.model, self._device)
        self.session = session
        kind = type(session)
        self.at_once = (  # see `at_once` in __init__
            kind.launch is Session.launch
            and kind.collect is Session.collect
            and kind.take_device_spans is Session.take_device_spans
            and session.last_stages is None
        )
        layout = Layout.of(self.model, session.inputs, session.outputs)
        limit = session.max_batch_size
        if self._batching and limit is not None and self.model.max_batch_size > limit:
            raise ConfigError(
                f"model {self.model.name!r}: max_batch_size {self.model.max_batch_size} "
                f"exceeds the {limit} the loaded model accepts{_on_axes(layout)}: set "
                f"max_batch_size: {limit} (and more `instances` for throughput), or re-export "
                "the model with a dynamic batch dim (docs/own-model.md)"
            )
        self.num_streams = max(1, session.num_streams)
        self._layout = layout
        self._moved_outputs = layout.moved_outputs
        self._returned = (session.outputs, layout.outputs)
        self._rows_first = all(a == 0 for a in layout.outputs)
        self._plain_rows = (
            self._batching
            and self._rows_first
            and not self._moved_outputs
            and not session.reuses_outputs
        )
        self._unbatched = bool(layout.unbatched)
        pad = self.shapes.pad_values if self.shapes is not None else 0.0
        self._buffers = HostBuffers(session.inputs, self.model.batch_rows, pad, layout.inputs)
        log.debug("worker_ready", worker=self.name, inputs=[t.describe() for t in session.inputs])

    def _prepare(self, item: _Prepare) -> None:
        self.shapes = item.policy
        try:
            assert self._buffers is not None and self.session is not None
            self._buffers.pad_values = item.policy.pad_values
            self._buffers.max_sets = max(self._buffers.max_sets, 2 * len(item.policy.buckets))
            # zeros may not be a value an unbatched input accepts (a sampling rate of 0):
            # such a model gets its buffers but no warm-up run
            warm = item.warm and not self._unbatched
            keys = item.policy.warm_keys() if self._batching else []
            probed = warm and item.probe and bool(keys)
            if probed:  # its run at the max batch is the first key's warm-up
                self._probe(keys[0])
            for key in keys:
                for stream in range(self.num_streams):
                    feed = self._buffers.zeros(stream, key)
                    if warm and not (probed and key == keys[0] and stream == 0):
                        self.session.run(feed, self.model.batch_rows)
            if item.device_state and self.pool is not None:
                self.state_on_device = self._open_state()
            self.session.take_device_spans()  # the warm-up's and probe's runs are no batch's
        except Exception as e:
            self._init_error = _startup_error(e)
        finally:
            item.done.set()

    def _probe(self, key: tuple[tuple[int, ...], ...]) -> None:
        """Run zeros of shape `key` at one or two batch sizes; `ConfigError` where an output
        does not have the rows on its batch axis, a warning where it contradicts its
        declared shape."""
        session, layout = self.session, self._layout
        assert session is not None and layout is not None
        seen, verdict = probe_session(self.model.name, session, layout, self.model.batch_rows, key)
        self.probed = seen
        for warning in verdict.warnings:
            log_safely(log.warning, "output_shape_differs", model=self.model.name, detail=warning)
        if verdict.errors:
            raise ConfigError("; ".join(verdict.errors))

    def _open_state(self) -> bool:
        assert self.session is not None and self.pool is not None and self._layout is not None
        carried = [(out, i) for out, i, _ in self.pool.carried]
        on_device = self.session.open_state(carried, self.pool.size, self.pool.constant)
        if on_device:  # `collect` returns only the outputs that are not carried
            outs = {out for out, _ in carried}
            kept = [i for i in range(len(self.session.outputs)) if i not in outs]
            axes = tuple(self._layout.outputs[i] for i in kept)
            self._returned = (tuple(self.session.outputs[i] for i in kept), axes)
            self._moved_outputs = tuple((k, a) for k, a in enumerate(axes) if a != 0)
            self._plain_rows = self._plain_rows and not self._moved_outputs
        return on_device

    # -- one batch ------------------------------------------------------------------------

    def _launch(self, batch: Batch) -> _InFlight:
        """Fill the stream's buffers and start the batch. A failure here is reported when
        the batch is collected, so results still come back in launch order."""
        picked = time.perf_counter()
        flight = _InFlight(batch, picked, picked)
        try:
            session = self.session
            if session is None:
                raise BackendError(f"{self.name} has no loaded model (it failed to re-initialise)")
            assert self._buffers is not None
            feed = self._buffers.feed(batch)
            state = _state_rows(batch) if self.state_on_device else None
            if state is not None:
                assert self.pool is not None
                if self.pool.launching(state):
                    raise self.pool.lost_error()
            flight.run_start = time.perf_counter()
            if self.pool is not None and _step_count(batch) > 1:  # step after step at collect
                flight.steps = (feed, state)
            else:  # `state`: steps whose state is in the session's device lanes
                session.launch(feed, self._rows(batch), batch.stream, state)
        except Exception as e:
            flight.error = e
        return flight

    def _collect(
        self, flight: _InFlight, inline: bool = False
    ) -> tuple[BatchResult, BaseException | None]:
        """The batch's result, and the exception that must end the thread, if any."""
        batch = flight.batch
        error: BaseException | None = flight.error
        outputs: tuple[np.ndarray, ...] | None = None
        if error is None:
            try:
                assert self.session is not None
                if flight.steps is not None:
                    outputs = self._run_steps(batch, *flight.steps)
                else:
                    outputs = self._outputs(self.session.collect(batch.stream), batch.rows)
                    if self.pool is not None and not self.state_on_device:
                        self.pool.write_back(batch, outputs)
            except Exception as e:
                error = e
            except BaseException as e:
                if inline:  # e.g. KeyboardInterrupt in the caller: the worker is fine
                    raise
                error = e
        run_end = time.perf_counter()
        if error is None:
            self.consecutive_failures = 0
            return BatchResult(batch, outputs, None, self._timing(flight, run_end, ok=True)), None
        if isinstance(error, StateLost | OutputMismatch):  # not the session's: no failure
            if isinstance(error, OutputMismatch):
                ids = [s.work.id for s in batch.slices]
                log_safely(log.error, "batch_failed", worker=self.name, work_id=ids,
                           error="OutputMismatch", detail=str(error))  # fmt: skip
            timing = self._timing(flight, run_end, ok=False)
            return BatchResult(batch, None, error, timing), None
        crash = None if isinstance(error, Exception) else error
        self.consecutive_failures += 1
        was_healthy = self.healthy
        if crash is not None or self.consecutive_failures >= self.model.health.max_failures:
            self.healthy = False  # before the engine hears of the result
        if not isinstance(error, InferchainError):
            error = BackendError(f"{self.name}: {type(error).__name__}: {error}")
        log_safely(
            log.error,
            "batch_failed",
            worker=self.name,
            work_id=[s.work.id for s in batch.slices],
            error=type(error).__name__,
            code=getattr(error, "code", None),
            code_name=getattr(error, "name", None),
            detail=str(error),
        )
        timing = self._timing(flight, run_end, ok=False)
        return BatchResult(batch, None, error, timing, was_healthy and not self.healthy), crash

    def _run_steps(
        self, batch: Batch, feed: list[np.ndarray], state: StateRows | None
    ) -> tuple[np.ndarray, ...]:
        """Run the K steps of a multi-step batch one after the other (a cohort's Work, alone
        in its batch), each step's carried outputs the next one's carried inputs; every
        output comes back as [rows, K, *item]. The carried state of the last step goes to
        the pool's lanes (or stays in the device lanes)."""
        assert self.session is not None and self.pool is not None and self._layout is not None
        session, n, stream = self.session, batch.rows, batch.stream
        size = self._rows(batch)
        s = batch.slices[0]
        steps = s.work.steps
        assert steps is not None and steps.ahead is not None
        in_axes = self._layout.inputs
        feed = list(feed)
        stacked: list[np.ndarray] = []
        outputs: tuple[np.ndarray, ...] = ()
        for k in range(steps.count):
            if k:
                for i, rows in steps.ahead.items():  # this step's rows, in the model's layout
                    feed[i] = _laid_out(rows[s.start : s.stop, k], in_axes[i])
                if state is None:  # the state the last step left (its rows first)
                    for out, i, _ in self.pool.carried:
                        feed[i] = _laid_out(outputs[out], in_axes[i])
            session.launch(feed, size, stream, state)
            outputs = self._outputs(session.collect(stream), n)
            if k == 0 and state is not None:  # in the device lanes now, for every row
                state = state.stepped()
            if not stacked:
                stacked = [np.empty((n, steps.count, *o.shape[1:]), o.dtype) for o in outputs]
            for whole, o in zip(stacked, outputs, strict=True):
                whole[:, k] = o
        if state is None:
            self.pool.write_back(batch, outputs)
        return tuple(stacked)

    def _rows(self, batch: Batch) -> int:
        """The batch size the session is told: the batch's rows (0 where the model takes
        its inputs whole)."""
        return batch.rows if self._batching else 0

    def _outputs(self, outputs: Sequence[np.ndarray], n: int) -> tuple[np.ndarray, ...]:
        """The first `n` rows of each output, on axis 0 (a model that does not batch: the
        outputs whole)."""
        if self._plain_rows:  # the common case, checked in one loop
            for o in outputs:
                if o.ndim == 0 or len(o) != n:
                    break
            else:
                return tuple(outputs)
        assert self.session is not None
        if not self._batching:
            return tuple(outputs)
        descs, axes = self._returned
        padded = self.session.max_batch_size
        if self._rows_first:  # the common case, checked without a call
            for o in outputs:
                if o.ndim == 0 or (len(o) != n and len(o) != padded):
                    check_rows(self.model.name, descs, axes, outputs, n, padded)  # raises
        else:
            check_rows(self.model.name, descs, axes, outputs, n, padded)
        if self._moved_outputs:
            moved = list(outputs)
            for i, axis in self._moved_outputs:  # a view: rows first, no copy
                moved[i] = rows_first(moved[i], axis)
            outputs = moved
        if self.session.reuses_outputs:
            return tuple(np.array(o[:n]) for o in outputs)
        if len(outputs) == 1 and len(outputs[0]) == n:  # the common case, without a loop
            return (outputs[0],)
        return tuple(o if len(o) == n else o[:n] for o in outputs)

    def _elements(self, batch: Batch) -> tuple[int, int]:
        """Input elements the model ran for `batch` (its batched inputs, padding included),
        and of those padding: rows up to the session's padded batch, dims up to the key."""
        key, rows, slices = batch.shape_key, batch.rows, batch.slices
        if len(slices) == 1 and slices[0].work.exact == key:
            return self._padding(key, rows)  # the common case: rows padded at most
        session = self.session
        if not self._batching or session is None:
            return 0, 0
        ran = session.padded_rows(rows)
        per_row = self._row_elements(key)
        useful = sum(s.rows * self._row_elements(s.work.exact) for s in slices)
        return ran * per_row, ran * per_row - useful

    def _padding(self, key: ShapeKey, rows: int) -> tuple[int, int]:
        """`_elements` of `rows` rows of exactly the item shapes `key`."""
        session = self.session
        if not self._batching or session is None:
            return 0, 0
        ran = session.padded_rows(rows)
        per_row = self._row_elements(key)
        return ran * per_row, (ran - rows) * per_row

    def _row_elements(self, key: ShapeKey) -> int:
        """Elements of one row of the batched inputs of item shapes `key` (memoised)."""
        found = self._sizes.get(key)
        if found is None:
            assert self._layout is not None
            axes = self._layout.inputs
            found = sum(math.prod(s) for s, a in zip(key, axes, strict=True) if a is not None)
            if len(self._sizes) < 1024:
                self._sizes[key] = found
        return found

    def _timing(self, flight: _InFlight, run_end: float, ok: bool) -> BatchTiming:
        batch = flight.batch
        steps = 0
        if self.pool is not None:
            steps = sum(
                s.rows * _step_count(batch) for s in batch.slices if s.work.steps is not None
            )
        return self._timing_of(
            batch.model, batch.shape_key, batch.rows, batch.stream, flight.picked,
            flight.run_start, run_end, self._elements(batch), ok, steps,
        )  # fmt: skip

    def _timing_of(
        self,
        model: str,
        key: ShapeKey,
        rows: int,
        stream: int,
        picked: float,
        run_start: float,
        run_end: float,
        elements: tuple[int, int],
        ok: bool = True,
        steps: int = 0,
    ) -> BatchTiming:
        session = self.session
        stages = getattr(session, "last_stages", None)
        return BatchTiming(
            model,
            self.name,
            rows,
            key,
            ok,
            picked,
            max(run_start, picked),
            run_end,
            time.perf_counter(),
            dict(stages) if stages else NO_STAGES,
            stream,
            steps,
            elements[0],
            elements[1],
            session.take_device_spans() if session is not None else (),
        )

    # -- failures -------------------------------------------------------------------------

    def _recover(self) -> None:
        """Re-initialise the session after `max_failures` failed batches in a row."""
        log_safely(
            log.warning, "worker_unhealthy", worker=self.name, failures=self.consecutive_failures
        )
        while self._in_flight:  # nothing may be in flight when the session goes
            result, _ = self._collect(self._in_flight.popleft())
            self._outbox(result)
        self._release()
        try:
            self._init()
            if self.state_on_device:  # empty lanes: the sequences past their first step
                assert self.pool is not None  # lost their state
                self.pool.lose(self.index)
                if not self._open_state():
                    raise BackendError(f"{self.name}: the re-loaded model keeps no device state")
        except Exception as e:
            self._die(e)
            return
        self.consecutive_failures = 0
        self.healthy = True
        log_safely(log.info, "worker_recovered", worker=self.name)
        self._outbox(WorkerChanged(self.model.name, self.index))

    def _die(self, error: BaseException) -> None:
        self.dead = True
        self.healthy = False
        cause = BackendError(f"{self.name} died: {type(error).__name__}: {error}")
        pending = [f.batch for f in self._in_flight]
        self._in_flight.clear()
        while True:  # fail everything queued before anything else can go wrong
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Batch):
                pending.append(item)
            elif isinstance(item, _Prepare):
                item.done.set()
        now = time.perf_counter()
        for batch in pending:
            flight = _InFlight(batch, now, now)
            self._outbox(BatchResult(batch, None, cause, self._timing(flight, now, ok=False)))
        self._outbox(WorkerChanged(self.model.name, self.index))
        log_safely(
            log.error,
            "worker_died",
            worker=self.name,
            error=type(error).__name__,
            detail=str(error),
        )

    def _release(self) -> None:
        session, self.session = self.session, None
        if self._buffers is not None:
            self._buffers.clear()
        if session is None:
            return
        try:
            session.close()
        except Exception:
            log.exception("session_close_failed", worker=self.name)
