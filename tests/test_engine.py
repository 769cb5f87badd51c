"""The ExecutionEngine's step without threads: what it dispatches, and what it does with the
results given back.

The loop thread is never started: the test calls `_step_and_after(now)` (the step under the
engine's lock, then what it leaves for after it), as the loop does, at the times it chooses,
or `run_until(work)` from its own thread, as `infer()` does, with the real Scheduler and
ModelBatcher and a fake worker that records the runs it is handed (the thread executor) or
runs them when asked (the inline executor). Results are posted as a worker posts them
(`RunResult`s into the engine's inbox), so every interleaving here is the test's own.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from inferchain.config import ModelConfig
from inferchain.core.engine import ExecutionEngine
from inferchain.core.records import Run, RunResult, RunTiming
from inferchain.core.request import Request, RequestState
from inferchain.core.sequences import StatefulModel
from inferchain.core.state_pool import StatePool
from inferchain.core.step_batcher import StepBatcher
from inferchain.core.work import StepRows, Work
from inferchain.errors import BackendError
from inferchain.inputs import InputSpec
from inferchain.shapes import ShapePolicy
from inferchain.tensors import TensorDesc
from inferchain.testing.builders import create_engine, create_model, create_work

S = RequestState
T0 = 100.0  # perf_counter seconds of the first step
WINDOW = 0.05  # seconds: the models' max_queue_delay_ms


def outputs_of(run: Run) -> list[tuple[np.ndarray, ...]]:
    """What the fake model computes for each batch of `run`: y = x + 0.5 of every row."""
    rows = np.concatenate([s.work.inputs[0][s.start : s.stop] for s in run.slices])
    return [(rows[i : i + run.size] + np.float32(0.5),) for i in range(0, run.rows, run.size)]


def result_of(run: Run, worker: str, error: BaseException | None = None) -> RunResult:
    """The result of `run` as a worker gives it back: its outputs, or `error` for each
    batch."""
    n = run.batches
    t = run.dispatched
    failed = tuple(range(n)) if error is not None else ()
    timing = RunTiming(run.model, worker, run.stream, run.shape_key, run.rows, run.size, t,
                       [t] * n, [t] * n, t, failed)  # fmt: skip
    outcomes = [error] * n if error is not None else outputs_of(run)
    return RunResult(run, outcomes, timing)


class FakeWorker:
    """What the engine reads of a ModelWorker; it keeps the runs it is handed, and runs
    those it is asked to run here (noting on which thread)."""

    def __init__(self, index: int, num_streams: int = 1) -> None:
        self.index = index
        self.name = f"m#{index}"
        self.num_streams = num_streams
        self.batch_s: float | None = None  # never timed: a run is one batch
        self.healthy = True
        self.dead = False
        self.batches: list[Run] = []  # handed to its thread
        self.executed: list[tuple[Run, str]] = []  # run here, on the thread named

    def dispatch(self, run: Run) -> None:
        self.batches.append(run)

    def execute(self, run: Run) -> RunResult:
        self.executed.append((run, threading.current_thread().name))
        return result_of(run, self.name)

    def stop(self) -> None:
        pass

    def join(self) -> None:
        pass


class Harness:
    """One model "m" (x f32[N, 4] -> y f32[N, 4]) on fake workers, stepped by the test."""

    def __init__(
        self,
        model: ModelConfig,
        workers: int = 1,
        inline: bool = False,
        batch_s: float | None = None,
        stateful: Mapping[str, StatefulModel] | None = None,
    ) -> None:
        """`batch_s`: how long the workers' batches took at warm-up (None: never timed);
        `stateful`: the sequence layer's models (its request ids from 100)."""
        self.workers = [FakeWorker(i) for i in range(workers)]
        for w in self.workers:
            w.batch_s = batch_s
        ids = itertools.count(100)
        self.engine: ExecutionEngine = create_engine(
            model, self.workers, inline=inline, stateful=stateful,
            take_ids=lambda n: next(ids) if n == 1 else 0,
        )  # fmt: skip
        self.next_id = 1

    def work(self, rows: int = 1, *, per_item: bool = True, at: float = T0) -> Work:
        """Submit a Work of `rows` rows (ids as OfflineInference numbers them)."""
        work = self.bulk(rows, per_item=per_item, at=at)
        if not per_item:
            work.arm()
        self.engine.submit(work, block=False)
        return work

    def bulk(self, rows: int = 1, *, per_item: bool = False, at: float = T0) -> Work:
        """A Work of `rows` rows, not yet submitted."""
        work = create_work(
            self.next_id,
            rows=rows,
            submitted=at,
            per_item=per_item,
            on_cancel=self.engine._inbox.cancel,
        )
        self.next_id += rows
        return work

    def step(self, now: float) -> float | None:
        """One step of the loop at `now`, on the test's thread: no engine thread ever ran."""
        return self.engine._step_and_after(now)

    def dispatched(self) -> list[Run]:
        """Every run handed to any worker's thread, in order."""
        return [b for w in self.workers for b in w.batches]

    def finish(self, run: Run, *, error: BaseException | None = None) -> None:
        """Post the result of `run` as its worker would: y = x + 0.5 of every row, or
        `error` for every batch."""
        self.engine._inbox.post(result_of(run, f"m#{run.worker}", error))


