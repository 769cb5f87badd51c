"""Image items of image pipelines: arrays or image file paths, and clear errors otherwise."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

import inferchain as ic
from inferchain.images import as_bgr

ORIENTATION = Path(__file__).resolve().parent.parent / "recipes" / "orientation"


def test_as_bgr_reads_a_path_as_read_image(tmp_path: Path) -> None:
    image = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    cv2.imwrite(str(tmp_path / "a.png"), image)
    assert np.array_equal(as_bgr(tmp_path / "a.png"), image)
    assert np.array_equal(as_bgr(str(tmp_path / "a.png")), image)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("page.png", "page.png: no such image file"),
        (42, "expected a numpy array or an image file path, got int"),
    ],
)
def test_as_bgr_names_what_it_cannot_read(item: object, message: str) -> None:
    with pytest.raises(ic.InvalidInput, match=message):
        as_bgr(item)  # type: ignore[arg-type]


def test_run_on_a_path_it_cannot_read_names_it() -> None:
    recipe = ic.load_recipe(ORIENTATION, models={"orientation": {"warmup": False}})
    with ic.OfflineInference(recipe) as oi:
        with pytest.raises(ic.InvalidInput, match=r"page\.png: no such image file"):
            list(oi.run(["page.png"]))
        page = sorted((ORIENTATION / "samples").iterdir())[0]
        (by_path,) = oi.run([page])
        assert by_path["angle"] in (0, 90, 180, 270)


def test_closed_and_init_messages_say_what_to_do(make_recipe: object, mlp_path: Path) -> None:
    recipe = ic.Recipe.from_dict({"name": "t", "models": [{"name": "m", "path": str(mlp_path)}]})
    oi = ic.OfflineInference(recipe)
    with pytest.raises(ic.Closed, match=r"call init\(\) first"):
        oi.infer("m", np.zeros(64, np.float32))
    oi.init()
    oi.close()
    with pytest.raises(ic.Closed, match="create a new OfflineInference"):
        oi.infer("m", np.zeros(64, np.float32))
    with pytest.raises(ic.Closed, match="create a new OfflineInference"):
        oi.init()
