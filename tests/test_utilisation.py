"""Utilisation: each worker's busy / starved / idle time, the host pool, padding per model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import recipe

import inferchain as ic
from inferchain.driver import PipelineDriver
from inferchain.pipeline import Pipeline, Process
from inferchain.testing.onnx_models import write_image_model, write_mlp64
from inferchain.tools.bench_report import utilisation_table
from inferchain.tools.trace import chrome_trace
from inferchain.utilisation import (
    Activity,
    BusyClock,
    HostClock,
    HostStep,
    LockedActivity,
    merged_span,
    utilisation,
)


def test_activity_counts_the_time_anything_was_in_flight() -> None:
    a = Activity()
    assert a.span(5.0) == (None, 0.0, 0.0)
    a.enter(10.0)
    a.enter(11.0)
    a.leave(12.0)  # one still in flight
    a.leave(13.0)  # 10 -> 13 active
    a.enter(15.0)  # 13 -> 15 nothing in flight
    assert a.span(16.0) == (10.0, 16.0, 4.0)
    a.leave(17.0)
    assert a.span(99.0) == (10.0, 17.0, 5.0)


def test_the_span_of_two_clocks_runs_from_the_first_enter_to_the_last_leave() -> None:
    driver, engine = LockedActivity(), Activity()
    driver.enter(1.0)
    engine.enter(2.0)
    engine.leave(3.0)
    driver.leave(5.0)
    engine.enter(6.0)
    engine.leave(7.0)
    assert merged_span(driver, engine) == (6.0, 4.0)  # 1 -> 7; the driver's 4 s the most


def test_a_workers_overlapping_batches_count_once() -> None:
    c = BusyClock()
    c.add(1.0, 3.0, 4)
    c.add(2.0, 4.0, 4)  # a second stream: 3 -> 4 is new
    c.add(6.0, 7.0, 2)
    assert c.busy_s == pytest.approx(4.0)
    assert (c.batches, c.rows) == (3, 10)


def test_utilisation_splits_idle_time_into_starved_and_nothing_to_do() -> None:
    a = Activity()
    a.enter(0.0)
    a.leave(8.0)  # 8 s active ...
    a.enter(9.0)
    a.leave(10.0)  # ... of a 10 s span
    busy = BusyClock()
    busy.add(0.0, 3.0, 6)
    host = HostClock()
    host.started(2)
    host.record(HostStep("h0", 0.0, 9.0, 0))
    u = utilisation((a,), {"m#0": busy}, host, {"m": (1, 4)})
    (w,) = u.workers
    assert (w.busy_s, w.starved_s, w.idle_s) == pytest.approx((3.0, 6.0, 1.0))
    assert (w.busy, w.starved, w.mean_batch) == pytest.approx((0.3, 0.6, 6.0))
    assert u.host_busy == pytest.approx(9.0 / (2 * 10.0))
    assert u.padding == {"m": 0.25}
    assert u.bound() == "host"  # 45 % against the model's 30 %
    lines = utilisation_table(u, ["m"])
    assert "m#0" in lines[0] and "30%" in lines[0] and "60%" in lines[0]
    assert lines[-1].startswith("bound by: host")


def test_bucket_padding_is_the_share_of_padded_elements(tmp_path: Path) -> None:
    path = write_image_model(tmp_path / "image.onnx")
    r = recipe(
        {
            "name": "img",
            "path": str(path),
            "max_batch_size": 4,
            "shapes": {"strategy": "buckets", "buckets": [[3, 8, 8]]},
        }
    )
    with ic.OfflineInference(r) as oi:
        list(oi.map("img", np.zeros((6, 3, 4, 4), np.float32)))  # 16 of 64 pixels are real
        assert oi.stats().utilisation.padding["img"] == pytest.approx(0.75)  # type: ignore[union-attr]


def test_rows_padded_to_a_fixed_batch_count_as_padding(tmp_path: Path) -> None:
    path = write_mlp64(tmp_path / "fixed.onnx", batch=8)
    with ic.OfflineInference(recipe({"name": "m", "path": str(path), "max_batch_size": 8})) as oi:
        oi.infer("m", np.zeros(64, np.float32))  # one row of the eight the model runs
        u = oi.stats().utilisation
    assert u is not None and u.padding["m"] == pytest.approx(7 / 8)


class Twice(Pipeline):
    def process(self, item: np.ndarray) -> Process:
        out = yield self.submit("m", item)
        return out["y"]


def test_a_pipeline_run_reports_its_workers_host_steps_and_trace(mlp_path: Path) -> None:
    r = recipe({"name": "m", "path": str(mlp_path), "max_batch_size": 8}, host_workers=2)
    xs = np.random.default_rng(0).standard_normal((20, 64)).astype(np.float32)
    with ic.OfflineInference(r) as oi:
        assert len(list(PipelineDriver(Twice(oi)).run(xs))) == 20
        stats = oi.stats()
        steps = oi.metrics.host.snapshot()[3]
        timeline = oi.metrics.timeline()
    u = stats.utilisation
    assert u is not None
    (w,) = u.workers
    assert w.worker == "m#0" and w.batches == stats.models["m"].batches
    assert u.host_steps == 40 and u.host_workers == 2  # two steps per item: pre and post
    assert 0 < w.busy <= 1 and w.busy + w.starved <= 1 + 1e-9
    assert u.span_s >= u.active_s > 0
    assert set(stats.to_dict()["utilisation"]) >= {"workers", "host", "padding", "bound"}  # type: ignore[arg-type]
    trace = chrome_trace(timeline, host=steps)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert "m#0" in names and any(n.startswith("host inferchain-host") for n in names)
    host_slices = [e for e in trace["traceEvents"] if e.get("cat") == "host"]
    assert len(host_slices) == 40