def spans(batches: Sequence[Run]) -> list[list[tuple[int, int, int]]]:
    """Per run: (work id, start, stop) of each slice."""
    return [[(s.work.id, s.start, s.stop) for s in b.slices] for b in batches]


def own_row(r: Request) -> np.ndarray:
    """What `Harness.finish` computes for request `r`: its row (id * 1000 + row) + 0.5."""
    assert r.work is not None
    return np.full(4, r.work.id * 1000 + r.row + 0.5, np.float32)


# -- when a batch goes ------------------------------------------------------------------------


def test_a_full_batch_is_dispatched_at_once_even_inside_the_window_of_a_busy_model() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3))
    h.work(1)
    h.step(T0)  # an idle model: the lone row goes at once
    assert spans(h.dispatched()) == [[(1, 0, 1)]]
    h.work(4, at=T0 + 0.001)
    h.step(T0 + 0.001)  # busy now, and inside the window: but the batch is full
    assert spans(h.dispatched()) == [[(1, 0, 1)], [(2, 0, 4)]]


def test_a_partial_batch_goes_at_once_on_an_idle_model_with_batching_window() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3, batching="window"))
    h.work(2)
    assert h.step(T0) is None  # nothing left to wait for
    assert spans(h.dispatched()) == [[(1, 0, 2)]]


def test_a_partial_batch_waits_for_the_window_while_the_model_is_busy() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3, batching="window"))
    h.work(1)
    h.step(T0)
    h.work(2, at=T0)
    assert h.step(T0) is not None  # admitted now; it wakes for the window's end
    assert h.step(T0 + WINDOW / 2) is not None
    assert len(h.dispatched()) == 1
    h.step(T0 + WINDOW)
    assert spans(h.dispatched()) == [[(1, 0, 1)], [(2, 0, 2)]]


def test_a_partial_batch_waits_for_the_window_on_an_idle_model_with_batching_wait() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3, batching="wait"))
    h.work(2)
    assert h.step(T0) is not None
    assert h.step(T0 + WINDOW / 2) is not None
    assert h.dispatched() == []
    h.step(T0 + WINDOW)
    assert spans(h.dispatched()) == [[(1, 0, 2)]]


def test_batching_fill_sends_a_partial_batch_only_when_flushed_however_long_it_waits() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3, batching="fill"))
    h.work(2)
    for now in (T0, T0 + WINDOW, T0 + 100 * WINDOW):
        assert h.step(now) is None  # no window to wake for: only a flush sends it
    assert h.dispatched() == []
    h.engine.flush()
    h.step(T0 + 100 * WINDOW)
    assert spans(h.dispatched()) == [[(1, 0, 2)]]


