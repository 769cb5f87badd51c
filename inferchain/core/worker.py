"""The ModelWorker: one model instance with its thread, its streams and its buffers.

A worker is the engine's thread executor: the engine hands it a `Run` (`dispatch`) and its
thread runs the run's batches on the session, keeps up to `num_streams` runs in flight, and
posts one `RunResult` per run to its outbox. The inline executor is the same code on another
thread: `execute` runs a run on the thread that is stepping the engine, for a session any
thread may use, on a worker the engine holds for it (nothing else of it in flight). Either way
a run's result comes back once every batch of it has run: a worker that turns unhealthy in a
run re-loads its model (on the thread running the run) before its next batch.

It never calls a layer above it. `healthy` and `dead` are written only by the thread running
its runs; the engine reads them.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable

import attrs
import numpy as np

from inferchain.backends.base import Backend, Session
from inferchain.config import ModelConfig
from inferchain.core.records import (
    Outcome,
    Run,
    RunResult,
    RunTiming,
    WorkerChanged,
    failed_run,
)
from inferchain.core.session_view import SessionView
from inferchain.core.state_pool import StatePool
from inferchain.errors import (
    BackendError,
    ConfigError,
    InferchainError,
    LoadError,
    OutputMismatch,
    RequestCancelled,
    StateLost,
)
from inferchain.layout import Axis, Layout
from inferchain.logs import get_logger, log_safely
from inferchain.output_rows import OutputProbe, probe_session
from inferchain.shapes import ShapePolicy
from inferchain.tensors import StateRows

log = get_logger(__name__)

Outbox = Callable[[RunResult | WorkerChanged], None]
TIMED_TWICE_S = 0.02  # a warm-up batch shorter than this is timed again (its best counts)


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
    """A run whose first batch is launched, until it is collected."""

    run: Run
    picked: float  # taken from the queue
    starts: list[float]  # per batch: the backend was called
    error: BaseException | None = None  # the launch of its first batch failed
    feed: list[np.ndarray] | None = None  # a session that runs at once: run at collect
    # a multi-step batch, run at collect: its first step's feed and device state rows
    steps: tuple[list[np.ndarray], StateRows | None] | None = None


_RECOVER = object()  # a queue item: re-initialise the session (after an inline run failed)


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


def _step_count(run: Run) -> int:
    """Steps each row runs: K for a multi-step batch of sequence steps (alone in its run),
    else 1."""
    steps = run.slices[0].work.steps
    return 1 if steps is None else steps.count


def _state_rows(run: Run) -> StateRows | None:
    """Where the steps of `run` (one batch) keep their state on the device; None for a run
    that holds no steps (steps batch only with steps, so it is all or none)."""
    parts = []
    for s in run.slices:
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
    `dispatch()` runs (or `execute()` one here) -> `stop()` -> `join()`. The session is
    released on the worker's thread after the last run, so nothing is in flight when it is
    torn down.
    """

    def __init__(
        self, model: ModelConfig, index: int, backend: Backend, device: int, outbox: Outbox
    ) -> None:
        self.model = model
        self.index = index
        self.name = f"{model.name}#{index}"
        self.healthy = True  # False while re-initialising after failures, or once dead
        self.dead = False  # the thread ended or the model could not be reloaded
        self.num_streams = 1  # runs in flight at once (the session's, once loaded)
        self.consecutive_failures = 0
        self.session: Session | None = None
        self.view: SessionView | None = None  # the session's tensors, as they are fed and read
        self.shapes: ShapePolicy | None = None  # set by prepare(), before the first run
        self.pool: StatePool | None = None  # a stateful model's lanes: carried outputs go there
        self.state_on_device = False  # ... or into the session's device lanes (prepare())
        self.batch_s: float | None = None  # a max batch's seconds at warm-up (its best run)
        # the session runs a batch in one call (`Session.run`, no launch ahead of collect)
        self.at_once = False
        self._spans = False  # the session times its device (`take_device_spans`)
        self.probed: OutputProbe | None = None  # the real output shapes (prepare with probe)
        self._backend = backend
        self._device = device
        self._outbox = outbox
        self._queue: queue.SimpleQueue[Run | _Prepare | object | None] = queue.SimpleQueue()
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
        batch, timing it: `batch_s`) the buffers of every shape known now; with
        `device_state`, ask the session to keep the pool's state in device lanes
        (`state_on_device` says if it does); with `probe`, first run the model at one or two
        batch sizes and refuse it (`ConfigError`) where an output does not hold the rows on
        its batch axis (`probed` keeps what it returned). Blocks until the worker thread did
        it."""
        done = threading.Event()
        self._queue.put(_Prepare(policy, warm, done, device_state, probe))
        done.wait()
        if self._init_error is not None:
            raise self._init_error

    def dispatch(self, run: Run) -> None:
        """Queue a run (the thread executor; any thread that steps the engine)."""
        self._queue.put(run)

    def execute(self, run: Run) -> RunResult:
        """Run `run` on the calling thread and return its result (the inline executor: only
        for sessions any thread may use, on a worker the engine holds for it). An interrupt
        of the caller (a BaseException that is no Exception, e.g. KeyboardInterrupt) ends
        the run: the batches not yet run end with an error and the result carries it."""
        result, rest, _ = self._complete(_InFlight(run, time.perf_counter(), []), inline=True)
        if result.recovering:  # the worker's own thread re-loads the model, then runs the rest
            self._queue.put(_RECOVER)
            if rest is not None:
                self._queue.put(rest)
        return result

    def stop(self) -> None:
        """Finish the queued runs, then release the session on the worker thread."""
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
            elif isinstance(item, Run):
                in_flight.append(self._launch(item))
            else:  # _RECOVER: after an inline run made the worker unhealthy
                self._recover()
        while in_flight:
            self._finish(in_flight.popleft())

    def _finish(self, flight: _InFlight) -> None:
        """Collect a launched run and post its result; after a crash, end the thread; after
        too many failures in a row, re-initialise the session, then run the rest."""
        result, rest, crash = self._complete(flight)
        self._outbox(result)
        if crash is not None:
            raise crash
        if result.recovering:
            self._recover()
            if rest is not None:
                self._in_flight.appendleft(self._launch(rest))

    def _init(self) -> None:
        session = self._backend.load(self.model, self._device)
        self.session = session
        kind = type(session)
        self.at_once = (  # see `at_once` in __init__
            kind.launch is Session.launch
            and kind.collect is Session.collect
            and session.last_stages is None
        )
        self._spans = kind.take_device_spans is not Session.take_device_spans  # times its device
        pad = self.shapes.pad_values if self.shapes is not None else 0.0
        view = SessionView(self.model, session, pad)
        limit = session.max_batch_size
        if view.batching and limit is not None and self.model.max_batch_size > limit:
            raise ConfigError(
                f"model {self.model.name!r}: max_batch_size {self.model.max_batch_size} "
                f"exceeds the {limit} the loaded model accepts{_on_axes(view.layout)}: set "
                f"max_batch_size: {limit} (and more `instances` for throughput), or re-export "
                "the model with a dynamic batch dim (docs/own-model.md)"
            )
        self.num_streams = max(1, session.num_streams)
        self._unbatched = bool(view.layout.unbatched)
        self.view = view
        log.debug("worker_ready", worker=self.name, inputs=[t.describe() for t in session.inputs])

    def _prepare(self, item: _Prepare) -> None:
        self.shapes = item.policy
        try:
            view, session = self.view, self.session
            assert view is not None and session is not None
            buffers = view.buffers
            buffers.pad_values = item.policy.pad_values
            buffers.max_sets = max(buffers.max_sets, 2 * len(item.policy.buckets))
            # zeros may not be a value an unbatched input accepts (a sampling rate of 0):
            # such a model gets its buffers but no warm-up run
            warm = item.warm and not self._unbatched
            keys = item.policy.warm_keys() if view.batching else []
            probed = warm and item.probe and bool(keys)
            if probed:  # its run at the max batch is the first key's warm-up
                self._probe(keys[0])
            for key in keys:
                for stream in range(self.num_streams):
                    feed = buffers.zeros(stream, key)
                    if warm and not (probed and key == keys[0] and stream == 0):
                        self._timed_run(feed, self.model.batch_rows)
            if warm and keys:
                self._time_batch(buffers.zeros(0, keys[0]))
            if item.device_state and self.pool is not None:
                self.state_on_device = self._open_state()
            session.take_device_spans()  # the warm-up's and probe's runs are no batch's
        except Exception as e:
            self._init_error = _startup_error(e)
        finally:
            item.done.set()

    def _timed_run(self, feed: list[np.ndarray], rows: int) -> list[np.ndarray]:
        """A warm-up or probe run; one of a max batch is timed (`batch_s`: the best)."""
        assert self.session is not None
        started = time.perf_counter()
        outputs = self.session.run(feed, rows)
        if rows == self.model.batch_rows:
            took = time.perf_counter() - started
            self.batch_s = took if self.batch_s is None else min(self.batch_s, took)
        return outputs

    def _time_batch(self, feed: list[np.ndarray]) -> None:
        """Once more where the warm-up's max batch was short (the first run of a session
        pays for its set-up): how long a batch really takes decides how runs are cut."""
        if self.batch_s is not None and self.batch_s < TIMED_TWICE_S:
            self._timed_run(feed, self.model.batch_rows)

    def _probe(self, key: tuple[tuple[int, ...], ...]) -> None:
        """Run zeros of shape `key` at one or two batch sizes; `ConfigError` where an output
        does not have the rows on its batch axis, a warning where it contradicts its
        declared shape."""
        session, view = self.session, self.view
        assert session is not None and view is not None
        seen, verdict = probe_session(
            self.model.name,
            session,
            view.layout,
            self.model.batch_rows,
            key,
            self._timed_run,
            view.padded_batch,
        )
        self.probed = seen
        for warning in verdict.warnings:
            log_safely(log.warning, "output_shape_differs", model=self.model.name, detail=warning)
        if verdict.errors:
            raise ConfigError("; ".join(verdict.errors))

    def _open_state(self) -> bool:
        assert self.session is not None and self.pool is not None and self.view is not None
        carried = [(out, i) for out, i, _ in self.pool.carried]
        on_device = self.session.open_state(carried, self.pool.size, self.pool.constant)
        if on_device:  # `collect` returns only the outputs that are not carried
            self.view.keep_state_on_device([out for out, _ in carried])
        return on_device

    # -- one run --------------------------------------------------------------------------

    def _launch(self, run: Run) -> _InFlight:
        """Start the run's first batch. A failure here is reported when the run is
        collected, so results still come back in launch order."""
        flight = _InFlight(run, time.perf_counter(), [])
        flight.error = self._start(flight, 0)
        return flight

    def _start(self, flight: _InFlight, i: int) -> BaseException | None:
        """Feed batch `i` of the flight's run and launch it (a session that runs at once:
        keep its feed for `_collect`); the exception that stopped it, if any."""
        run = flight.run
        try:
            session, view = self.session, self.view
            if session is None or view is None:
                raise BackendError(f"{self.name} has no loaded model (it failed to re-initialise)")
            feed = view.feed(run, i)
            state = _state_rows(run) if self.state_on_device else None
            if state is not None:
                assert self.pool is not None
                if self.pool.launching(state):
                    raise self.pool.lost_error()
            if self.pool is not None and _step_count(run) > 1:  # step after step at collect
                flight.starts.append(time.perf_counter())
                flight.steps = (feed, state)
            elif self.at_once:
                flight.feed = feed
            else:  # `state`: steps whose state is in the session's device lanes
                flight.starts.append(time.perf_counter())
                rows = min(run.size, run.rows - i * run.size)
                session.launch(feed, rows if view.batching else 0, run.stream, state)
        except Exception as e:
            return e
        return None

    def _collect(self, flight: _InFlight, i: int) -> tuple[np.ndarray, ...]:
        """The outputs of batch `i` of the flight's run, launched by `_start`."""
        run, session, view = flight.run, self.session, self.view
        assert session is not None and view is not None
        n = min(run.size, run.rows - i * run.size)
        if flight.steps is not None:
            feed, state = flight.steps
            flight.steps = None
            return self._run_steps(run, feed, state)
        if flight.feed is not None:
            feed, flight.feed = flight.feed, None
            flight.starts.append(time.perf_counter())
            outputs = view.outputs(session.run(feed, n if view.batching else 0), n)
        else:
            outputs = view.outputs(session.collect(run.stream), n)
        if self.pool is not None and not self.state_on_device:
            self.pool.write_back(run, outputs)
        return outputs

    def _complete(
        self, flight: _InFlight, inline: bool = False
    ) -> tuple[RunResult, Run | None, BaseException | None]:
        """Collect the run's first batch (launched by `_launch`; inline: started here) and
        run the others: its result; the rest of the run where a failure made the worker
        unhealthy before its last batch (it runs once the model is re-loaded, a run of its
        own on the same stream); and the exception that must end the thread, if any (never
        inline: an interrupt there is the result's)."""
        run = flight.run
        ends: list[float] = []
        outcomes: list[Outcome] = []
        failed: list[int] = []
        stages: list[dict[str, float]] = []
        error, stop = flight.error, None
        was_healthy = self.healthy  # a run collected during a re-load turns it no more
        batches = -(-run.rows // run.size)
        first = run.slices[0].work
        session = self.session
        for i in range(batches):
            if i and first.cancelled and first.requests is None:  # the rest is not run
                cut = RequestCancelled(f"work {first.id} ({first.model}) was cancelled")
                outcomes += [cut] * (batches - i)
                break
            if i or inline:
                error = self._start(flight, i)
            if error is None:
                try:
                    outcomes.append(self._collect(flight, i))
                except Exception as e:
                    error = e
                except BaseException as e:  # KeyboardInterrupt, SystemExit, ...
                    error = stop = e
            ends.append(time.perf_counter())
            if len(flight.starts) < len(ends):  # it failed before the backend was called
                flight.starts.append(ends[-1])
            if session is not None and session.last_stages is not None:  # a backend's split
                stages.append(dict(session.last_stages))
            if error is None:
                self.consecutive_failures = 0
                continue
            failed.append(i)
            if stop is not None:  # the rest is not run
                outcomes.append(error if inline else self._failed(run, error, crash=True))
                cut = RequestCancelled(f"run of {run.model!r} interrupted: {type(error).__name__}")
                outcomes += [cut] * (batches - i - 1)
                break
            outcomes.append(self._failed(run, error, crash=False))
            error = None
            if not self.healthy:
                break
        rest = None
        if len(outcomes) < batches:  # unhealthy: the rest runs after the re-load
            rows = len(outcomes) * run.size
            rest, run = run.rest(rows), run.head(rows)
        timing = self._timing(flight, ends, tuple(failed), tuple(stages))
        recovering = was_healthy and not self.healthy and stop is None
        result = RunResult(run, outcomes, timing, stop if inline else None, recovering, bool(rest))
        return result, rest, None if inline else stop

    def _failed(self, run: Run, error: BaseException, crash: bool) -> BaseException:
        """Count, log and name a batch's failure; what its rows end with."""
        if isinstance(error, StateLost | OutputMismatch):  # not the session's: no failure
            if isinstance(error, OutputMismatch):
                ids = [s.work.id for s in run.slices]
                log_safely(log.error, "batch_failed", worker=self.name, work_id=ids,
                           error="OutputMismatch", detail=str(error))  # fmt: skip
            return error
        self.consecutive_failures += 1
        if crash or self.consecutive_failures >= self.model.health.max_failures:
            self.healthy = False  # before the engine hears of the result
        if not isinstance(error, InferchainError):
            error = BackendError(f"{self.name}: {type(error).__name__}: {error}")
        log_safely(
            log.error,
            "batch_failed",
            worker=self.name,
            work_id=[s.work.id for s in run.slices],
            error=type(error).__name__,
            code=getattr(error, "code", None),
            code_name=getattr(error, "name", None),
            detail=str(error),
        )
        return error

    def _run_steps(
        self, run: Run, feed: list[np.ndarray], state: StateRows | None
    ) -> tuple[np.ndarray, ...]:
        """Run the K steps of a multi-step batch one after the other (a cohort's Work, alone
        in its run), each step's carried outputs the next one's carried inputs; every output
        comes back as [rows, K, *item]. The carried state of the last step goes to the
        pool's lanes (or stays in the device lanes)."""
        session, view, pool = self.session, self.view, self.pool
        assert session is not None and view is not None and pool is not None
        n, stream = run.rows, run.stream
        s = run.slices[0]
        steps = s.work.steps
        assert steps is not None and steps.ahead is not None
        in_axes = view.layout.inputs
        feed = list(feed)
        stacked: list[np.ndarray] = []
        outputs: tuple[np.ndarray, ...] = ()
        for k in range(steps.count):
            if k:
                for i, rows in steps.ahead.items():  # this step's rows, in the model's layout
                    feed[i] = _laid_out(rows[s.start : s.stop, k], in_axes[i])
                if state is None:  # the state the last step left (its rows first)
                    for out, i, _ in pool.carried:
                        feed[i] = _laid_out(outputs[out], in_axes[i])
            session.launch(feed, n if view.batching else 0, stream, state)
            outputs = view.outputs(session.collect(stream), n)
            if k == 0 and state is not None:  # in the device lanes now, for every row
                state = state.stepped()
            if not stacked:
                stacked = [np.empty((n, steps.count, *o.shape[1:]), o.dtype) for o in outputs]
            for whole, o in zip(stacked, outputs, strict=True):
                whole[:, k] = o
        if state is None:
            pool.write_back(run, outputs)
        return tuple(stacked)

    def _timing(
        self,
        flight: _InFlight,
        ends: list[float],
        failed: tuple[int, ...],
        stages: tuple[dict[str, float], ...],
    ) -> RunTiming:
        run, session, view = flight.run, self.session, self.view
        steps = 0
        if self.pool is not None:
            count = _step_count(run)
            steps = sum(s.rows * count for s in run.slices if s.work.steps is not None)
        rows = min(run.rows, len(ends) * run.size)  # the batches that ran (or failed)
        if rows < run.rows:
            run = run._replace(rows=rows)
        elements = view.elements(run) if view is not None and rows else (0, 0)
        return RunTiming(
            run.model, self.name, run.stream, run.shape_key, rows, run.size, flight.picked,
            flight.starts, ends, time.perf_counter(), failed, stages, steps, *elements,
            session.take_device_spans() if session is not None and self._spans else (),
        )  # fmt: skip

    # -- failures -------------------------------------------------------------------------

    def _recover(self) -> None:
        """Re-initialise the session after `max_failures` failed batches in a row (on the
        thread running the run that failed; nothing else of this worker is in flight once
        the runs launched before it are collected)."""
        log_safely(
            log.warning, "worker_unhealthy", worker=self.name, failures=self.consecutive_failures
        )
        while self._in_flight:  # nothing may be in flight when the session goes
            result, rest, _ = self._complete(self._in_flight.popleft())
            self._outbox(result)
            if rest is not None:  # failed again: it ends with the others if the re-load fails
                self._queue.put(rest)
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
        pending = [f.run for f in self._in_flight]
        self._in_flight.clear()
        while True:  # fail everything queued before anything else can go wrong
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Run):
                pending.append(item)
            elif isinstance(item, _Prepare):
                item.done.set()
        now = time.perf_counter()
        for run in pending:
            self._outbox(failed_run(run, self.name, cause, now))
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
        if self.view is not None:
            self.view.buffers.clear()
            self.view = None
        if session is None:
            return
        try:
            session.close()
        except Exception:
            log.exception("session_close_failed", worker=self.name)
