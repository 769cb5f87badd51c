"""The image reader: Pillow's pixels by default, every option as documented, clear errors.

The defaults are checked against what a plain script gets from Pillow
(`np.asarray(Image.open(f).convert("RGB"))`) for every kind of image and every kind of item;
RapidOCR's own conversion is `tests/test_ocr_images.py`'s.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image, ImageOps

import inferchain as ic
from inferchain import image_files
from inferchain.images import PLAIN, RAPIDOCR, ImageReader, read_image

ORIENTATION = Path(__file__).resolve().parent.parent / "recipes" / "orientation"
OCR = ORIENTATION.parent / "ocr"
RNG = np.random.default_rng(7)


def kinds() -> dict[str, Image.Image]:
    """One small image of each kind a file may hold."""
    rgba = Image.fromarray(RNG.integers(0, 256, (9, 13, 4), dtype=np.uint8), "RGBA")
    palette = rgba.convert("RGB").convert("P")
    with_transparency = palette.copy()
    with_transparency.info["transparency"] = 3
    return {
        "gray": rgba.convert("L"),
        "gray_alpha": rgba.convert("LA"),
        "rgb": rgba.convert("RGB"),
        "rgba": rgba,
        "palette": palette,
        "palette_transparent": with_transparency,
        "one_bit": rgba.convert("1"),
    }


def saved(image: Image.Image, tmp_path: Path, name: str, **options: Any) -> Path:
    path = tmp_path / name
    image.save(path, **options)
    return path


def pillow_rgb(path: Path) -> np.ndarray:
    """What a plain script reads."""
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


@pytest.mark.parametrize("kind", sorted(kinds()))
def test_the_default_reader_gives_pillows_rgb_for_every_kind_and_item(
    kind: str, tmp_path: Path
) -> None:
    path = saved(kinds()[kind], tmp_path, f"{kind}.png")
    expected = pillow_rgb(path)
    with Image.open(path) as opened:
        items = [path, str(path), path.read_bytes(), opened]
        for item in items:
            got = read_image(item)
            assert got.dtype == np.uint8 and got.shape == (9, 13, 3), (kind, type(item))
            assert np.array_equal(got, expected), (kind, type(item))
            flipped = ImageReader(channels="bgr").read(item)
            assert np.array_equal(flipped, expected[..., ::-1]), (kind, type(item))


def test_arrays_are_taken_in_the_readers_order_and_gray_becomes_three_channels() -> None:
    rgb = RNG.integers(0, 256, (5, 6, 3), dtype=np.uint8)
    for reader in (PLAIN, ImageReader(channels="bgr")):
        assert np.array_equal(reader.read(rgb), rgb)  # as it is: no flip of an array
        gray = rgb[..., 0]
        assert np.array_equal(reader.read(gray), np.dstack([gray] * 3))
        assert np.array_equal(reader.read(gray[..., None]), np.dstack([gray] * 3))
        rgba = np.dstack((rgb, RNG.integers(0, 256, (5, 6), dtype=np.uint8)))
        assert np.array_equal(reader.read(rgba), rgb)  # alpha dropped


def test_alpha_white_composites_on_white_as_the_docs_say(tmp_path: Path) -> None:
    image = kinds()["rgba"]
    rgba = np.asarray(image)
    c, a = rgba[..., :3].astype(float), rgba[..., 3:].astype(float)
    expected = np.rint(c * a / 255 + 255 - a).astype(np.uint8)
    white = ImageReader(alpha="white")
    assert np.array_equal(white.read(rgba), expected)
    path = saved(image, tmp_path, "rgba.png")
    assert np.array_equal(white.read(path), expected)
    assert np.array_equal(
        ImageReader(alpha="white", channels="bgr").read(path), expected[..., ::-1]
    )
    opaque = saved(kinds()["rgb"], tmp_path, "rgb.png")  # nothing to composite
    assert np.array_equal(white.read(opaque), pillow_rgb(opaque))


def test_rapidocr_alpha_is_not_the_default_it_inverts_rgba() -> None:
    """The trap the default avoids: RapidOCR's conversion inverts an RGBA image that is not
    all black, which is right for its OCR models and wrong for anyone else's."""
    rgba = np.asarray(kinds()["rgba"])
    masked = (rgba[..., :3].astype(np.uint16) * (rgba[..., 3:] > 0)).astype(np.uint8)
    assert np.array_equal(RAPIDOCR.read(rgba), 255 - masked[..., ::-1])
    assert not np.array_equal(PLAIN.read(rgba), ImageReader(alpha="rapidocr").read(rgba))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_true_turns_as_pillows_exif_transpose(orientation: int, tmp_path: Path) -> None:
    exif = Image.Exif()
    exif[image_files.ORIENTATION] = orientation
    image = kinds()["rgb"]
    for suffix in ("jpg", "png"):
        path = saved(image, tmp_path, f"o{orientation}.{suffix}", exif=exif)
        with Image.open(path) as opened:
            turned = np.asarray(ImageOps.exif_transpose(opened).convert("RGB"))
        assert np.array_equal(ImageReader(exif=True).read(path), turned), suffix
        assert np.array_equal(read_image(path), pillow_rgb(path)), suffix  # default: as stored