def test_rows_of_several_works_share_a_batch_and_a_long_work_spans_batches() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3, batching="wait"))
    h.work(3)
    h.work(6)
    h.step(T0)  # admitted: the window runs from now
    h.step(T0 + WINDOW)
    assert spans(h.dispatched()) == [[(1, 0, 3), (4, 0, 1)], [(4, 1, 5)]]  # two in flight
    h.finish(h.dispatched()[0])
    h.step(T0 + WINDOW)
    assert spans(h.dispatched()) == [[(1, 0, 3), (4, 0, 1)], [(4, 1, 5)], [(4, 5, 6)]]


# -- what comes back --------------------------------------------------------------------------


def test_results_reach_the_requests_and_the_bulk_work_of_their_rows() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3, batching="wait"))
    items = h.work(3)
    bulk = h.work(3, per_item=False)
    requests = items.requests
    assert requests is not None
    h.step(T0)
    h.step(T0 + WINDOW)
    batches = h.dispatched()
    assert spans(batches) == [[(1, 0, 3), (4, 0, 1)], [(4, 1, 3)]]
    for b in reversed(batches):  # in any order
        h.finish(b)
    h.step(T0 + WINDOW)
    for r in requests:
        assert r.state is S.DONE
        np.testing.assert_array_equal(r.outputs["y"], own_row(r))  # type: ignore[index]
    assert bulk.wait(0) and bulk.state is S.DONE
    got = np.stack([item["y"] for item in bulk.items()])  # type: ignore[index]
    np.testing.assert_array_equal(got, np.arange(3)[:, None] + np.full((3, 4), 4000.5))
    assert h.engine.wait_all(0)
    assert h.engine._inbox.live == {}


def test_a_failed_batch_fails_exactly_its_rows() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3, batching="wait"))
    first, second = h.work(2), h.work(5)
    assert first.requests is not None and second.requests is not None
    rows = [*first.requests, *second.requests]
    h.step(T0)
    h.step(T0 + WINDOW)
    failing, passing = h.dispatched()
    assert spans([failing, passing]) == [[(1, 0, 2), (3, 0, 2)], [(3, 2, 5)]]
    error = BackendError("the device failed", code=507011, name="ACL_ERROR_RT_AICORE_EXCEPTION")
    h.finish(failing, error=error)
    h.finish(passing)
    h.step(T0 + WINDOW)
    assert first.done and second.done
    assert [r.state for r in rows] == [S.ERROR] * 4 + [S.DONE] * 3
    assert all(r.error is error for r in rows[:4])
    for r in rows[4:]:
        np.testing.assert_array_equal(r.outputs["y"], own_row(r))  # type: ignore[index]


def test_a_cancelled_ready_request_is_not_dispatched_and_its_work_still_settles() -> None:
    h = Harness(create_model(max_batch=8, delay_ms=WINDOW * 1e3))
    h.work(1)
    h.step(T0)  # the model is busy from now on
    partly, wholly = h.work(3), h.work(2)
    h.step(T0)
    assert len(h.dispatched()) == 1
    assert partly.requests is not None and wholly.requests is not None
    ready = [*partly.requests, *wholly.requests]
    assert {r.state for r in ready} == {S.READY}  # admitted, waiting for the window
    assert ready[1].cancel()
    assert all(r.cancel() for r in wholly.requests)
    h.step(T0 + WINDOW)
    assert spans(h.dispatched()[1:]) == [[(2, 0, 1), (2, 2, 3)]]  # row 1 and work 5 skipped
    assert wholly.done  # every row ended: nothing of it is left in the engine
    h.finish(h.dispatched()[0])
    h.finish(h.dispatched()[1])
    h.step(T0 + WINDOW)
    assert [r.state for r in ready] == [S.DONE, S.CANCELLED, S.DONE, S.CANCELLED, S.CANCELLED]
    assert h.engine.wait_all(0) and h.engine._inbox.live == {}


def test_a_cancel_taken_in_the_step_that_admits_its_work_is_not_dispatched() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3))
    work = h.work(2)
    assert work.requests is not None
    assert work.requests[0].cancel()  # before the engine ever stepped
    h.step(T0)
    assert spans(h.dispatched()) == [[(1, 1, 2)]]


