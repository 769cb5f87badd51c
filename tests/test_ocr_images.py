"""The OCR recipe reads every kind of image RapidOCR accepts exactly as RapidOCR does.

Generated pages of each kind (gray, gray + alpha, RGB, RGBA, 1-bit, EXIF-rotated; as paths,
bytes, arrays and PIL images) go through the reader the recipe chooses (`params.image.alpha:
rapidocr`, BGR: `inferchain.images.RAPIDOCR`) and through RapidOCR 1.4.4's own `LoadImage`,
and through the whole recipe and `RapidOCR()`: the same pixels, the same lines.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

import inferchain as ic
from inferchain.images import RAPIDOCR, ImageReader

rapidocr = pytest.importorskip("rapidocr_onnxruntime")
from rapidocr_onnxruntime.utils import LoadImage  # noqa: E402

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "ocr"
FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


def text_mask(size: tuple[int, int] = (360, 90), text: str = "Hello 2024") -> Image.Image:
    """An 'L' image: 255 where the text is, 0 elsewhere."""
    mask = Image.new("L", size, 0)
    font: Any = ImageFont.truetype(str(FONT), 40) if FONT.is_file() else ImageFont.load_default(40)
    ImageDraw.Draw(mask).text((16, 20), text, fill=255, font=font)
    return mask


def gray() -> Image.Image:
    return Image.eval(text_mask(), lambda v: 255 - v)  # black text on white


def gray_alpha() -> Image.Image:
    """Black text on a transparent background."""
    return Image.merge("LA", (Image.new("L", text_mask().size, 0), text_mask()))


def rgb() -> Image.Image:
    page = Image.new("RGB", text_mask().size, (250, 245, 230))
    page.paste((30, 60, 160), mask=text_mask())
    return page


def rgba_black_on_transparent() -> Image.Image:
    mask = text_mask()
    return Image.merge("RGBA", (*(Image.new("L", mask.size, 0),) * 3, mask))


def rgba_colour_on_transparent() -> Image.Image:
    mask = text_mask()
    colour = [Image.new("L", mask.size, v) for v in (200, 40, 40)]
    return Image.merge("RGBA", (*colour, mask))


def rgba_small_crop() -> Image.Image:
    """A small, mostly opaque RGBA crop of a page."""
    return rgb().crop((10, 15, 200, 75)).convert("RGBA")


def one_bit() -> Image.Image:
    return gray().convert("1")


def palette() -> Image.Image:
    return rgb().convert("P")


KINDS: dict[str, Callable[[], Image.Image]] = {
    "gray": gray,
    "gray_alpha": gray_alpha,
    "rgb": rgb,
    "rgba_black_on_transparent": rgba_black_on_transparent,
    "rgba_colour_on_transparent": rgba_colour_on_transparent,
    "rgba_small_crop": rgba_small_crop,
    "one_bit": one_bit,
    "palette": palette,
}


def png_bytes(image: Image.Image, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG", **options)
    return out.getvalue()


def exif_rotated_jpeg() -> bytes:
    """A JPEG tagged 'rotate 90 degrees' (EXIF orientation 6)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    rgb().save(out, format="JPEG", quality=95, exif=exif)
    return out.getvalue()


@pytest.fixture(scope="module")
def oi() -> Iterator[ic.OfflineInference]:
    with ic.OfflineInference(ic.load_recipe(RECIPE)) as oi:
        yield oi


@pytest.fixture(scope="module")
def images(oi: ic.OfflineInference) -> ImageReader:
    """The image reader the recipe reads its pages with: RapidOCR's (`alpha: rapidocr`)."""
    reader: ImageReader = oi.pipeline.reader  # type: ignore[attr-defined]
    assert reader == RAPIDOCR
    return reader


@pytest.fixture(scope="module")
def engine() -> Any:
    return rapidocr.RapidOCR(intra_op_num_threads=1, inter_op_num_threads=1)


