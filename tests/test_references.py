"""Precision regression: recipes' raw outputs against the references committed in
tests/references/ (refresh with `python -m inferchain.testing.references --update`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from inferchain.errors import ConfigError
from inferchain.testing import references
from inferchain.testing.references import Reference, check, compute

HERE = Path(__file__).resolve().parent
RECIPES = HERE.parent / "recipes"
REFERENCE_DIR = HERE / "references"


def test_the_orientation_recipe_has_a_reference() -> None:
    assert "orientation" in references.available(REFERENCE_DIR)


@pytest.fixture(scope="module", params=references.available(REFERENCE_DIR))
def fresh(request: pytest.FixtureRequest) -> tuple[Reference, references.Outputs]:
    """(the committed reference, outputs recomputed now) for each recipe with a file."""
    name = request.param
    reference = Reference.from_file(REFERENCE_DIR / f"{name}.json")
    model, outputs = compute(RECIPES / name)
    assert model == reference.model
    return reference, outputs


def test_recipe_outputs_match_the_committed_reference(
    fresh: tuple[Reference, references.Outputs],
) -> None:
    reference, outputs = fresh
    result = check(reference, outputs)
    assert result.passed, f"precision drifted from tests/references:\n{result.format()}"
    assert len(result.diffs) == len(outputs) >= 1  # every input file was checked


def test_a_drift_beyond_the_tolerance_fails(fresh: tuple[Reference, references.Outputs]) -> None:
    reference, outputs = fresh
    shift = 10 * (reference.atol + reference.rtol)
    drifted = {
        f: {k: v + np.float32(shift) for k, v in outs.items()} for f, outs in outputs.items()
    }
    result = check(reference, drifted)
    assert not result.passed
    assert "FAIL" in result.format()


def test_missing_and_extra_inputs_are_problems(fresh: tuple[Reference, references.Outputs]) -> None:
    reference, outputs = fresh
    first = sorted(outputs)[0]
    changed = {("new.png" if f == first else f): outs for f, outs in outputs.items()}
    result = check(reference, changed)
    assert not result.passed
    assert any(p.startswith("new.png: no reference") for p in result.problems)
    assert any(p.startswith(f"{first}: in the reference") for p in result.problems)


def test_update_writes_a_file_that_round_trips_and_keeps_its_tolerance(tmp_path: Path) -> None:
    shutil.copy(REFERENCE_DIR / "orientation.json", tmp_path / "orientation.json")
    committed = Reference.from_file(tmp_path / "orientation.json")
    assert references.main(["--update", "orientation", "--references-dir", str(tmp_path)]) == 0
    written = Reference.from_file(tmp_path / "orientation.json")
    assert (written.rtol, written.atol) == (committed.rtol, committed.atol)
    assert check(written, committed.outputs).passed
    assert references.main(["orientation", "--references-dir", str(tmp_path)]) == 0


def test_a_recipe_without_a_reference_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no reference file"):
        references.verify("orientation", RECIPES, tmp_path)
    assert references.main(["orientation", "--references-dir", str(tmp_path)]) == 1


def test_the_orientation_reference_inputs_are_its_samples_pre_processed() -> None:
    """`recipes/orientation/reference.npz`, on which a lower precision is checked, is what
    the pipeline makes of the bundled pages now (refresh: `--inputs orientation`)."""
    path, fresh_inputs = references.reference_inputs(RECIPES / "orientation")
    with np.load(path) as committed:
        assert set(committed.files) == set(fresh_inputs) == {"x"}
        assert committed["x"].shape == (12, 3, 224, 224)
        np.testing.assert_allclose(committed["x"], fresh_inputs["x"], atol=1e-4)
