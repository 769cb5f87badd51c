"""The pipeline driver: items' host steps on a pool beside the engine, results in input order.

Every ordering here is made by events the test opens (barriers, gates), never by sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import recipe

import inferchain as ic
from inferchain.driver import PipelineDriver
from inferchain.host_pool import default_host_workers
from inferchain.pipeline import Pipeline, Process

WAIT_S = 30.0  # only for a failure: a gate that never opens fails the test instead of hanging


def mlp(path: Path, **top: Any) -> ic.Recipe:
    return recipe({"name": "m", "path": str(path), "max_batch_size": 8}, **top)


class Doubling(Pipeline):
    """Host work before and after the model: x -> y of (2 x), then the sum of y."""

    def __init__(self, oi: ic.OfflineInference) -> None:
        super().__init__(oi)
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def pre(self, item: np.ndarray) -> np.ndarray:
        with self.lock:
            self.threads.add(threading.current_thread().name)
        return item * 2

    def process(self, item: np.ndarray) -> Process:
        out = yield self.submit("m", self.pre(item))
        return float(out["y"].sum())


def items(n: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, 64)).astype(np.float32)


def expected(oi: ic.OfflineInference, xs: np.ndarray) -> list[float]:
    return [float(oi.infer("m", x * 2)["y"].sum()) for x in xs]


def test_host_steps_of_several_items_run_at_once(mlp_path: Path, no_thread_leak: None) -> None:
    """Two items' pre-processing meet at a barrier: only threads side by side pass it."""
    barrier = threading.Barrier(2, timeout=WAIT_S)

    class Meeting(Doubling):
        def pre(self, item: np.ndarray) -> np.ndarray:
            barrier.wait()
            return super().pre(item)

    xs = items(6)
    with ic.OfflineInference(mlp(mlp_path, host_workers=2)) as oi:
        pipeline = Meeting(oi)
        got = list(PipelineDriver(pipeline).run(xs))
        assert got == pytest.approx(expected(oi, xs), rel=1e-6)
    assert len(pipeline.threads) == 2
    assert all(name.startswith("inferchain-host") for name in pipeline.threads)


def test_results_come_out_in_input_order_whatever_finishes_first(mlp_path: Path) -> None:
    """Item 0's pre-processing waits until item 3's has run: later items finish first."""
    later_done = threading.Event()

    class Reversed(Doubling):
        def process(self, item: tuple[int, np.ndarray]) -> Process:
            index, x = item
            if index == 0:
                assert later_done.wait(WAIT_S)
            out = yield self.submit("m", x * 2)
            if index == 3:
                later_done.set()
            return index, float(out["y"].sum())

    xs = items(8)
    with ic.OfflineInference(mlp(mlp_path, host_workers=3)) as oi:
        got = list(PipelineDriver(Reversed(oi)).run(enumerate(xs)))
        want = expected(oi, xs)
    assert [i for i, _ in got] == list(range(8))
    assert [v for _, v in got] == pytest.approx(want, rel=1e-6)


def test_at_most_max_in_flight_items_are_started_ahead_of_the_consumer(mlp_path: Path) -> None:
    started: list[int] = []

    class Counting(Doubling):
        def process(self, item: tuple[int, np.ndarray]) -> Process:
            started.append(item[0])
            return (yield from super().process(item[1]))

    xs = items(40)
    with ic.OfflineInference(mlp(mlp_path, host_workers=2)) as oi:
        results = PipelineDriver(Counting(oi), max_in_flight=5).run(enumerate(xs))
        for taken, _ in enumerate(results, start=1):
            assert len(started) <= taken - 1 + 5
    assert sorted(started) == list(range(40))


def test_zero_host_workers_run_every_step_on_the_callers_thread(mlp_path: Path) -> None:
    xs = items(5)
    with ic.OfflineInference(mlp(mlp_path, host_workers=0)) as oi:
        pipeline = Doubling(oi)
        driver = PipelineDriver(pipeline)
        assert driver.workers == 0
        assert list(driver.run(xs)) == pytest.approx(expected(oi, xs), rel=1e-6)
    assert pipeline.threads == {threading.current_thread().name}


def test_a_failing_host_step_fails_its_item_alone(mlp_path: Path) -> None:
    class Picky(Doubling):
        def pre(self, item: np.ndarray) -> np.ndarray:
            if item[0] > 0:
                raise ValueError("positive first value")
            return item * 2

    xs = items(12)
    with ic.OfflineInference(mlp(mlp_path, host_workers=2)) as oi:
        got = list(PipelineDriver(Picky(oi), on_error="return").run(xs))
        for x, value in zip(xs, got, strict=True):
            if x[0] > 0:
                assert isinstance(value, ValueError)
            else:
                assert value == pytest.approx(expected(oi, x[None])[0], rel=1e-6)