def items_of(kind: str, tmp_path: Path) -> dict[str, Any]:
    """One image of `kind` as each input type RapidOCR takes."""
    image = KINDS[kind]()
    path = tmp_path / f"{kind}.png"
    image.save(path)
    return {
        "path": path,
        "str": str(path),
        "bytes": png_bytes(image),
        "pil": image,
        "array": np.array(image),
    }


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_read_image_gives_rapidocrs_pixels_for_every_input_type(
    kind: str, tmp_path: Path, images: ImageReader
) -> None:
    for how, item in items_of(kind, tmp_path).items():
        if isinstance(item, np.ndarray) and item.dtype == bool:  # a 1-bit image's array
            with pytest.raises(Exception, match="Bool"):
                LoadImage()(item)  # RapidOCR does not take it, nor do we
            with pytest.raises(ic.InvalidInput, match="expected 8-bit pixels"):
                images.read(item)
            continue
        ours, theirs = images.read(item), LoadImage()(item)
        assert ours.dtype == np.uint8 and ours.shape == theirs.shape, (kind, how)
        assert np.array_equal(ours, theirs), (kind, how)


def test_read_image_ignores_exif_orientation_like_rapidocr(images: ImageReader) -> None:
    data = exif_rotated_jpeg()
    ours = images.read(data)
    assert ours.shape[:2] == (90, 360)  # not turned: RapidOCR 1.4.4 does not turn it either
    assert np.array_equal(ours, LoadImage()(data))


def test_read_image_takes_arrays_of_one_two_and_four_channels_as_rapidocr(
    images: ImageReader,
) -> None:
    rng = np.random.default_rng(0)
    for shape in [(20, 30), (20, 30, 1), (20, 30, 2), (20, 30, 3), (20, 30, 4)]:
        array = rng.integers(0, 256, shape, dtype=np.uint8)
        assert np.array_equal(images.read(array), LoadImage()(array)), shape


def lines_of(result: list[Any]) -> list[tuple[str, list[list[float]], float]]:
    return [(line["text"], line["box"], line["score"]) for line in result]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_recipe_reads_the_same_lines_as_rapidocr(
    kind: str, tmp_path: Path, oi: ic.OfflineInference, engine: Any
) -> None:
    path = items_of(kind, tmp_path)["path"]
    (ours,) = oi.run([path])
    theirs = engine(path)[0] or []
    assert theirs, f"{kind}: RapidOCR reads no line, nothing to compare"
    assert [line["text"] for line in ours] == [t for _, t, _ in theirs], kind
    for line, (box, _, score) in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(line["box"], box, atol=1.0, err_msg=kind)
        assert line["score"] == pytest.approx(score, abs=1e-3), kind


def test_black_text_on_transparent_background_is_read(oi: ic.OfflineInference) -> None:
    (lines,) = oi.run([png_bytes(rgba_black_on_transparent())])
    assert [line["text"] for line in lines] == ["Hello", "2024"]  # where none were read before


def test_exif_rotated_page_reads_as_rapidocr(oi: ic.OfflineInference, engine: Any) -> None:
    data = exif_rotated_jpeg()
    (ours,) = oi.run([data])
    assert [line["text"] for line in ours] == [t for _, t, _ in engine(data)[0] or []]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("no/such/page.png", "no/such/page.png: no such image file"),
        (b"not an image", "not a readable image"),
        (42, "an image must be an image file path, encoded image bytes, a numpy array"),
        (np.zeros((8, 8, 3), np.float32), "expected 8-bit pixels"),
        (np.zeros((8, 8, 5), np.uint8), r"expected \(H, W\) or \(H, W, 1..4\)"),
    ],
)
def test_unreadable_items_are_invalid_input_naming_them(
    oi: ic.OfflineInference, item: Any, message: str
) -> None:
    with pytest.raises(ic.InvalidInput, match=message):
        list(oi.run([item]))


def test_a_text_file_named_png_is_invalid_input_naming_it(
    oi: ic.OfflineInference, tmp_path: Path
) -> None:
    fake = tmp_path / "empty.png"
    fake.write_bytes(b"")
    with pytest.raises(ic.InvalidInput, match=r"empty\.png: not a readable image"):
        list(oi.run([fake]))
