"""Scale-out on Ray Data: same results as a local run, and Ray's retries lose or repeat no row.

One local Ray (2 CPUs) for the whole module. The predictor subclasses below that fail on
purpose are pickled by value, so Ray's workers need not import this test module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import ray.data
from conftest import wait_until

import inferchain as ic
from inferchain.cli import main
from inferchain.images import RAPIDOCR, read_image
from inferchain.integrations.ray import RecipePredictor, map_recipe, read_dataset

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "orientation"
SAMPLES = sorted((RECIPE / "samples").glob("*.png"))
QUIET = {"log_level": "warning"}

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def local_records() -> dict[str, dict[str, Any]]:
    """The orientation recipe run in this process, as `to_record` per sample file name."""
    with ic.OfflineInference(ic.load_recipe(RECIPE)) as oi:
        results = oi.run(read_image(p, RAPIDOCR) for p in SAMPLES)
        return {p.name: oi.pipeline.to_record(r) for p, r in zip(SAMPLES, results, strict=True)}


def by_name(rows: list[dict[str, Any]], key: str = "path") -> dict[str, dict[str, Any]]:
    names = [Path(r[key]).name for r in rows]
    assert len(names) == len(set(names)), f"duplicated rows: {sorted(names)}"
    return {n: r for n, r in zip(names, rows, strict=True)}


def assert_same(ours: dict[str, dict[str, Any]], local: dict[str, dict[str, Any]]) -> None:
    assert ours.keys() == local.keys()
    for name, record in local.items():
        assert ours[name]["angle"] == record["angle"], name
        assert ours[name]["score"] == pytest.approx(record["score"], rel=1e-5), name


class ExitsOnFirstBatch(RecipePredictor):
    """Its process dies on the first batch it ever gets; every call leaves a file in `marks`."""

    def __init__(self, marks: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marks = Path(marks)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (self.marks / f"call-{uuid.uuid4().hex}").write_text(str(len(batch["path"])))
        first = self.marks / "died"
        if not first.exists():
            first.touch()
            os._exit(1)  # the actor's process ends mid-batch, as on a lost node
        return super().__call__(batch)


class RaisesOnFirstBatch(RecipePredictor):
    """Raises an application error on the first batch it ever gets."""

    def __init__(self, marks: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marks = Path(marks)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        first = self.marks / "raised"
        if not first.exists():
            first.touch()
            raise RuntimeError("transient failure on the first batch")
        return super().__call__(batch)


class MarksClose(RecipePredictor):
    """Leaves `started-<pid>` in `marks` once initialised, `closed-<pid>` when closed."""

    def __init__(self, marks: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marks = Path(marks)
        (self.marks / f"started-{os.getpid()}").touch()

    def close(self) -> None:
        if self._oi is not None:
            (self.marks / f"closed-{os.getpid()}").touch()
        super().close()


def pids(folder: Path, prefix: str) -> set[str]:
    return {f.name.removeprefix(prefix) for f in folder.glob(f"{prefix}*")}


def flaky(cls: type[RecipePredictor], marks: Path, **options: Any) -> Any:
    """The samples through `cls` on one actor, 4 rows per batch (3 batches)."""
    return read_dataset([RECIPE / "samples"]).map_batches(
        cls,
        fn_constructor_kwargs={"marks": str(marks), "recipe": str(RECIPE), **QUIET},
        compute=ray.data.ActorPoolStrategy(size=1),
        batch_size=4,
        batch_format="numpy",
        **options,
    )


def test_import_without_ray_works_and_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import inferchain, inferchain.integrations.ray as r\n"
        "try:\n    r.require_ray()\nexcept r.RayNotInstalled as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'inferchain[ray]'" in out.stdout


def test_predictor_in_process_reads_files_and_returns_one_row_per_input(tmp_path: Path) -> None:
    """No Ray needed to call it: a `path` batch, an unreadable file as an error row."""
    bad = tmp_path / "not_an_image.png"
    bad.write_text("text")
    paths = [str(SAMPLES[0]), str(bad), str(SAMPLES[1])]
    with RecipePredictor(RECIPE, on_error="return") as predictor:
        out = predictor({"path": np.array(paths), "id": np.arange(3)})
        assert list(out) == ["id", "path", "angle", "score", "error"]
        assert out["id"].tolist() == [0, 1, 2] and out["path"].tolist() == paths
        assert out["angle"][1] is None and out["error"][1].startswith("InvalidInput")
        assert out["error"][0] is None and out["error"][2] is None


def test_predictor_takes_an_image_column(local_records: dict[str, dict[str, Any]]) -> None:
    images = np.empty(len(SAMPLES), dtype=object)
    images[:] = [read_image(p, RAPIDOCR) for p in SAMPLES]
    names = np.array([p.name for p in SAMPLES])
    with RecipePredictor(RECIPE, passthrough=("name",)) as predictor:
        out = predictor({"image": images, "name": names})
    rows = [dict(zip(out, values, strict=True)) for values in zip(*out.values(), strict=True)]
    assert_same(by_name(rows, "name"), local_records)


def test_npy_rows_are_items(tmp_path: Path) -> None:
    """`read_dataset` on a stack of same-shape pages: one row each, read by Ray Data."""
    upright = [p for p in SAMPLES if p.name.endswith(("_rot0.png", "_rot180.png"))]
    np.save(tmp_path / "pages.npy", np.stack([read_image(p, RAPIDOCR) for p in upright]))
    batch = read_dataset([tmp_path / "pages.npy"]).take_batch(len(upright), batch_format="numpy")
    with RecipePredictor(RECIPE) as predictor:
        out = predictor(batch)
    assert out["angle"].tolist() == [0 if p.name.endswith("_rot0.png") else 180 for p in upright]


def test_dataset_on_two_actors_equals_the_local_run(
    local_records: dict[str, dict[str, Any]],
) -> None:
    ds = read_dataset([RECIPE / "samples"])
    rows = map_recipe(ds, RECIPE, concurrency=2, batch_size=4, **QUIET).take_all()
    assert_same(by_name(rows), local_records)


def test_each_actor_closes_its_offline_inference_when_the_dataset_ends(tmp_path: Path) -> None:
    ds = read_dataset([RECIPE / "samples"]).map_batches(
        MarksClose,
        fn_constructor_kwargs={"marks": str(tmp_path), "recipe": str(RECIPE), **QUIET},
        compute=ray.data.ActorPoolStrategy(size=2),
        batch_size=4,
        batch_format="numpy",
    )
    assert len(ds.take_all()) == len(SAMPLES)
    # actors exit asynchronously after the last batch
    wait_until(lambda: pids(tmp_path, "closed-") == pids(tmp_path, "started-"), timeout=60)
    assert pids(tmp_path, "started-") and pids(tmp_path, "closed-") == pids(tmp_path, "started-")


def test_dead_actor_is_restarted_and_its_batch_rerun_without_duplicates(
    tmp_path: Path, local_records: dict[str, dict[str, Any]]
) -> None:
    """At-least-once per batch (the lost batch runs twice), exactly one row per input."""
    rows = flaky(ExitsOnFirstBatch, tmp_path).take_all()
    assert_same(by_name(rows), local_records)
    calls = [int(f.read_text()) for f in tmp_path.glob("call-*")]
    assert sum(calls) == len(SAMPLES) + 4  # the first batch of 4 rows ran twice


def test_application_error_fails_the_dataset_unless_retries_are_on(
    tmp_path: Path, local_records: dict[str, dict[str, Any]]
) -> None:
    with pytest.raises(Exception, match="transient failure on the first batch"):
        flaky(RaisesOnFirstBatch, tmp_path).take_all()
    (tmp_path / "raised").unlink()
    ds = flaky(RaisesOnFirstBatch, tmp_path)
    ds.context.retried_map_errors = ["transient failure"]
    ds.context.max_map_retries = 1
    assert_same(by_name(ds.take_all()), local_records)


def test_cli_run_ray_writes_the_same_lines_as_a_local_run(tmp_path: Path) -> None:
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert main(["run", str(RECIPE), "--output", str(local)]) == 0
    assert main(["run", str(RECIPE), "--ray", "--concurrency", "2", "--output", str(remote)]) == 0
    lines = [
        [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        for out in (local, remote)
    ]
    assert [Path(r["file"]).name for r in lines[1]] == [p.name for p in SAMPLES]
    assert_same(by_name(lines[1], "file"), by_name(lines[0], "file"))


def test_cli_run_ray_writes_parquet(tmp_path: Path) -> None:
    out = tmp_path / "results.parquet"
    args = ["run", str(RECIPE), "--ray", "--limit", "5", "--output", str(out)]
    assert main(args) == 0
    rows = by_name(read_dataset([out]).take_all())  # a folder of only .parquet files
    assert sorted(rows) == [p.name for p in SAMPLES[:5]]
    for name, row in rows.items():
        assert row["error"] is None and name.endswith(f"_rot{row['angle']}.png")


def test_cli_run_ray_keeps_earlier_results_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ray"
    assert main(["run", str(RECIPE), "--ray", "--limit", "3", "--output", str(out)]) == 0
    before = (out / "results.jsonl").read_bytes()
    assert main(["run", str(RECIPE), "--ray", "--output", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (out / "results.jsonl").read_bytes() == before
    assert main(["run", str(RECIPE), "--ray", "--resume", "--output", str(out)]) == 0
    names = [json.loads(line)["file"] for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(Path(n).name for n in names) == [p.name for p in SAMPLES]
