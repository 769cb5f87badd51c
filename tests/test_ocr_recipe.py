"""The OCR recipe: the same lines as RapidOCR on every sample, and rec batches across pages."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import inferchain as ic
from inferchain.images import RAPIDOCR, read_image

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "ocr"
SAMPLES = sorted((RECIPE / "samples").glob("*.png"))

rapidocr = pytest.importorskip("rapidocr_onnxruntime")


def texts(results: list[Any]) -> list[list[str]]:
    return [[line["text"] for line in page] for page in results]


@pytest.fixture(scope="module")
def pages() -> list[np.ndarray]:
    return [read_image(p, RAPIDOCR) for p in SAMPLES]


@pytest.fixture(scope="module")
def oi() -> Iterator[ic.OfflineInference]:
    with ic.OfflineInference(ic.load_recipe(RECIPE)) as oi:
        yield oi


@pytest.fixture(scope="module")
def expected(pages: list[np.ndarray]) -> list[list[Any]]:
    """RapidOCR's `[box, text, score]` lines per page, on the same BGR arrays.

    One thread per session, like the recipe: the outputs do not depend on it, and a 2-core
    machine shared with other jobs runs it far more steadily than a spinning thread pool.
    """
    engine = rapidocr.RapidOCR(intra_op_num_threads=1, inter_op_num_threads=1)
    return [engine(page)[0] or [] for page in pages]


@pytest.fixture(scope="module")
def together(oi: ic.OfflineInference, pages: list[np.ndarray]) -> list[Any]:
    """The lines of every page, all pages in flight at once."""
    return list(oi.run(pages, max_in_flight=len(pages)))


@pytest.fixture(scope="module")
def ops(oi: ic.OfflineInference) -> ModuleType:
    """The recipe's pipeline module, as the recipe loaded it."""
    return sys.modules[type(oi.pipeline).__module__]


def test_samples_are_small_pages() -> None:
    assert 5 <= len(SAMPLES) <= 8
    assert sum(p.stat().st_size for p in SAMPLES) < 500_000
    assert all(max(read_image(p, RAPIDOCR).shape[:2]) <= 1000 for p in SAMPLES)


def test_every_sample_reads_like_rapidocr(together: list[Any], expected: list[list[Any]]) -> None:
    """Same texts in the same order; boxes within 1 px; scores within 1e-3."""
    assert len(together) == len(SAMPLES)
    for path, ours, theirs in zip(SAMPLES, together, expected, strict=True):
        assert [line["text"] for line in ours] == [t for _, t, _ in theirs], path.name
        for line, (box, _, score) in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(line["box"], box, atol=1.0, err_msg=path.name)
            assert line["score"] == pytest.approx(score, abs=1e-3), (path.name, line["text"])


def test_samples_exercise_rotated_and_upside_down_lines(together: list[Any]) -> None:
    found = {line["text"] for page in together for line in page}
    assert "PAIDWITHTHANKS" in found  # tilted 8 degrees
    assert "Confidential2024" in found  # upside down: the classifier turns it
    assert "0042" in found  # vertical: the crop is turned 90 degrees


def test_rec_requests_of_several_pages_share_batches() -> None:
    """Crops of different pages padded to the same width batch together.

    The shipped recipe runs each crop alone on a CPU (cheaper per crop there). With room for
    16 rows and one rec worker, two copies of a page in flight together need fewer rec
    batches than the same two pages one after the other: their crops share batches.
    """
    table = read_image(RECIPE / "samples" / "06_table.png", RAPIDOCR)
    recipe = ic.load_recipe(
        RECIPE, threads="manual", models={"rec": {"instances": 1, "max_batch_size": 16}}
    )
    with ic.OfflineInference(recipe) as wide:
        alone = [list(wide.run([table])) for _ in range(2)]
        batches_alone = wide.stats().models["rec"].batches
        both = list(wide.run([table, table], max_in_flight=2))
        batches_both = wide.stats().models["rec"].batches - batches_alone
    assert texts(both) == texts([alone[0][0], alone[1][0]])
    assert batches_both < batches_alone


def test_blank_and_gray_pages_give_no_lines(oi: ic.OfflineInference) -> None:
    blank = np.full((300, 400), 255, np.uint8)
    assert list(oi.run([blank, np.zeros((40, 900, 3), np.uint8)])) == [[], []]


def test_record_summary_and_saved_image(
    oi: ic.OfflineInference, pages: list[np.ndarray], tmp_path: Path
) -> None:
    (result,) = oi.run(pages[:1])
    pipeline = oi.pipeline
    record = pipeline.to_record(result)
    assert record["lines"][0]["text"] == "Northwind Trading Ltd."
    assert pipeline.summary(result).startswith(f"{len(result)} lines: Northwind")
    pipeline.save(SAMPLES[0], pages[0], result, tmp_path)
    drawn = read_image(tmp_path / f"{SAMPLES[0].stem}_ocr.png", RAPIDOCR)
    assert drawn.shape == pages[0].shape and not np.array_equal(drawn, pages[0])


def test_unknown_param_is_a_config_error() -> None:
    recipe = ic.load_recipe(RECIPE, params={"det": {"thresh": 0.3, "treshold": 0.5}})
    oi = ic.OfflineInference(recipe)
    try:
        with pytest.raises(ic.ConfigError, match=r"treshold.*params\.det"):
            oi.init()
    finally:
        oi.close()  # init() started the models before the pipeline failed to load


def test_ctc_decode_merges_repeats_and_drops_blanks(ops: ModuleType) -> None:
    charset = ["blank", "a", "b", " "]
    steps = [1, 1, 0, 1, 2, 2, 0, 0, 3]
    probs = np.full((len(steps), 4), 0.01, np.float32)
    probs[np.arange(len(steps)), steps] = np.linspace(0.5, 0.9, len(steps), dtype=np.float32)
    text, score = ops.ctc_decode(probs, charset)
    assert text == "aab "
    assert score == pytest.approx(float(np.mean(probs.max(axis=1)[[0, 3, 4, 8]])))
    assert ops.ctc_decode(np.eye(4, dtype=np.float32)[[0, 0]], charset) == ("", 0.0)


def test_rec_widths_pad_each_group_of_six_to_its_widest(ops: ModuleType) -> None:
    """RapidOCR's rec groups: sorted by aspect ratio, six at a time, at least 320 wide."""
    ratios = [2, 30, 4, 8, 3, 5, 12, 1]  # width / height, crops 10 px high
    crops = [np.zeros((10, 10 * r, 3), np.uint8) for r in ratios]
    widths = ops.rec_widths(crops, ops.RecSettings())
    group = 48 * 8  # the six narrowest: 1 2 3 4 5 8 -> 8 is the widest
    assert widths == [group, 48 * 30, group, group, group, group, 48 * 30, group]
    narrow = ops.rec_widths(crops[:1], ops.RecSettings())
    assert narrow == [320]


def test_reading_order_is_top_down_then_left_to_right(ops: ModuleType) -> None:
    def box(x: float, y: float) -> list[list[float]]:
        return [[x, y], [x + 50, y], [x + 50, y + 20], [x, y + 20]]

    boxes = np.array([box(300, 105), box(10, 100), box(10, 200), box(150, 98)], np.float32)
    ordered = ops.reading_order(boxes)
    assert [b[0].tolist() for b in ordered] == [[10, 100], [150, 98], [300, 105], [10, 200]]
