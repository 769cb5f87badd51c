"""Page images read exactly as rapidocr_onnxruntime 1.4.4's `LoadImage` reads them.

Paths and bytes are decoded with PIL (a 1-bit image becomes 8-bit gray first) and PIL images
taken as they are; arrays are taken as they are. Then, as RapidOCR does:

- gray (H, W) or (H, W, 1) becomes BGR;
- gray + alpha (H, W, 2) is composited on white;
- three channels are RGB when they came through PIL (turned to BGR), BGR for an array;
- four channels are RGBA, from PIL or not: masked by alpha, then composited on white when
  nothing but black is left, else inverted (RapidOCR's `cvt_four_to_three`).

EXIF orientation is not applied: RapidOCR 1.4.4 does not apply it either. The pipeline
needs 8-bit images; another dtype is an `InvalidInput`.
"""

from __future__ import annotations

from io import BytesIO
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image

from inferchain.errors import InvalidInput

Array = np.ndarray


def read_page(item: Any) -> Array:
    """A BGR uint8 (H, W, 3) page from an image path, encoded bytes, an array or a PIL image;
    `InvalidInput` naming the item when it is none of those or cannot be read."""
    if isinstance(item, str | Path):
        name = str(item)
        if not Path(item).exists():
            raise InvalidInput(f"{name}: no such image file")
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
            "a page must be an image file path, encoded image bytes, a numpy array or a PIL "
            f"image, got {type(item).__name__}"
        )
    return to_bgr(image, through_pil=not isinstance(item, np.ndarray), name=name)


def _decode(name: str, open_image: Any) -> Array:
    try:
        with open_image() as image:
            return _pil_array(image)
    except (OSError, ValueError, SyntaxError) as e:  # PIL's errors for bad or truncated files
        raise InvalidInput(f"{name}: not a readable image ({e})") from None


def _pil_array(image: Image.Image) -> Array:
    """RapidOCR's `img_to_ndarray`: 1-bit images as 8-bit gray, anything else as it is."""
    if image.mode == "1":
        image = image.convert("L")
    return np.array(image)


def to_bgr(image: Array, *, through_pil: bool, name: str = "page") -> Array:
    """RapidOCR's `convert_img` (see the module docstring) on an 8-bit image."""
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
    gray = cv2.cvtColor(np.ascontiguousarray(image[..., 0]), cv2.COLOR_GRAY2BGR)
    alpha = np.ascontiguousarray(image[..., 1])
    background = cv2.cvtColor(cv2.bitwise_not(alpha), cv2.COLOR_GRAY2BGR)
    return np.asarray(cv2.add(cv2.bitwise_and(gray, gray, mask=alpha), background))


def rgba_to_bgr(image: Array) -> Array:
    """RGBA masked by its alpha; composited on white if only black is left, else inverted."""
    r, g, b, a = cv2.split(image)
    bgr = cv2.merge((b, g, r))
    background = cv2.cvtColor(cv2.bitwise_not(a), cv2.COLOR_GRAY2BGR)
    bgr = cv2.bitwise_and(bgr, bgr, mask=a)
    if np.mean(bgr) <= 0.0:
        return np.asarray(cv2.add(bgr, background))
    return np.asarray(cv2.bitwise_not(bgr))
