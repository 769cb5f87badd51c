"""Utilisation: each worker's busy / starved / idle time, the host pool, padding per model."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from conftest import recipe

import inferchain as ic
from inferchain.backends import acl_clock
from inferchain.backends.acl import AclSession
from inferchain.core.records import BatchTiming
from inferchain.driver import PipelineDriver
from inferchain.pipeline import Pipeline, Process
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_image_model, write_mlp64
from inferchain.tools.bench_report import utilisation_table
from inferchain.tools.trace import chrome_trace
from inferchain.utilisation import (
    Activity,
    BusyClock,
    HostClock,
    HostStep,
    LockedActivity,
    format_utilisation,
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


# -- on acl: the device time the stream timeline saw ---------------------------------------


def _union(spans: list[tuple[float, float]]) -> float:
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy


def _acl_busy(
    mlp_path: Path, fake: FakeAcl, rows: int, streams: int
) -> tuple[ic.Stats, list[BatchTiming], list[tuple[float, float]]]:
    r = recipe(
        {"name": "m", "path": str(mlp_path), "max_batch_size": 8, "streams": streams},
        backend="acl",
    )
    xs = np.random.default_rng(1).standard_normal((rows, 64)).astype(np.float32)
    with ic.OfflineInference(r, acl_module=fake) as oi:
        mark = len(fake.slices)
        assert len(list(oi.map("m", xs))) == rows
        stats = oi.stats()
        timeline = oi.metrics.timeline()
        device = [(s.start, s.end) for s in fake.slices[mark:]]
    return stats, timeline, device


@pytest.mark.parametrize("anchor_s", [60.0, 0.0], ids=["one-epoch", "epoch-every-batch"])
@pytest.mark.parametrize("streams", [1, 2])
def test_on_acl_busy_is_the_device_time_of_fake_acls_time_model(
    mlp_path: Path, monkeypatch: pytest.MonkeyPatch, anchor_s: float, streams: int
) -> None:
    """Compute stretched by FakeAcl's time model: the worker's busy seconds are the union of
    the device's copy and compute slices (its events' spans hold them, and little more)."""
    monkeypatch.setattr(acl_clock, "ANCHOR_S", anchor_s)
    fake = FakeAcl(static_batch=8, compute_scale=300.0)
    stats, timeline, device = _acl_busy(mlp_path, fake, 96, streams)
    u = stats.utilisation
    assert u is not None
    (w,) = u.workers
    assert w.device and w.batches == 12
    seen = _union(device)
    assert seen > 0.0
    assert seen * 0.98 <= w.busy_s <= seen * 1.5  # + the stream thread's own steps
    trace = chrome_trace(timeline)["traceEvents"]
    names = {e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    assert {f"m#0 device (stream {i})" for i in range(streams)} <= names
    assert sum(e.get("cat") == "device" for e in trace) == 12  # a slice per model run


def test_on_acl_a_slow_host_does_not_count_as_device_time(
    mlp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker holds each batch 30 ms after its device work ended (a host that is late
    to collect): the worker's own times would say busy, the device's say otherwise."""
    collect = AclSession.collect

    def late(self: AclSession, stream: int) -> list[np.ndarray]:
        time.sleep(0.03)  # a duration, not an ordering: the batch was launched before
        return collect(self, stream)

    monkeypatch.setattr(AclSession, "collect", late)
    stats, timeline, device = _acl_busy(mlp_path, FakeAcl(static_batch=8), 48, 1)
    u = stats.utilisation
    assert u is not None
    (w,) = u.workers
    held = [(b.picked, b.end) for b in timeline]
    assert _union(held) >= 6 * 0.03  # six batches, each held 30 ms by the worker
    assert w.device and _union(device) > 0.0
    assert w.busy_s < 0.25 * _union(held)  # the late host is not device time
    assert w.busy < 0.5 and "(device)" in format_utilisation(u)[0]
