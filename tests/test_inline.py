"""The inline executor: `infer()`, `map()` and `map_batches()` over an idle model run their
batches on the caller's thread, through the engine's one path (the same admission, the same
settle point and metrics as the worker threads' runs), and end as those runs end: outputs in
order, metrics, a failed batch, a cancel, work that arrives meanwhile, an interrupt,
shutdown."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conftest import faulty, wait_until
from conftest import mlp_recipe as mlp

import inferchain as ic
from inferchain import RequestState as S
from inferchain.testing.faults import WorkerKilled

X = np.ones(64, np.float32)
ROWS = 40  # ten batches of the recipe's 4 rows
WARM = 3  # runs of the warm-up: the probe's two, and the max batch timed once more


def warm(path: Path) -> ic.Recipe:
    return mlp(path, warmup=True)


@pytest.fixture
def xs() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((ROWS, 64)).astype(np.float32)


def expected(path: Path, xs: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path)).run(None, {"x": xs})[0]


# -- infer(): one item ------------------------------------------------------------------------


def test_an_item_on_an_idle_model_runs_on_the_callers_thread_and_counts_as_a_batch(
    mlp_path: Path,
) -> None:
    xs = np.random.default_rng(0).standard_normal((20, 64)).astype(np.float32)
    oi, backend = faulty(mlp(mlp_path))
    with oi:
        got = [oi.infer("m", x)["y"] for x in xs]
        assert oi.wait_all(timeout=5)
        stats = oi.stats()
    assert set(backend.run_threads) == {threading.current_thread().name}
    np.testing.assert_allclose(np.stack(got), expected(mlp_path, xs), rtol=1e-5, atol=1e-6)
    m = stats.models["m"]
    assert (m.requests, m.errors, m.batches, m.batch_sizes) == (20, 0, 20, {1: 20})
    assert m.latency_ms.count == 20 and m.latency_ms.p50 > 0
    use = stats.utilisation
    assert use is not None and use.active_s > 0
    (worker,) = use.workers
    assert worker.batches == 20 and worker.busy_s > 0
    assert use.padding["m"] == 0.0


def test_a_failed_run_inline_ends_as_a_failed_batch_and_the_worker_recovers(mlp_path: Path) -> None:
    oi, backend = faulty(mlp(mlp_path, health={"max_failures": 2}), fail_runs={2, 3})
    with oi:
        oi.infer("m", X)
        for _ in range(2):
            with pytest.raises(ic.BackendError, match="injected failure"):
                oi.infer("m", X)
        assert wait_until(lambda: backend.counts["load"] == 2)  # re-initialised after two
        assert oi.wait_all(timeout=10)
        assert oi.infer("m", X)["y"].shape == (10,)  # recovered
        stats = oi.stats().models["m"]
    assert (stats.requests, stats.errors) == (2, 2)


def test_wait_all_and_close_wait_for_an_item_running_inline(
    mlp_path: Path, no_thread_leak: None
) -> None:
    oi, backend = faulty(mlp(mlp_path), hold_runs={1})
    got: list[dict[str, np.ndarray]] = []
    with oi:
        caller = threading.Thread(target=lambda: got.append(oi.infer("m", X)))
        caller.start()
        assert backend.runs.wait_arrived(1)
        assert not oi.wait_all(timeout=0.05)  # the item is in flight on the caller's thread
        closer = threading.Thread(target=oi.close)
        closer.start()
        closer.join(0.05)
        assert closer.is_alive()  # close() waits for it too
        backend.runs.open(1)
        caller.join(10)
        closer.join(10)
    assert not closer.is_alive() and got and got[0]["y"].shape == (10,)


def test_an_item_for_a_busy_model_takes_the_queue_and_ends_in_order(mlp_path: Path) -> None:
    oi, backend = faulty(mlp(mlp_path), hold_runs={1})
    with oi:
        first = oi.submit("m", X)
        assert backend.runs.wait_arrived(1)  # the model is busy: its worker runs it
        got: list[dict[str, np.ndarray]] = []
        caller = threading.Thread(target=lambda: got.append(oi.infer("m", X * 2)))
        caller.start()
        caller.join(0.05)
        assert caller.is_alive()  # queued behind the held batch
        backend.runs.open(1)
        caller.join(10)
        assert first.wait(10) and first.state is S.DONE
    np.testing.assert_allclose(got[0]["y"], oi_outputs(mlp_path, X * 2), rtol=1e-5, atol=1e-6)


def oi_outputs(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path)).run(None, {"x": x[None]})[0][0]


def test_a_bad_item_fails_its_check_before_it_is_submitted(mlp_path: Path) -> None:
    with ic.OfflineInference(mlp(mlp_path)) as oi:
        with pytest.raises(ic.InvalidInput, match="expected shape"):
            oi.infer("m", np.ones(63, np.float32))
        assert oi.infer("m", X)["y"].shape == (10,)
        assert oi.stats().models["m"].errors == 0


# -- map() and map_batches(): runs of many batches ------------------------------------------


def test_an_array_on_an_idle_model_runs_on_the_callers_thread_and_counts_every_batch(
    mlp_path: Path, xs: np.ndarray
) -> None:
    oi, backend = faulty(warm(mlp_path))
    with oi:
        got = np.concatenate([b["y"] for b in oi.map_batches("m", xs[:38])])
        assert oi.wait_all(timeout=5)
        stats = oi.stats()
        timeline = list(oi.metrics.models["m"].batches())
    np.testing.assert_allclose(got, expected(mlp_path, xs[:38]), rtol=1e-5, atol=1e-6)
    assert set(backend.run_threads[WARM:]) == {threading.current_thread().name}
    m = stats.models["m"]
    assert (m.requests, m.errors, m.batches, m.batch_sizes) == (38, 0, 10, {4: 9, 2: 1})
    assert [t.size for t in timeline] == [4] * 9 + [2]
    assert all(a.run_end <= b.run_start for a, b in itertools.pairwise(timeline))
    use = stats.utilisation
    assert use is not None and use.workers[0].batches == 10 and use.workers[0].busy_s > 0


def test_a_failed_batch_in_an_inline_run_ends_its_rows_and_the_rest_still_run(
    mlp_path: Path, xs: np.ndarray
) -> None:
    oi, backend = faulty(warm(mlp_path), fail_runs={WARM + 3})
    with oi:
        ranges = list(oi.map_batches("m", xs, on_error="return"))
        assert oi.wait_all(timeout=5)
        m = oi.stats().models["m"]
    assert len(ranges) == ROWS // 4
    failed = ranges[2]
    assert isinstance(failed, ic.BackendError) and "injected failure" in str(failed)
    good = [r for i, r in enumerate(ranges) if i != 2]
    assert all(isinstance(r, dict) for r in good)
    want = np.delete(expected(mlp_path, xs), np.s_[8:12], axis=0)
    got = np.concatenate([r["y"] for r in good])  # type: ignore[index]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (m.requests, m.errors, m.batches) == (ROWS - 4, 4, ROWS // 4)
    assert backend.counts["failed"] == 1


def test_a_cancel_during_an_inline_run_ends_the_rows_not_yet_run(
    mlp_path: Path, xs: np.ndarray, no_thread_leak: None
) -> None:
    oi, backend = faulty(warm(mlp_path), hold_runs={WARM + 2})
    ranges: list[object] = []
    with oi:
        caller = threading.Thread(
            target=lambda: ranges.extend(oi.map_batches("m", xs, on_error="return"))
        )
        caller.start()
        assert backend.runs.wait_arrived(WARM + 2)  # the run is in its second batch
        assert oi.cancel_all() == 0  # no Request: the run's work is cancelled
        backend.runs.open(WARM + 2)
        caller.join(10)
        assert oi.wait_all(timeout=5)
    assert not caller.is_alive()
    assert [isinstance(r, dict) for r in ranges[:2]] == [True, True]
    assert ranges[2:] and all(isinstance(r, ic.RequestCancelled) for r in ranges[2:])
    assert backend.counts["run"] == WARM + 2


def test_work_that_arrives_during_an_inline_run_runs_on_the_worker_after_it(
    mlp_path: Path, xs: np.ndarray
) -> None:
    oi, backend = faulty(warm(mlp_path), hold_runs={WARM + 2})
    got: list[np.ndarray] = []
    with oi:
        caller = threading.Thread(
            target=lambda: got.extend(b["y"] for b in oi.map_batches("m", xs))  # type: ignore[index]
        )
        caller.start()
        assert backend.runs.wait_arrived(WARM + 2)
        other = oi.submit("m", xs[0])  # the worker is the caller's run's: it waits for it
        backend.runs.open(WARM + 2)
        caller.join(10)
        assert other.wait(10) and other.state is S.DONE
    np.testing.assert_allclose(np.concatenate(got), expected(mlp_path, xs), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(other.outputs["y"], expected(mlp_path, xs[:1])[0], rtol=1e-5,
                               atol=1e-6)  # fmt: skip
    caller_runs = backend.run_threads.count(caller.name)
    assert caller_runs == ROWS // 4  # the caller's ten batches, one run on its thread
    assert backend.run_threads[-1] == "inferchain-worker-m#0"  # then the other, on the worker


def test_an_interrupt_in_an_inline_run_ends_its_work_and_leaves_the_engine_usable(
    mlp_path: Path, xs: np.ndarray, no_thread_leak: None
) -> None:
    oi, backend = faulty(warm(mlp_path), kill_runs={WARM + 3})  # a BaseException, as ^C
    with oi:
        with pytest.raises(WorkerKilled):
            list(oi.map_batches("m", xs))
        assert oi.wait_all(timeout=5)  # the work ended: its stream and admission are free
        m = oi.stats().models["m"]
        assert (m.requests, m.errors, m.batches) == (8, 4, 3)  # the interrupted one failed
        assert backend.counts["run"] == WARM + 3
        np.testing.assert_allclose(oi.infer("m", xs[0])["y"], expected(mlp_path, xs[:1])[0],
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
