"""The one-item lane: `infer()` of one item on an idle model runs on the caller's thread
without a Work, and ends as the loop's batches end (outputs, metrics, failures, shutdown)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from conftest import faulty, wait_until
from conftest import mlp_recipe as mlp

import inferchain as ic
from inferchain import RequestState as S

X = np.ones(64, np.float32)


def _no_works(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make building a Work fail the test unless a lane item's run failed; returns the
    list the Works built are counted in."""
    built: list[int] = []
    original = ic.OfflineInference._works

    def counted(self: ic.OfflineInference, *args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ic.OfflineInference, "_works", counted)
    return built


def test_an_item_on_an_idle_model_runs_without_a_work_and_counts_as_a_batch(
    mlp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    xs = np.random.default_rng(0).standard_normal((20, 64)).astype(np.float32)
    expected = ort.InferenceSession(str(mlp_path)).run(None, {"x": xs})[0]
    built = _no_works(monkeypatch)
    with ic.OfflineInference(mlp(mlp_path)) as oi:
        got = [oi.infer("m", x)["y"] for x in xs]
        assert oi.wait_all(timeout=5)
        stats = oi.stats()
    assert not built  # the lane, not the run-now path
    np.testing.assert_allclose(np.stack(got), expected, rtol=1e-5, atol=1e-6)
    m = stats.models["m"]
    assert (m.requests, m.errors, m.batches, m.batch_sizes) == (20, 0, 20, {1: 20})
    assert m.latency_ms.count == 20 and m.latency_ms.p50 > 0
    use = stats.utilisation
    assert use is not None and use.active_s > 0
    (worker,) = use.workers
    assert worker.batches == 20 and worker.busy_s > 0
    assert use.padding["m"] == 0.0


def test_a_failed_run_in_the_lane_ends_as_a_failed_batch(
    mlp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = _no_works(monkeypatch)
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
    assert len(built) == 2  # only the failed items got their records, to end as batches
    assert (stats.requests, stats.errors) == (2, 2)


def test_wait_all_and_close_wait_for_an_item_in_the_lane(
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
        assert backend.runs.wait_arrived(1)  # the model is busy: the lane is closed
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


def test_a_bad_item_fails_its_check_before_the_lane(mlp_path: Path) -> None:
    with ic.OfflineInference(mlp(mlp_path)) as oi:
        with pytest.raises(ic.InvalidInput, match="expected shape"):
            oi.infer("m", np.ones(63, np.float32))
        assert oi.infer("m", X)["y"].shape == (10,)
        assert oi.stats().models["m"].errors == 0
