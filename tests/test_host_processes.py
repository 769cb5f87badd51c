"""Host code that holds the GIL runs in processes: `Pipeline.in_process` and its pool."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import recipe

import inferchain as ic
from inferchain.driver import PipelineDriver
from inferchain.pipeline import Pipeline, Process


def features(seed: int) -> tuple[np.ndarray, int]:
    """Pure-Python work (it holds the GIL) that makes a model input; and the process id."""
    acc = [float((seed * 31 + i) % 97) for i in range(64)]
    for _ in range(200):
        acc = [a * 0.5 + 1.0 for a in acc]
    return np.asarray(acc, np.float32), os.getpid()


def broken(seed: int) -> None:
    raise ValueError(f"cannot prepare item {seed}")


class InProcesses(Pipeline):
    def process(self, item: int) -> Process:
        x, pid = yield self.in_process(features, item)
        out = yield self.submit("m", x)
        return float(out["y"].sum()), pid


def test_host_work_runs_in_other_processes_and_results_keep_their_order(
    mlp_path: Path,
) -> None:
    r = recipe({"name": "m", "path": str(mlp_path), "max_batch_size": 8}, host_processes=2)
    with ic.OfflineInference(r) as oi:
        got = list(PipelineDriver(InProcesses(oi)).run(range(12)))
        want = [float(oi.infer("m", features(i)[0])["y"].sum()) for i in range(12)]
        assert oi.host_processes.workers == 2
    assert [v for v, _ in got] == pytest.approx(want, rel=1e-6)
    pids = {pid for _, pid in got}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert not multiprocessing.active_children()  # close() joined them


def test_an_error_in_a_process_fails_its_item_alone(mlp_path: Path) -> None:
    class Picky(InProcesses):
        def process(self, item: int) -> Process:
            if item == 2:
                yield self.in_process(broken, item)
            return (yield from super().process(item))

    r = recipe({"name": "m", "path": str(mlp_path), "max_batch_size": 8}, host_processes=1)
    with ic.OfflineInference(r) as oi:
        got = list(PipelineDriver(Picky(oi), on_error="return").run(range(4)))
    assert isinstance(got[2], ValueError) and "cannot prepare item 2" in str(got[2])
    assert all(isinstance(g, tuple) for i, g in enumerate(got) if i != 2)


def test_no_process_starts_unless_a_pipeline_asks_and_none_after_close(mlp_path: Path) -> None:
    r = recipe({"name": "m", "path": str(mlp_path), "max_batch_size": 8})
    with ic.OfflineInference(r) as oi:
        list(oi.run(np.zeros((3, 64), np.float32)))
        assert not oi.host_processes.started
    with pytest.raises(ic.Closed):
        oi.host_processes.submit(features, 1)