@pytest.mark.parametrize(
    "options",
    [{"quality": 90}, {"quality": 95, "subsampling": 0}, {"progressive": True}, {"mode": "L"}],
)
def test_jpegs_decoded_strictly_give_pillows_pixels(
    options: dict[str, Any], tmp_path: Path
) -> None:
    options = dict(options)
    image = Image.fromarray(RNG.integers(0, 256, (67, 91, 3), dtype=np.uint8))
    if options.pop("mode", None):
        image = image.convert("L")
    path = saved(image, tmp_path, "page.jpg", **options)
    assert np.array_equal(read_image(path), pillow_rgb(path))
    assert np.array_equal(read_image(path.read_bytes()), pillow_rgb(path))


def jpeg_bytes(size: tuple[int, int] = (120, 80)) -> bytes:
    out = io.BytesIO()
    gradient = np.tile(np.linspace(0, 255, size[0], dtype=np.uint8), (size[1], 1))
    Image.fromarray(np.dstack([gradient] * 3)).save(out, format="JPEG", quality=90)
    return out.getvalue()


@pytest.mark.parametrize("reader", [PLAIN, RAPIDOCR], ids=["plain", "rapidocr"])
def test_a_truncated_or_corrupt_jpeg_is_invalid_input_never_partly_grey(
    reader: ImageReader, tmp_path: Path
) -> None:
    data = jpeg_bytes()
    with Image.open(io.BytesIO(data[: len(data) // 2] + b"\xff\xd9")) as lenient:
        np.asarray(lenient.convert("RGB"))  # Pillow decodes it, grey where data is missing
    for name, broken in (
        ("cut", data[: len(data) // 2]),
        ("cut_eoi", data[: len(data) // 2] + b"\xff\xd9"),
    ):
        path = tmp_path / f"{name}.jpg"
        path.write_bytes(broken)
        with pytest.raises(ic.InvalidInput, match=rf"{name}\.jpg: not a readable image \(.+\)"):
            reader.read(path)
        with pytest.raises(ic.InvalidInput, match=r"an image of \d+ bytes: not a readable image"):
            reader.read(broken)


def test_the_opencv_path_for_rgb_pngs_gives_pillows_pixels(tmp_path: Path) -> None:
    """8-bit RGB PNGs are decoded by OpenCV where BGR is wanted (faster, BGR at once);
    lossless, so exactly the pixels of the Pillow path, which every other file takes."""
    rgb = saved(
        Image.fromarray(RNG.integers(0, 256, (37, 53, 3), dtype=np.uint8)), tmp_path, "c.png"
    )
    assert image_files.rgb_png(rgb, "rgb", PLAIN.limit) is not None
    assert np.array_equal(ImageReader(channels="bgr").read(rgb), pillow_rgb(rgb)[..., ::-1])
    for kind in ("gray", "rgba", "palette"):
        other = saved(kinds()[kind], tmp_path, f"{kind}.png")
        assert image_files.rgb_png(other, kind, PLAIN.limit) is None, kind
    for page in sorted((ORIENTATION / "samples").iterdir()):
        assert np.array_equal(RAPIDOCR.read(page), pillow_rgb(page)[..., ::-1]), page.name


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("page.png", "page.png: no such image file"),
        (
            42,
            "an image must be an image file path, encoded image bytes, a numpy array or a PIL "
            "image, got int",
        ),
        (np.zeros((4, 4, 3), np.float32), r"an array \(4, 4, 3\): expected 8-bit pixels"),
        (np.zeros((4, 4, 5), np.uint8), r"expected \(H, W\) or \(H, W, 1..4\) pixels"),
        (b"not an image", "an image of 12 bytes: not a readable image"),
    ],
)
def test_read_image_names_what_it_cannot_read(item: object, message: str) -> None:
    for reader in (PLAIN, RAPIDOCR):
        with pytest.raises(ic.InvalidInput, match=message):
            reader.read(item)


def test_params_image_is_checked_against_its_keys_and_values(tmp_path: Path) -> None:
    source = tmp_path / "recipe.yaml"
    assert ImageReader.from_params(None, source) == PLAIN
    assert ImageReader.from_params({"alpha": "rapidocr"}, source, "bgr") == RAPIDOCR
    with pytest.raises(ic.ConfigError, match=r"unknown keys \['alfa'\] in params.image"):
        ImageReader.from_params({"alfa": "white"}, source)
    with pytest.raises(ic.ConfigError, match=r"params.image: .*'alpha' must be in"):
        ImageReader.from_params({"alpha": "black"}, source)
    with pytest.raises(ic.ConfigError, match=r"params.image: .*max_mb"):
        ImageReader.from_params({"max_mb": 0}, source)
    for endless in (float("inf"), float("nan")):  # named, not an OverflowError at the limit
        with pytest.raises(ic.ConfigError, match=r"max_mb must be a finite .*NaN or infinity"):
            ImageReader.from_params({"max_mb": endless}, source)


def test_run_reads_a_str_item_as_a_path_for_image_pipelines(tmp_path: Path) -> None:
    """`ImagePipeline.path_items`: a `str` item names a file, read with `load` as a `Path`
    is; one that cannot be read fails alone, named."""
    recipe = ic.load_recipe(ORIENTATION, models={"orientation": {"warmup": False}})
    page = sorted((ORIENTATION / "samples").iterdir())[0]
    with ic.OfflineInference(recipe) as oi:
        assert oi.pipeline.path_items
        by_str, by_path, missing = oi.run([str(page), page, "page.png"], on_error="return")
        assert by_str == by_path and by_str["angle"] in (0, 90, 180, 270)
        assert isinstance(missing, ic.InvalidInput)
        assert str(missing) == "page.png: no such image file"


def image_recipes() -> list[ic.OfflineInference]:
    """Both image recipes, started (no warm-up: nothing here runs their models)."""
    return [
        ic.OfflineInference(ic.load_recipe(ORIENTATION, models={"orientation": {"warmup": False}})),
        ic.OfflineInference(OCR),
    ]


def test_every_image_recipe_reads_16_bit_files_as_opencv_does(tmp_path: Path) -> None:
    """A 16-bit PNG (gray and colour) is the 8-bit image OpenCV's imread gives, in both the
    OCR and the orientation recipe (one reader), and the default reader keeps the same
    high bytes in RGB order."""
    pytest.importorskip("rapidocr_onnxruntime")
    gray = RNG.integers(0, 2**16, (12, 10), dtype=np.uint16)
    colour = RNG.integers(0, 2**16, (12, 10, 3), dtype=np.uint16)
    for name, pixels in (("g16.png", gray), ("c16.png", colour)):
        cv2.imwrite(str(tmp_path / name), pixels)
        expected = cv2.imread(str(tmp_path / name), cv2.IMREAD_COLOR)
        for oi in image_recipes():
            with oi:
                got = oi.pipeline.load(tmp_path / name)
            assert got.dtype == np.uint8 and np.array_equal(got, expected), (name, oi.recipe.name)
        assert np.array_equal(read_image(tmp_path / name), expected[..., ::-1]), name


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


@pytest.mark.parametrize("reader", [PLAIN, RAPIDOCR], ids=["plain", "rapidocr"])
def test_a_truncated_rgb_png_is_invalid_input_on_the_opencv_path_too(
    reader: ImageReader, tmp_path: Path
) -> None:
    """An 8-bit RGB PNG goes to OpenCV where BGR is wanted; cut short, it is refused all the
    same (OpenCV gives nothing, Pillow names the cause)."""
    whole = saved(
        Image.fromarray(RNG.integers(0, 256, (60, 80, 3), dtype=np.uint8)), tmp_path, "w.png"
    )
    cut = tmp_path / "cut.png"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    with pytest.raises(
        ic.InvalidInput, match=r"cut\.png: not a readable image \(image file is truncated"
    ):
        reader.read(cut)
