"""`batching: fill` (batches of consecutive rows, full until a flush) and the `longest`
shape strategy (a batch padded to its rows' envelope, with each input's own pad value)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import recipe

import inferchain as ic
from inferchain import RequestState as S
from inferchain.pipeline import Pipeline, Process
from inferchain.testing.onnx_models import write_image_model

PAD = -0.5  # scaled = image * 2 + 1 is 0 where the image is padded with it


@pytest.fixture(scope="module")
def image_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_model(tmp_path_factory.mktemp("img") / "img.onnx", channels=1)


def fill_recipe(path: Path, **model: object) -> ic.Recipe:
    return recipe(
        {
            "name": "img",
            "path": str(path),
            "max_batch_size": 4,
            "max_queue_delay_ms": 1,
            "batching": "fill",
            "shapes": {"strategy": "longest"},
            "inputs": {"image": {"pad": PAD}},
            "warmup": False,
            **model,
        }
    )


def images(sizes: list[tuple[int, int]]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.random((1, h, w), dtype=np.float32) for h, w in sizes]


SIZES = [(2, 3), (4, 1), (3, 3), (1, 5), (2, 2), (5, 1)]


def test_full_batches_of_consecutive_rows_padded_to_their_longest(image_path: Path) -> None:
    with ic.OfflineInference(fill_recipe(image_path)) as oi:
        xs = images(SIZES)
        reqs = [oi.submit("img", x) for x in xs]
        for r in reqs[:4]:
            r.result(timeout=10)
        # the last two wait for a full batch, past any window (tests/test_engine.py steps
        # the engine past it without threads)
        assert [r.state for r in reqs[4:]] == [S.READY, S.READY]
        oi.flush()
        for r in reqs[4:]:
            r.result(timeout=10)
        sizes = oi.stats().models["img"].batch_sizes
    assert sizes == {4: 1, 2: 1}
    for r, x, batch in zip(reqs, xs, [SIZES[:4]] * 4 + [SIZES[4:]] * 2, strict=True):
        h, w = max(s[0] for s in batch), max(s[1] for s in batch)
        scaled = r.outputs["scaled"]  # type: ignore[index]
        assert scaled.shape == (1, h, w)  # the batch's envelope: not cropped
        expected = np.zeros((1, h, w), np.float32)  # the padding: PAD * 2 + 1
        expected[:, : x.shape[1], : x.shape[2]] = x * 2 + 1
        np.testing.assert_allclose(scaled, expected, rtol=1e-6)
        np.testing.assert_allclose(r.outputs["mean"], expected.mean(axis=(1, 2)), rtol=1e-5)  # type: ignore[index]


def test_wait_all_and_close_flush_a_partial_batch(image_path: Path) -> None:
    oi = ic.OfflineInference(fill_recipe(image_path)).init()
    first = oi.submit("img", images([(2, 2)])[0])
    assert oi.wait_all(timeout=10) and first.state is S.DONE
    second = oi.submit("img", images([(3, 1)])[0])
    oi.close()
    assert second.state is S.DONE


class Scaled(Pipeline):
    max_in_flight = 3  # fewer than a batch: the driver flushes when nothing else can run

    def process(self, item: np.ndarray) -> Process:
        out = yield self.submit("img", item)
        return out["scaled"].shape


def test_a_run_flushes_when_its_input_ends_or_it_cannot_start_more(
    image_path: Path, tmp_path: Path
) -> None:
    with ic.OfflineInference(fill_recipe(image_path)) as oi:
        oi._pipeline = Scaled(oi)
        shapes = list(oi.run(images(SIZES)))  # 3 in flight at most: batches of 3
        assert oi.stats().models["img"].batch_sizes == {3: 2}
        shapes_big = list(oi.run(images(SIZES), max_in_flight=8))  # 4, then the last 2
        assert oi.stats().models["img"].batch_sizes == {3: 2, 4: 1, 2: 1}
    assert shapes[0] == (1, 4, 3) and shapes[3] == (1, 5, 5)
    assert shapes_big[0] == (1, 4, 5) and shapes_big[5] == (1, 5, 2)


def test_pad_values_are_per_input_and_checked_in_the_recipe(tmp_path: Path) -> None:
    with pytest.raises(ic.ConfigError, match=r"models\[0\].inputs.image.pad' must be"):
        recipe({"name": "m", "path": "m.onnx", "inputs": {"image": {"pad": "zero"}}})
    with pytest.raises(ic.ConfigError, match="batching must be one of window, wait, fill"):
        recipe({"name": "m", "path": "m.onnx", "batching": "full"})


class Anchored(Pipeline):
    """Fails item 1 before it submits anything; the others run through the fill model."""

    def process(self, item: np.ndarray) -> Process:
        if item.shape == (1, 4, 1):
            raise ValueError("not this one")
        out = yield self.submit("img", item)
        return out["scaled"].shape


def test_anchored_runs_cut_batches_at_input_positions_whatever_fails(image_path: Path) -> None:
    """The pipeline's anchor is the fill model's batch (4): items 0-3 (less the failed one)
    are one batch, 4-5 the next: the failure does not shift the later batches."""
    sizes = [*SIZES, (1, 1), (2, 1), (3, 2)]  # 9 items: runs 0-3, 4-7, 8
    with ic.OfflineInference(fill_recipe(image_path)) as oi:
        pipeline = Anchored(oi)
        assert pipeline.anchor == 4
        oi._pipeline = pipeline
        shapes = list(oi.run(images(sizes), on_error="return"))
        assert oi.stats().models["img"].batch_sizes == {3: 1, 4: 1, 1: 1}
    assert isinstance(shapes[1], ValueError)
    assert shapes[0] == (1, 3, 5)  # padded to items 0, 2, 3: not to item 4
    assert shapes[4] == (1, 5, 2)  # items 4-7
    assert shapes[8] == (1, 3, 2)  # alone
