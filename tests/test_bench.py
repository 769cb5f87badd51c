"""`inferchain bench` and `inferchain.tools.bench`: the JSON contract, plausible figures, stages."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import inferchain as ic
from inferchain.driver import PipelineDriver
from inferchain.errors import InferchainError
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_image_model, write_mlp, write_mlp64
from inferchain.tools.bench import TimedPipeline, bench, run_bench
from inferchain.tools.bench_report import format_report
from inferchain.tools.feeds import DYNAMIC_DIM
from inferchain.tools.plot import plot_timeline
from inferchain.tools.progress import Progress
from inferchain.tools.synthetic import synthetic_items

RECIPE = """\
name: tiny
session_options: {intra_op_num_threads: 1}
models:
  - name: mlp
    path: mlp64.onnx
    instances: 2
    max_batch_size: 8
    max_queue_delay_ms: 1
"""
PIPELINE = '''\
"""Doubles the item before the model; argmax after it."""
import numpy as np
from inferchain.pipeline import Pipeline


class Doubling(Pipeline):
    def process(self, item):
        out = yield self.submit("mlp", item * 2)
        return {"best": int(np.argmax(out["y"]))}
'''


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A recipe folder: the 64 -> 10 MLP, 2 workers, batches of up to 8."""
    write_mlp64(tmp_path / "mlp64.onnx")
    (tmp_path / "recipe.yaml").write_text(RECIPE, encoding="utf-8")
    return tmp_path


@pytest.fixture
def tiny_pipeline(tiny: Path) -> Path:
    """The tiny recipe with a pipeline and 5 .npy inputs."""
    (tiny / "pipeline.py").write_text(PIPELINE, encoding="utf-8")
    samples = tiny / "samples"
    samples.mkdir()
    for i in range(5):
        np.save(samples / f"{i}.npy", np.full(64, i, np.float32))
    extra = "pipeline: pipeline.py:Doubling\ninputs: samples/\n"
    (tiny / "recipe.yaml").write_text(RECIPE + extra, encoding="utf-8")
    return tiny


def assert_plausible(figures: dict[str, float]) -> None:
    assert figures["count"] > 0
    assert 0 <= figures["p50"] <= figures["p90"] <= figures["p95"] <= figures["p99"]


