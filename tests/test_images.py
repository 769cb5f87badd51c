"""Image items of image pipelines: arrays or image file paths, and clear errors otherwise."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

import inferchain as ic
from inferchain.images import read_image

ORIENTATION = Path(__file__).resolve().parent.parent / "recipes" / "orientation"


def test_a_path_reads_as_opencv_reads_an_8_bit_png(tmp_path: Path) -> None:
    image = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    cv2.imwrite(str(tmp_path / "a.png"), image)
    assert np.array_equal(read_image(tmp_path / "a.png"), image)
    assert np.array_equal(read_image(str(tmp_path / "a.png")), image)
    assert np.array_equal(read_image(image), image)  # an array: BGR as it is


def test_the_opencv_path_for_rgb_pngs_gives_pils_pixels(tmp_path: Path) -> None:
    """8-bit RGB PNGs are decoded by OpenCV (faster, BGR at once); lossless, so exactly the
    pixels of the PIL path, which every other kind of file takes."""
    from PIL import Image

    from inferchain import images

    rng = np.random.default_rng(0)
    rgb = tmp_path / "rgb.png"
    Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)).save(rgb)
    assert images._rgb_png(str(rgb)) is not None
    through_pil = images.to_bgr(
        images._decode(str(rgb), lambda: Image.open(rgb)), through_pil=True, name="rgb"
    )
    assert np.array_equal(read_image(rgb), through_pil)
    for mode, shape in (("L", (9, 7)), ("RGBA", (9, 7, 4)), ("P", (9, 7))):
        other = tmp_path / f"{mode}.png"
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=mode).save(other)
        assert images._rgb_png(str(other)) is None, mode
    for page in sorted((ORIENTATION / "samples").iterdir()):
        decoded = images._decode(str(page), lambda p=page: Image.open(p))  # type: ignore[misc]
        assert np.array_equal(read_image(page), images.to_bgr(decoded, through_pil=True))


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("page.png", "page.png: no such image file"),
        (
            42,
            "an image must be an image file path, encoded image bytes, a numpy array or a PIL "
            "image, got int",
        ),
    ],
)
def test_read_image_names_what_it_cannot_read(item: object, message: str) -> None:
    with pytest.raises(ic.InvalidInput, match=message):
        read_image(item)


def test_run_on_a_path_it_cannot_read_names_it() -> None:
    recipe = ic.load_recipe(ORIENTATION, models={"orientation": {"warmup": False}})
    with ic.OfflineInference(recipe) as oi:
        with pytest.raises(ic.InvalidInput, match=r"page\.png: no such image file"):
            list(oi.run(["page.png"]))
        page = sorted((ORIENTATION / "samples").iterdir())[0]
        (by_path,) = oi.run([page])
        assert by_path["angle"] in (0, 90, 180, 270)


OCR = ORIENTATION.parent / "ocr"


def image_recipes() -> list[ic.OfflineInference]:
    """Both image recipes, started (no warm-up: nothing here runs their models)."""
    return [
        ic.OfflineInference(ic.load_recipe(ORIENTATION, models={"orientation": {"warmup": False}})),
        ic.OfflineInference(OCR),
    ]


def test_every_image_recipe_reads_16_bit_files_as_opencv_does(tmp_path: Path) -> None:
    """A 16-bit PNG (gray and colour) is the 8-bit image OpenCV's imread gives, in both the
    OCR and the orientation recipe (one reader)."""
    pytest.importorskip("rapidocr_onnxruntime")
    rng = np.random.default_rng(5)
    gray = rng.integers(0, 2**16, (12, 10), dtype=np.uint16)
    colour = rng.integers(0, 2**16, (12, 10, 3), dtype=np.uint16)
    for name, pixels in (("g16.png", gray), ("c16.png", colour)):
        cv2.imwrite(str(tmp_path / name), pixels)
        expected = cv2.imread(str(tmp_path / name), cv2.IMREAD_COLOR)
        for oi in image_recipes():
            with oi:
                got = oi.pipeline.load(tmp_path / name)
            assert got.dtype == np.uint8 and np.array_equal(got, expected), (name, oi.recipe.name)


def test_every_image_recipe_gives_a_truncated_file_the_same_message_with_its_cause(
    tmp_path: Path,
) -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    page = sorted((ORIENTATION / "samples").iterdir())[0]
    data = page.read_bytes()
    cut = tmp_path / "cut.png"
    cut.write_bytes(data[: len(data) // 2])
    messages = []
    for oi in image_recipes():
        with oi:
            (error,) = oi.run([cut], on_error="return")
        assert isinstance(error, ic.InvalidInput), oi.recipe.name
        messages.append(str(error))
    assert messages[0] == messages[1]
    assert messages[0] == f"{cut}: not a readable image (image file is truncated)"


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
