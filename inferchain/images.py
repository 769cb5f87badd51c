"""Image input for image pipelines (OpenCV is needed only when images are read)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from inferchain.errors import InvalidInput


def read_image(path: str | Path) -> np.ndarray:
    """A BGR uint8 image (H, W, 3) from a file; `InvalidInput` naming the file if unreadable."""
    import cv2

    if not Path(path).is_file():
        raise InvalidInput(f"{path}: no such image file")
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise InvalidInput(f"{path}: not a readable image")
    return np.asarray(image)


def as_bgr(image: np.ndarray | str | Path) -> np.ndarray:
    """A BGR uint8 (H, W, 3) view of a gray, BGR or BGRA image, or the image file at a path
    (`read_image`); `InvalidInput` naming the item otherwise."""
    import cv2

    if isinstance(image, str | Path):
        return read_image(image)
    if not isinstance(image, np.ndarray):
        raise InvalidInput(
            f"image: expected a numpy array or an image file path, got {type(image).__name__}"
        )
    if image.dtype != np.uint8:
        raise InvalidInput(f"image: expected dtype uint8, got {image.dtype.name}")
    if image.ndim == 2:
        return np.asarray(cv2.cvtColor(image, cv2.COLOR_GRAY2BGR))
    if image.ndim == 3 and image.shape[2] == 3:
        return image
    if image.ndim == 3 and image.shape[2] == 4:
        return np.asarray(cv2.cvtColor(image, cv2.COLOR_BGRA2BGR))
    raise InvalidInput(f"image: expected (H, W), (H, W, 3) or (H, W, 4), got {image.shape}")
