"""run_now's stretches: the rows of an array on an idle model run batch after batch on the
caller's thread without batch records, and end as the loop's batches end (outputs in order,
metrics, a failed batch, a cancel, work that arrives meanwhile)."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conftest import faulty
from conftest import mlp_recipe as mlp

import inferchain as ic
from inferchain import RequestState as S
from inferchain.testing.faults import WorkerKilled

ROWS = 40  # ten batches of the recipe's 4 rows
WARM = 2  # runs of the warm-up (a batch longer than a thread hand-off is run by the loop)


def warm(path: Path) -> ic.Recipe:
    return mlp(path, warmup=True)


@pytest.fixture
def xs() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((ROWS, 64)).astype(np.float32)


def expected(path: Path, xs: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path)).run(None, {"x": xs})[0]


def test_an_array_on_an_idle_model_runs_on_the_callers_thread_and_counts_every_batch(
    mlp_path: Path, xs: np.ndarray
) -> None:
    oi, backend = faulty(warm(mlp_path))
    with oi:
        got = np.concatenate([b["y"] for b in oi.map_batches("m", xs[:38])])
        assert oi.wait_all(timeout=5)
        stats = oi.stats()
        timeline = list(oi.metrics.models["m"].timeline)
    np.testing.assert_allclose(got, expected(mlp_path, xs[:38]), rtol=1e-5, atol=1e-6)
    assert set(backend.run_threads[WARM:]) == {threading.current_thread().name}
    m = stats.models["m"]
    assert (m.requests, m.errors, m.batches, m.batch_sizes) == (38, 0, 10, {4: 9, 2: 1})
    assert [t.size for t in timeline] == [4] * 9 + [2]
    assert all(a.run_end <= b.run_start for a, b in itertools.pairwise(timeline))
    use = stats.utilisation
    assert use is not None and use.workers[0].batches == 10 and use.workers[0].busy_s > 0


def test_a_failed_batch_in_a_stretch_ends_its_rows_and_the_rest_still_run(
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


def test_a_cancel_during_a_stretch_ends_the_rows_not_yet_run(
    mlp_path: Path, xs: np.ndarray, no_thread_leak: None
) -> None:
    oi, backend = faulty(warm(mlp_path), hold_runs={WARM + 2})
    ranges: list[object] = []
    with oi:
        caller = threading.Thread(
            target=lambda: ranges.extend(oi.map_batches("m", xs, on_error="return"))
        )
        caller.start()
        assert backend.runs.wait_arrived(WARM + 2)  # the stretch is in its second batch
        assert oi.cancel_all() == 0  # no Request: the stretch's work is cancelled
        backend.runs.open(WARM + 2)
        caller.join(10)
        assert oi.wait_all(timeout=5)
    assert not caller.is_alive()
    assert [isinstance(r, dict) for r in ranges[:2]] == [True, True]
    assert ranges[2:] and all(isinstance(r, ic.RequestCancelled) for r in ranges[2:])
    assert backend.counts["run"] == WARM + 2


def test_work_that_arrives_during_a_stretch_takes_over_the_rows_left(
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
        other = oi.submit("m", xs[0])  # the worker is the stretch's: it waits in the queue
        backend.runs.open(WARM + 2)
        caller.join(10)
        assert other.wait(10) and other.state is S.DONE
    np.testing.assert_allclose(np.concatenate(got), expected(mlp_path, xs), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(other.outputs["y"], expected(mlp_path, xs[:1])[0], rtol=1e-5,
                               atol=1e-6)  # fmt: skip
    caller_runs = backend.run_threads.count(caller.name)
    assert 2 <= caller_runs < backend.counts["run"]  # the loop's worker ran the rest


def test_an_interrupt_in_a_stretch_ends_its_work_and_leaves_the_engine_usable(
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