def test_batches_go_to_the_least_loaded_worker() -> None:
    h = Harness(create_model(max_batch=1, delay_ms=WINDOW * 1e3), workers=2)
    h.work(4)
    h.step(T0)
    assert [spans(w.batches) for w in h.workers] == [
        [[(1, 0, 1)], [(1, 2, 3)]],
        [[(1, 1, 2)], [(1, 3, 4)]],
    ]


# -- user code runs after the step, outside the engine's lock ---------------------------------


class CountingStepper:
    """Two steps per sequence of x -> y; it records whether the engine's lock was held."""

    rows = 1
    cohorts = 1
    steps_per_batch = 1

    def __init__(self, engine: ExecutionEngine) -> None:
        self.engine = engine
        self.locked: list[bool] = []

    def start(self, item: float) -> list[float]:
        return [item]

    def group(self, state: list[float]) -> None:
        return None

    def initial(self, state: list[float]) -> None:
        return None

    def feed(self, states: Sequence[list[float]]) -> dict[str, np.ndarray]:
        self.locked.append(self.engine._lock.locked())
        return {"x": np.array([[s[-1]] * 4 for s in states], np.float32)}

    def take(self, states: Sequence[list[float]], outputs: dict[str, np.ndarray]) -> np.ndarray:
        self.locked.append(self.engine._lock.locked())
        for s, y in zip(states, outputs["y"], strict=True):
            s.append(float(y[0]))
        return np.array([len(s) > 2 for s in states])

    def result(self, state: list[float]) -> list[float]:
        self.locked.append(self.engine._lock.locked())
        return state


def test_a_steppers_code_runs_after_the_step_and_its_next_batch_goes_in_the_next() -> None:
    config = create_model(delay_ms=WINDOW * 1e3)
    desc = [TensorDesc("x", (None, 4), np.float32)]
    shapes = ShapePolicy(config, desc, [TensorDesc("y", (None, 4), np.float32)])
    pool = StatePool("m", [], [], [], 4)
    spec = InputSpec("m", desc, batching=True)
    queue = StepBatcher(pool, spec, names=("y",), shapes=shapes, batch_rows=4, delay_s=1.0,
                        cohorts=1)  # fmt: skip
    stateful = {"m": StatefulModel(pool, queue, spec, ("y",), shapes, 4, 0, None)}
    h = Harness(config, stateful=stateful)
    stepper = CountingStepper(h.engine)
    request = h.engine._sequences.start("m", stepper, 1.0)  # as run_sequence() does
    assert request.id == 100  # the harness's ids
    h.step(T0)
    (first,) = h.dispatched()
    h.finish(first)
    assert h.step(T0) == 0.0  # the stepper took the outputs after the step: step again
    assert len(h.dispatched()) == 1  # its next batch is in the inbox, not yet dispatched
    h.step(T0)
    second = h.dispatched()[1]
    assert second.slices[0].work.inputs[0][0, 0] == 1.5  # fed from the first step's y
    h.finish(second)
    h.step(T0)
    assert request.state is S.DONE
    assert request.outputs == [1.0, 1.5, 2.0]  # type: ignore[comparison-overlap]
    assert stepper.locked == [False] * 5  # feed, take, feed, take and result
    assert h.engine.wait_all(0)


def test_done_listeners_of_the_requests_a_step_ends_run_after_it_outside_the_lock() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3))
    work = h.work(2)
    assert work.requests is not None
    seen: list[tuple[int, bool]] = []
    for r in work.requests:
        r.add_done_callback(lambda r: seen.append((r.id, h.engine._lock.locked())))
    h.step(T0)
    h.finish(h.dispatched()[0])
    h.step(T0)
    assert sorted(seen) == [(1, False), (2, False)]