def test_leaving_early_cancels_and_joins_the_pool(mlp_path: Path, no_thread_leak: None) -> None:
    """A consumer that stops after two results: every other item ends, no host thread is
    left, the OfflineInference settles."""
    with ic.OfflineInference(mlp(mlp_path, host_workers=2)) as oi:
        results: Iterator[Any] = PipelineDriver(Doubling(oi), max_in_flight=8).run(items(50))
        assert len([next(results), next(results)]) == 2
        results.close()  # type: ignore[attr-defined]
        assert not [t for t in threading.enumerate() if t.name.startswith("inferchain-host")]
        assert oi.wait_all(timeout=WAIT_S)


def test_a_raised_error_stops_the_run_and_leaves_no_thread(
    mlp_path: Path, no_thread_leak: None
) -> None:
    class Failing(Doubling):
        def process(self, item: tuple[int, np.ndarray]) -> Process:
            if item[0] == 3:
                raise RuntimeError("item 3")
            return (yield from super().process(item[1]))

    with ic.OfflineInference(mlp(mlp_path, host_workers=2)) as oi:
        with pytest.raises(RuntimeError, match="item 3"):
            list(PipelineDriver(Failing(oi)).run(enumerate(items(20))))
        assert oi.wait_all(timeout=WAIT_S)


def test_the_default_pool_follows_the_cores_and_fill_batching(mlp_path: Path) -> None:
    one_thread = mlp(mlp_path)
    assert 2 <= default_host_workers(one_thread) <= 8
    fill = recipe({"name": "m", "path": str(mlp_path), "max_batch_size": 8, "batching": "fill"})
    assert default_host_workers(fill) == 0  # its batches follow the order items come in
    with ic.OfflineInference(fill) as oi:
        assert PipelineDriver(Doubling(oi)).workers == 0

    class Own(Doubling):
        host_workers = 1

    with ic.OfflineInference(one_thread) as oi:
        assert PipelineDriver(Own(oi)).workers == 1
    with ic.OfflineInference(mlp(mlp_path, host_workers=3)) as oi:
        assert PipelineDriver(Own(oi)).workers == 3  # the recipe's key wins


def test_host_workers_must_not_be_negative(mlp_path: Path) -> None:
    with pytest.raises(ic.ConfigError, match="host_workers"):
        mlp(mlp_path, host_workers=-1)


def test_batching_wait_sends_full_batches_and_the_rest_once_no_more_can_come(
    mlp_path: Path,
) -> None:
    """A window no run outlasts: every batch is full but the last, which leaves when the
    input has ended and every item waits for it (the driver's flush)."""
    r = recipe(
        {
            "name": "m",
            "path": str(mlp_path),
            "max_batch_size": 8,
            "batching": "wait",
            "max_queue_delay_ms": 600_000,
        },
        host_workers=2,
    )
    xs = items(30)
    got: list[Any] = []
    with ic.OfflineInference(r) as oi:
        pipeline = Doubling(oi)
        runner = threading.Thread(target=lambda: got.extend(PipelineDriver(pipeline).run(xs)))
        runner.start()
        runner.join(WAIT_S)
        assert not runner.is_alive(), "the last partial batch was never flushed"
        assert dict(oi.stats().models["m"].batch_sizes) == {8: 3, 6: 1}
        assert got == pytest.approx(expected(oi, xs), rel=1e-6)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_host_step_that_never_returns_ends_as_its_items_timeout_and_the_run_ends(
    mlp_path: Path, workers: int
) -> None:
    """Item 1's pre-processing blocks until the test ends: it becomes its timeout error at
    its place, its thread is left to it (another takes its place), the items after it have
    their results and the run ends; with `host_workers: 0` too (a timeout puts the steps
    on one host thread)."""
    release = threading.Event()

    class Stuck(Doubling):
        def pre(self, item: np.ndarray) -> np.ndarray:
            if item[0] == 1.0:
                release.wait()
            return super().pre(item)

    xs = np.zeros((40, 64), np.float32)
    xs[:, 0] = np.arange(40)
    got: list[Any] = []
    with ic.OfflineInference(mlp(mlp_path, host_workers=workers)) as oi:
        driver = PipelineDriver(Stuck(oi), on_error="return", max_in_flight=2, item_timeout=1)
        runner = threading.Thread(target=lambda: got.extend(driver.run(xs)))
        runner.start()
        runner.join(WAIT_S)
        ended = not runner.is_alive()
        release.set()
        runner.join()
        assert ended, "the run waited for a host step that never returned"
        assert isinstance(got[1], ic.RequestTimeout)
        assert got[2:] == pytest.approx(expected(oi, xs[2:]), rel=1e-6)
