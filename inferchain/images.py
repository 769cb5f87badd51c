"""Image input for image pipelines (OpenCV is needed only when images are read)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from inferchain.errors import InvalidInput


def read_image(path: str | Path) -> np.ndarray:
    """A BGR uint8 image (H, W, 3) from a file; `InvalidInput` naming the file if unreadable."""
    import cv2

    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise InvalidInput(f"{path}: not a readable image")
    return np.asarray(image)


def as_bgr(image: np.ndarray) -> np.ndarray:
    """A BGR uint8 (H, W, 3) view of a gray, BGR or BGRA image; `InvalidInput` otherwise."""
    import cv2

    if image.dtype != np.uint8:
        raise InvalidInput(f"image: expected dtype uint8, got {image.dtype.name}")
    if image.ndim == 2:
        return np.asarray(cv2.cvtColor(image, cv2.COLOR_GRAY2BGR))
    if image.ndim == 3 and image.shape[2] == 3:
        return image
    if image.ndim == 3 and image.shape[2] == 4:
        return np.asarray(cv2.cvtColor(image, cv2.COLOR_BGRA2BGR))
    raise InvalidInput(f"image: expected (H, W), (H, W, 3) or (H, W, 4), got {image.shape}")