def pinned_steps(h: Harness, worker: int, rows: int = 1) -> Work:
    """A batch of sequence steps whose state only instance `worker`'s session holds."""
    x = np.zeros((rows, 4), np.float32)
    steps = StepRows(np.arange(rows, dtype=np.intp), worker=worker)
    work = Work.for_steps(h.next_id, "m", (x,), steps, shape_key=((4,),), exact=((4,),),
                          names=("y",), submitted=T0)  # fmt: skip
    h.next_id += 1
    work.arm()
    h.engine.submit(work, block=False)
    return work


def test_steps_pinned_to_an_instance_run_there_and_wait_while_it_is_full() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3), workers=2, batch_s=1.0)
    for _ in range(3):  # long batches: a worker holds two runs at most
        pinned_steps(h, worker=1)
    h.step(T0)
    assert [len(w.batches) for w in h.workers] == [0, 2]  # the third waits for instance 1
    h.finish(h.workers[1].batches[0])
    h.step(T0)
    assert [len(w.batches) for w in h.workers] == [0, 3]


def test_steps_pinned_to_a_dead_instance_fail_naming_it() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3), workers=2)
    h.workers[1].healthy, h.workers[1].dead = False, True
    work = pinned_steps(h, worker=1)
    h.step(T0)
    assert work.wait(0) and work.state is S.ERROR
    (error,) = [v for _, _, v in work.pieces]
    assert isinstance(error, BackendError) and "instance 1" in str(error)
    assert h.dispatched() == []


def test_a_done_listener_that_raises_harms_neither_the_others_nor_the_engine() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3))
    work = h.work(2)
    requests = work.requests
    assert requests is not None
    seen: list[int] = []

    def boom(r: Request) -> None:
        raise RuntimeError("a listener's bug")

    requests[0].add_done_listener(boom)
    requests[1].add_done_listener(lambda r: seen.append(r.id))
    h.step(T0)
    h.finish(h.dispatched()[0])
    h.step(T0)
    assert seen == [2] and all(r.state is S.DONE for r in requests)


# -- the inline executor: a caller's thread steps the engine --------------------------------


def test_a_callers_work_on_an_idle_model_runs_on_its_thread_and_settles_in_the_call() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3), inline=True)
    work = h.bulk(6)
    assert h.engine.run_until(work)  # finished before it returned: no loop step was needed
    (worker,) = h.workers
    assert spans([r for r, _ in worker.executed]) == [[(1, 0, 4)], [(1, 4, 6)]]
    assert {name for _, name in worker.executed} == {threading.current_thread().name}
    assert worker.batches == []  # nothing went to the worker's thread
    got = np.stack([item["y"] for item in work.items()])  # type: ignore[index]
    np.testing.assert_array_equal(got, np.arange(6)[:, None] + np.full((6, 4), 1000.5))
    stats = h.engine._metrics.models["m"]
    assert (stats.requests, sum(stats.batch_sizes.values())) == (6, 2)
    assert h.engine.wait_all(0)


def test_a_callers_work_on_a_busy_model_goes_to_its_worker_and_waits_for_the_loop() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3), inline=True)
    h.work(1)
    h.step(T0)  # the model is busy now: its worker's thread runs a batch
    work = h.bulk(2)
    assert not h.engine.run_until(work)  # it waits for the window behind the busy worker
    h.finish(h.dispatched()[0])
    h.step(T0 + WINDOW)
    assert spans(h.dispatched()) == [[(1, 0, 1)], [(2, 0, 2)]]
    assert h.workers[0].executed == []
    h.finish(h.dispatched()[1])
    h.step(T0 + WINDOW)
    assert work.wait(0) and work.state is S.DONE


def test_a_model_whose_sessions_keep_to_their_thread_never_runs_inline() -> None:
    h = Harness(create_model(delay_ms=WINDOW * 1e3), inline=False)
    work = h.bulk(2)
    assert not h.engine.run_until(work)  # dispatched by the caller's step, to the worker
    assert spans(h.dispatched()) == [[(1, 0, 2)]] and h.workers[0].executed == []
    h.finish(h.dispatched()[0])
    h.step(T0)
    assert work.wait(0) and work.state is S.DONE