def test_json_has_the_contract_keys_and_plausible_numbers(
    tiny: Path, tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    assert cli("bench", tiny, "--requests", 300, "--json", out) == 0
    data = json.loads(out.read_text())
    assert set(data) >= {"throughput", "latency_ms", "stages", "models"}
    assert data["throughput"] > 0
    assert_plausible(data["latency_ms"])
    assert set(data["stages"]) >= {"queue", "batch_wait", "worker_wait", "execute", "run"}
    for figures in data["stages"].values():
        assert_plausible(figures)
    model = data["models"]["mlp"]
    assert model["requests"] == 300 and model["errors"] == 0
    assert sum(model["batch_sizes"].values()) == model["batches"]
    assert sum(int(k) * v for k, v in model["batch_sizes"].items()) == 300
    assert max(int(k) for k in model["batch_sizes"]) <= 8
    assert data["bench"]["inputs"] == {"mlp": {"x": [64]}}
    printed = capsys.readouterr().out
    assert "items/s" in printed and "end_to_end" in printed and "batch_wait" in printed


def test_stats_are_the_figures_bench_reports(tiny: Path) -> None:
    """`oi.stats()` after a bench gives exactly what the report holds."""
    with ic.OfflineInference(ic.load_recipe(tiny)) as oi:
        report = bench(oi, requests=200)
        stats = oi.stats()
    assert report.stats == stats
    assert report.to_dict()["models"] == stats.to_dict()["models"]
    assert stats.batches == len(report.timeline)
    assert report.latencies_s.size == 200


def test_one_model_of_several_with_model(tiny: Path, two_io_path: Path) -> None:
    recipe = ic.load_recipe(
        tiny,
        models=[{"name": "mlp", "path": "mlp64.onnx"}, {"name": "two", "path": str(two_io_path)}],
    )
    report = run_bench(recipe, models=["two"], requests=50)
    assert report.stats.models["two"].requests == 50
    assert report.stats.models["mlp"].requests == 0
    assert report.inputs == {"two": {"x": [4], "scale": [1]}}


def test_unknown_model_is_a_one_line_error(
    tiny: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("bench", tiny, "--model", "nope", "--requests", 5) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("inferchain: error:") and "nope" in err[-1]


def test_synthetic_items_fill_dynamic_dims_and_keep_dtypes(tmp_path: Path) -> None:
    recipe = ic.Recipe.from_dict(
        {
            "name": "t",
            "models": [
                {"name": "image", "path": str(write_image_model(tmp_path / "i.onnx"))},
                {"name": "whole", "path": str(write_mlp(tmp_path / "m.onnx")), "max_batch_size": 0},
            ],
        }
    )
    with ic.OfflineInference(recipe) as oi:
        (image,) = synthetic_items(oi.model_info("image"), 3)[0]
        x, scale = synthetic_items(oi.model_info("whole"), 3)[0]
        oi.infer("image", image)
        oi.infer("whole", (x, scale))
    assert image.shape == (3, DYNAMIC_DIM, DYNAMIC_DIM) and image.dtype == np.float32
    assert image.min() >= 0 and image.max() < 1
    assert x.shape == (1, 4) and scale.shape == (1, 1)  # a non-batching model's own dims


def test_acl_backend_reports_h2d_compute_d2h(mlp_path: Path, tmp_path: Path) -> None:
    recipe = ic.Recipe.from_dict(
        {"name": "t", "backend": "acl", "models": [{"name": "m", "path": str(mlp_path)}]}
    )
    fake = FakeAcl(static_batch=8)
    report = run_bench(recipe, requests=100, acl_module=fake)
    for where in (report.stats.stages, report.stats.models["m"].stages):
        for stage in ("h2d", "compute", "d2h"):
            assert where[stage].count == 100
            assert where[stage].p50 <= where["run"].p99
    assert all(set(b.stages) == {"h2d", "compute", "d2h"} for b in report.timeline)
    assert all(v == 0 for v in fake.live_handles().values())


def test_pipeline_source_times_pre_and_post(tiny_pipeline: Path, tmp_path: Path) -> None:
    report = run_bench(ic.load_recipe(tiny_pipeline), requests=23, source="pipeline")
    stages = report.stats.stages
    assert stages["pre"].count == 23 and stages["post"].count == 23
    assert report.stats.models["mlp"].requests == 23
    assert report.to_dict()["bench"]["source"] == "pipeline"  # type: ignore[index]


def test_pipeline_source_without_inputs_is_refused(tiny: Path) -> None:
    with pytest.raises(ic.ConfigError, match="inputs"):
        run_bench(ic.load_recipe(tiny), requests=5, source="pipeline")


def test_trace_and_plot_files(
    tiny: Path, tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    trace, plot = tmp_path / "t.json", tmp_path / "p.png"
    assert cli("bench", tiny, "--requests", 100, "--trace", trace, "--plot", plot) == 0
    assert json.loads(trace.read_text())["traceEvents"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ui.perfetto.dev" in capsys.readouterr().err


def test_plot_without_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    monkeypatch.delitem(sys.modules, "matplotlib.figure", raising=False)
    monkeypatch.delitem(sys.modules, "matplotlib.backends.backend_agg", raising=False)
    with pytest.raises(InferchainError, match=r"inferchain\[plot\]"):
        plot_timeline(tmp_path / "p.png", [], np.empty(0))


def test_the_stages_follow_one_another_and_run_lies_within_execute(tiny: Path) -> None:
    """Per request, queue + batch_wait + worker_wait + execute is its end_to_end, and the
    backend's run (once per row of its batch) is never longer than execute: the wait for a
    free worker is `worker_wait`, apart from the device run (docs/observability.md)."""
    recipe = ic.load_recipe(tiny, models={"mlp": {"instances": 1}})
    report = run_bench(recipe, requests=200)
    assert set(report.stats.stages) >= {"queue", "batch_wait", "worker_wait", "execute", "run"}
    with ic.OfflineInference(recipe) as oi:
        list(oi.map("mlp", np.zeros((64, 64), np.float32)))
        samples = oi.metrics.models["mlp"].samples()
    parts = sum(samples[s] for s in ("queue", "batch_wait", "worker_wait", "execute"))
    np.testing.assert_allclose(parts, samples["end_to_end"], rtol=0, atol=1e-9)
    assert (samples["worker_wait"] >= 0).all()
    assert samples["run"].size == samples["execute"].size
    assert samples["run"].sum() <= samples["execute"].sum()


def test_plot_without_matplotlib_is_refused_before_the_benchmark_runs(
    tiny: Path,
    tmp_path: Path,
    cli: Callable[..., int],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No benchmark, no progress: one line naming the extra, exit 2 (not after the run)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "matplotlib.figure", raising=False)
    monkeypatch.delitem(sys.modules, "matplotlib.backends.backend_agg", raising=False)
    figures = tmp_path / "f.json"
    assert cli("bench", tiny, "--requests", 50, "--json", figures, "--plot", "p.png") == 2
    err = capsys.readouterr().err
    assert err.startswith("inferchain: error: --plot needs matplotlib.figure")
    assert "pip install 'inferchain[plot]' (matplotlib>=3.8)" in err
    assert not figures.exists()


def test_progress_off_a_terminal_is_one_summary_line() -> None:
    stream = io.StringIO()
    with Progress(10, "bench", stream=stream, interactive=False) as progress:
        for _ in range(10):
            progress.update()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench: 10/10 in")


def test_progress_on_a_terminal_draws_a_bar_and_leaves_it_at_the_final_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream = io.StringIO()
    progress = Progress(4, "run", stream=stream, interactive=True, summary=False, interval=0)
    progress.update(2)
    assert "[" + "#" * 12 + "." * 12 + "]" in stream.getvalue()
    progress.print("item line")
    progress.close()
    assert capsys.readouterr().out == "item line\n"
    last = stream.getvalue().rsplit("\r\x1b[K", 1)[1]
    assert last.startswith("run [" + "#" * 12 + "." * 12 + "]  50% 2/4") and last.endswith("\n")


def test_progress_bar_reaches_100_percent_even_within_the_redraw_interval() -> None:
    """The last unit is drawn at once, though the bar was drawn a moment before."""
    stream = io.StringIO()
    progress = Progress(6, "run", stream=stream, interactive=True, summary=False, interval=3600)
    for _ in range(6):
        progress.update()
    assert stream.getvalue().rsplit("\r\x1b[K", 1)[1].startswith("run [" + "#" * 24 + "] 100% 6/6")
    progress.close()
    assert stream.getvalue().endswith("\n") and "100% 6/6" in stream.getvalue().splitlines()[-1]


class Flaky(ic.Pipeline):
    """Cancels every other request it makes (the error is thrown into `process`) and fails
    every third item after its outputs came back."""

    def process(self, item: Any) -> Any:
        index = int(item[0])
        request = self.submit("mlp", item)
        if index % 2:
            request.cancel()
        try:
            yield request
        except ic.RequestCancelled:
            return "cancelled"
        if index % 3 == 0:
            raise ValueError(f"item {index}")
        return "ran"


def test_timed_pipeline_passes_errors_through_and_times_every_item(tiny: Path) -> None:
    items = [np.full(64, i, np.float32) for i in range(30)]
    with ic.OfflineInference(ic.load_recipe(tiny)) as oi:
        driver = PipelineDriver(TimedPipeline(Flaky(oi)), on_error="return")
        results = list(driver.run(items))
        stats = oi.stats()
    assert [type(r) for r in results[::6]] == [ValueError] * 5
    assert set(map(str, results)) <= {"ran", "cancelled", *(f"item {i}" for i in range(0, 30, 3))}
    assert stats.stages["pre"].count == stats.stages["post"].count == 30


def test_a_stateful_model_is_benched_in_sequences_with_step_figures(acc_path: Path) -> None:
    from conftest import acc_recipe

    from inferchain.tools.bench import STEPS_PER_SEQUENCE
    from inferchain.tools.bench_report import format_report
    from inferchain.tools.trace import chrome_trace

    r = acc_recipe(acc_path, max_sequences=32, warmup=True)
    steps = 3 * STEPS_PER_SEQUENCE + 5  # four sequences, the last one short
    report = run_bench(r, requests=steps)
    q = report.stats.models["acc"].sequences
    assert q is not None
    assert q.steps == steps and report.stats.requests == steps
    assert 1 <= q.rows_per_step <= 8 and q.step_batches * q.rows_per_step == pytest.approx(steps)
    assert 1 <= q.live_mean <= q.live_max <= 4
    assert q.queue_ms.count == steps
    text = format_report(report)
    assert "rows per step" in text and "live max" in text
    assert report.to_dict()["models"]["acc"]["sequences"]["steps"] == steps  # type: ignore[index]
    slices = [e for e in chrome_trace(report.timeline)["traceEvents"] if e["ph"] == "X"]
    assert sum(e["args"]["steps"] for e in slices) == steps
    assert all(e["name"].endswith("steps") for e in slices)


def test_progress_counts_units_done_before_and_shows_rate_and_time_left() -> None:
    """A resumed run: the units done before count towards the bar, not towards the rate;
    while units are left the line says how long they will take at the rate so far."""
    stream = io.StringIO()
    progress = Progress(10, "run", stream=stream, interactive=True, summary=False, done=6)
    progress.update(0)
    assert progress.count == 6
    progress.update(2)
    line = progress.line(progress._started + 2.0)  # 2 units in 2 s: 1/s, 2 left
    assert line == "run: 8/10 in 2.0s (1.0/s, 2s left, 6 done before)"
    progress.update(2)
    assert "left" not in progress.line(progress._started + 4.0)
    progress.close()


def test_pipeline_source_reads_the_input_files_given_like_run(
    tiny_pipeline: Path, tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench --pipeline --input PATH`: those files, not the recipe's `inputs:` (here one
    whose shape the model refuses, so every item fails: exit 1); `--input` alone is refused."""
    bad = tmp_path / "bad"
    bad.mkdir()
    np.save(bad / "short.npy", np.zeros(3, np.float32))
    report = run_bench(ic.load_recipe(tiny_pipeline), requests=7, source="pipeline", inputs=[bad])
    assert report.items is not None and report.items.errors == 7
    ok = run_bench(
        ic.load_recipe(tiny_pipeline),
        requests=7,
        source="pipeline",
        inputs=[tiny_pipeline / "samples" / "1.npy"],
    )
    assert ok.items is not None and ok.items.errors == 0 and ok.items.items == 7
    assert cli("bench", tiny_pipeline, "--pipeline", "--input", bad, "--requests", 4) == 1
    capsys.readouterr()
    assert cli("bench", tiny_pipeline, "--input", bad) == 2
    assert "--input needs --pipeline" in capsys.readouterr().err


def test_requests_are_fed_at_the_rate_the_model_drains_them(tiny: Path) -> None:
    """Not all requests queued at once (a latency that is queueing): at most two batches per
    worker in flight by default, `--in-flight` otherwise; the latency is also reported
    split into waiting and service."""
    in_flight: list[int] = []
    with ic.OfflineInference(ic.load_recipe(tiny)) as oi:
        pending: set[int] = set()
        submit_many = oi.submit_many

        def counted(model: str, items: Any, **options: Any) -> Any:
            requests = submit_many(model, items, **options)
            pending.update(r.id for r in requests)
            for r in requests:  # a request already done is discarded at once
                r.add_done_callback(lambda r: pending.discard(r.id))
            in_flight.append(len(pending))
            return requests

        oi.submit_many = counted  # type: ignore[method-assign]
        report = bench(oi, requests=400)
        assert report.in_flight == {"mlp": 2 * 2 * 8}  # 2 instances, batches of 8
        assert 0 < max(in_flight) <= 32  # all 400 at once before
        small = bench(oi, requests=100, in_flight=4)
    assert small.in_flight == {"mlp": 4}
    waiting, service = report.waiting_ms, report.service_ms
    assert waiting.count == service.count == 400
    text = format_report(report)
    assert "of it waiting (queue + batch_wait + worker_wait) p50" in text
    data = report.to_dict()["bench"]
    assert data["waiting_ms"]["count"] == 400 and data["in_flight"] == {"mlp": 32}  # type: ignore[index]


BUCKETED = """\
name: images
session_options: {intra_op_num_threads: 1}
models:
  - name: image
    path: image.onnx
    max_batch_size: 4
    shapes: {strategy: buckets, buckets: [[3, 16, 16], [3, 24, 40]]}
"""


def test_synthetic_items_of_a_dynamic_model_take_the_recipes_buckets(tmp_path: Path) -> None:
    """No padding of the benchmark's own making (32 x 32 items in a far larger bucket):
    the items take the buckets' shapes; without buckets the report says the shapes are
    synthetic."""
    write_image_model(tmp_path / "image.onnx")
    (tmp_path / "recipe.yaml").write_text(BUCKETED, encoding="utf-8")
    report = run_bench(ic.load_recipe(tmp_path), requests=40)
    assert report.inputs == {"image": {"image": [3, 16, 16]}}
    assert report.shape_notes == {
        "image": "items of the recipe's 2 bucket shape(s) in turn, unpadded"
    }
    utilisation = report.stats.utilisation
    assert utilisation is not None and utilisation.padding["image"] == 0.0
    assert set(report.stats.models["image"].batch_sizes) <= {1, 2, 3, 4}
    dynamic = ic.load_recipe(tmp_path, models={"image": {"shapes": {"strategy": "dynamic"}}})
    report = run_bench(dynamic, requests=8)
    assert report.inputs == {"image": {"image": [3, DYNAMIC_DIM, DYNAMIC_DIM]}}
    assert "dynamic dims set to 32 (--dynamic-dim)" in report.shape_notes["image"]
    assert "`bench --pipeline --input PATH`" in format_report(report)
