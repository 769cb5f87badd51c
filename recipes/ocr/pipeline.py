"""The OCR recipe's pipeline: PP-OCRv4 det -> cls -> rec per page, as RapidOCR does it.

Each page is one generator (`OcrPipeline.process`): one det request, then one cls request per
detected line, then one rec request per line. Many pages are in flight at once, so cls crops
(fixed 3x48x192) of all pages batch together, and rec crops batch whenever their padded widths
agree. The pre/post-processing reproduces rapidocr_onnxruntime 1.4.4 step by step (same
resizing, normalisation bits, DB box extraction, line order and rec padding), so texts are
identical and scores agree to float rounding; rapidocr itself is not imported.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import cv2
import numpy as np
import pyclipper
from shapely.geometry import Polygon

from inferchain.errors import ConfigError, InvalidInput
from inferchain.images import RAPIDOCR, ImageReader
from inferchain.pipeline import ImagePipeline, Process

if TYPE_CHECKING:
    from inferchain.offline import OfflineInference

Array = np.ndarray
Line = dict[str, Any]  # {"box": [[x, y] x 4], "text": str, "score": float}


# -- settings -------------------------------------------------------------------------------


@attrs.frozen
class PageSettings:
    """`params.page`: RapidOCR's Global section (page size bounds, letterbox, min score)."""

    max_side_len: int = 2000
    min_side_len: int = 30
    min_height: int = 30
    width_height_ratio: float = 8
    text_score: float = 0.5


@attrs.frozen
class DetSettings:
    """`params.det`: DB detection pre/post-processing."""

    limit_side_len: int = 736
    limit_type: str = "min"
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    thresh: float = 0.3
    box_thresh: float = 0.5
    max_candidates: int = 1000
    unclip_ratio: float = 1.6
    use_dilation: bool = True
    score_mode: str = "fast"


@attrs.frozen
class ClsSettings:
    """`params.cls`: the 0/180 degree line classifier."""

    image_shape: tuple[int, ...] = (3, 48, 192)
    thresh: float = 0.9
    labels: tuple[str, ...] = ("0", "180")


@attrs.frozen
class RecSettings:
    """`params.rec`: CTC recognition; widths follow RapidOCR's groups of `batch_num`."""

    image_shape: tuple[int, ...] = (3, 48, 320)
    batch_num: int = 6
    pad_multiple: int = 2
    keys_path: str | None = None


def _section(cls: type[Any], params: Mapping[str, Any], name: str, source: Path) -> Any:
    """The attrs settings record of `params.<name>` (lists become tuples)."""
    values = params.get(name) or {}
    known = {f.name for f in attrs.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"{source}: unknown keys {unknown} in params.{name} (known: {', '.join(sorted(known))})"
        )
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


# -- page and detection ---------------------------------------------------------------------


@attrs.frozen(eq=False)
class Page:
    """A page as the detector sees it, and how to map its coordinates back to the input."""

    image: Array  # BGR uint8, resized and letterboxed
    raw_size: tuple[int, int]  # (h, w) of the input image
    scale: tuple[float, float]  # (ratio_h, ratio_w): input pixels per page pixel
    top: int  # letterbox rows added above


def _round32(size: float) -> int:
    return int(round(size / 32) * 32)


def _resize_side(image: Array, ratio: float, reader: ImageReader) -> tuple[Array, float, float]:
    h, w = image.shape[:2]
    new_h, new_w = _round32(int(h * ratio)), _round32(int(w * ratio))
    if new_h <= 0 or new_w <= 0:
        raise InvalidInput(f"a page of {w}x{h} pixels is too small to resize")
    reader.check(f"a page of {w}x{h} pixels", new_w, new_h, what="resizing it makes")
    return cv2.resize(image, (new_w, new_h)), h / new_h, w / new_w


def prepare_page(image: Array, s: PageSettings, reader: ImageReader = RAPIDOCR) -> Page:
    """Bound the page's sides and letterbox very flat pages (RapidOCR's preprocess); each
    image made on the way is checked against `reader`'s `max_mb` first."""
    raw_h, raw_w = image.shape[:2]
    ratio_h = ratio_w = 1.0
    if max(raw_h, raw_w) > s.max_side_len:
        image, ratio_h, ratio_w = _resize_side(image, s.max_side_len / max(raw_h, raw_w), reader)
    if min(image.shape[:2]) < s.min_side_len:
        image, ratio_h, ratio_w = _resize_side(image, s.min_side_len / min(image.shape[:2]), reader)
    h, w = image.shape[:2]
    top = 0
    if h <= s.min_height or (s.width_height_ratio != -1 and w / h > s.width_height_ratio):
        new_h = max(int(w / s.width_height_ratio), s.min_height) * 2
        top = int(abs(new_h - h) / 2)
        reader.check(f"a page of {w}x{h} pixels", w, h + 2 * top, what="letterboxing it makes")
        image = cv2.copyMakeBorder(image, top, top, 0, 0, cv2.BORDER_CONSTANT, value=(0, 0, 0))
    return Page(image, (raw_h, raw_w), (ratio_h, ratio_w), top)


def det_input(
    image: Array, s: DetSettings, lut: Array, reader: ImageReader = RAPIDOCR
) -> Array | None:
    """The det tensor (3, H, W): resized to multiples of 32 and normalised through `lut`
    (its size checked against `reader`'s `max_mb` first)."""
    h, w = image.shape[:2]
    if s.limit_type == "min":
        limit = s.limit_side_len
        ratio = limit / min(h, w) if min(h, w) < limit else 1.0
    else:
        longest = max(h, w)
        limit = 960 if longest < 960 else 1500 if longest < 1500 else 2000
        ratio = limit / longest if longest > limit else 1.0
    new_h, new_w = _round32(int(h * ratio)), _round32(int(w * ratio))
    if new_h <= 0 or new_w <= 0:
        return None
    name = f"a page of {w}x{h} pixels"
    reader.check(name, new_w, new_h, what="its det tensor makes", dtype="float32")
    resized = np.asarray(cv2.resize(image, (new_w, new_h)), np.uint8)
    out = np.empty((3, new_h, new_w), np.float32)
    for c in range(3):
        np.take(lut[c], resized[:, :, c], out=out[c])
    return out


def det_lut(s: DetSettings) -> Array:
    """(3, 256) float32: pixel value -> normalised value, bit-identical to RapidOCR's maths."""
    scaled = (np.arange(256, dtype=np.float32) * np.float32(1 / 255.0)).astype(np.float64)
    mean, std = np.array(s.mean)[:, None], np.array(s.std)[:, None]
    lut: Array = ((scaled[None, :] - mean) / std).astype(np.float32)
    return lut


def mini_box(points: Array) -> tuple[Array, float]:
    """The minimum-area rectangle of `points`, corners ordered tl, tr, br, bl; its short side."""
    rect = cv2.minAreaRect(points)
    corners = cv2.boxPoints(rect)
    corners = corners[np.argsort(corners[:, 0], kind="stable")]
    left = (0, 1) if corners[1, 1] > corners[0, 1] else (1, 0)
    right = (2, 3) if corners[3, 1] > corners[2, 1] else (3, 2)
    box = corners[[left[0], right[0], right[1], left[1]]]
    return box, min(rect[1])


def box_score_fast(pred: Array, box: Array) -> float:
    """Mean probability inside the box's polygon."""
    h, w = pred.shape
    xmin, xmax = np.clip([math.floor(box[:, 0].min()), math.ceil(box[:, 0].max())], 0, w - 1)
    ymin, ymax = np.clip([math.floor(box[:, 1].min()), math.ceil(box[:, 1].max())], 0, h - 1)
    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), dtype=np.uint8)
    shifted = (box - np.array([xmin, ymin], np.float32)).astype(np.int32)
    cv2.fillPoly(mask, [shifted], 1)
    return float(cv2.mean(pred[ymin : ymax + 1, xmin : xmax + 1], mask)[0])


def box_score_slow(pred: Array, contour: Array) -> float:
    """Mean probability inside the contour itself."""
    return box_score_fast(pred, contour.reshape(-1, 2).astype(np.float32))


def unclip(box: Array, ratio: float) -> Array:
    """The box grown by area * ratio / perimeter, as (-1, 1, 2) points."""
    poly = Polygon(box)
    distance = poly.area * ratio / poly.length
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(box, pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    grown: Array = np.array(offset.Execute(distance)).reshape((-1, 1, 2))
    return grown


def db_boxes(pred: Array, dest: tuple[int, int], s: DetSettings) -> Array:
    """DB post-processing: (N, 4, 2) int32 boxes in `dest` (h, w) pixels."""
    binary = (pred > s.thresh).astype(np.uint8)
    if s.use_dilation:
        binary = np.asarray(cv2.dilate(binary, np.ones((2, 2), np.uint8)), np.uint8)
    contours, _ = cv2.findContours(binary, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes = []
    fast = s.score_mode == "fast"
    for contour in contours[: s.max_candidates]:
        points, short = mini_box(contour)
        if short < 3:
            continue
        score = box_score_fast(pred, points) if fast else box_score_slow(pred, contour)
        if score < s.box_thresh:
            continue
        box, short = mini_box(unclip(points, s.unclip_ratio))
        if short >= 5:
            boxes.append(box)
    if not boxes:
        return np.zeros((0, 4, 2), np.int32)
    found = np.stack(boxes)
    (dest_h, dest_w), (h, w) = dest, pred.shape
    found[..., 0] = np.clip(np.round(found[..., 0] / w * dest_w), 0, dest_w)
    found[..., 1] = np.clip(np.round(found[..., 1] / h * dest_h), 0, dest_h)
    return found.astype(np.int32)


def order_clockwise(boxes: Array) -> Array:
    """(N, 4, 2) corners reordered tl, tr, br, bl (by x, then y within each side)."""
    by_x = np.take_along_axis(boxes, np.argsort(boxes[..., 0], axis=1)[..., None], axis=1)
    left, right = by_x[:, :2], by_x[:, 2:]
    left = np.take_along_axis(left, np.argsort(left[..., 1], axis=1)[..., None], axis=1)
    right = np.take_along_axis(right, np.argsort(right[..., 1], axis=1)[..., None], axis=1)
    return np.stack([left[:, 0], right[:, 0], right[:, 1], left[:, 1]], axis=1)


def keep_boxes(boxes: Array, size: tuple[int, int]) -> Array:
    """Ordered, clipped float32 boxes, without those 3 px or less wide or high."""
    h, w = size
    boxes = order_clockwise(boxes.astype(np.float32))
    boxes[..., 0] = np.trunc(np.clip(boxes[..., 0], 0, w - 1))
    boxes[..., 1] = np.trunc(np.clip(boxes[..., 1], 0, h - 1))
    widths = np.linalg.norm(boxes[:, 0] - boxes[:, 1], axis=-1).astype(np.int64)
    heights = np.linalg.norm(boxes[:, 0] - boxes[:, 3], axis=-1).astype(np.int64)
    kept: Array = boxes[(widths > 3) & (heights > 3)]
    return kept


def reading_order(boxes: Array) -> Array:
    """Top to bottom, then left to right for boxes whose tops are within 10 px."""
    order = list(np.lexsort((boxes[:, 0, 0], boxes[:, 0, 1])))
    for i in range(len(order) - 1):
        for j in range(i, -1, -1):
            a, b = boxes[order[j]][0], boxes[order[j + 1]][0]
            if abs(b[1] - a[1]) < 10 and b[0] < a[0]:
                order[j], order[j + 1] = order[j + 1], order[j]
            else:
                break
    return boxes[order]


def crop_line(image: Array, box: Array) -> Array:
    """The box's quadrilateral warped to an upright rectangle (tall ones turned 90 degrees)."""
    width = int(max(np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[2] - box[3])))
    height = int(max(np.linalg.norm(box[0] - box[3]), np.linalg.norm(box[1] - box[2])))
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], np.float32)
    matrix = cv2.getPerspectiveTransform(box, target)
    crop = cv2.warpPerspective(
        image, matrix, (width, height), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC
    )
    if crop.shape[0] / crop.shape[1] >= 1.5:
        crop = np.ascontiguousarray(np.rot90(crop))
    return crop


def to_input_frame(boxes: Array, page: Page) -> Array:
    """Boxes from page pixels back to the input image's pixels, clipped to it."""
    out = boxes.astype(np.float32)
    out[..., 1] -= page.top
    out[..., 0] *= page.scale[1]
    out[..., 1] *= page.scale[0]
    np.maximum(out, 0, out=out)
    np.minimum(out[..., 0], page.raw_size[1], out=out[..., 0])
    np.minimum(out[..., 1], page.raw_size[0], out=out[..., 1])
    return out


# -- line crops: classification and recognition --------------------------------------------

# pixel value -> (v / 255 - 0.5) / 0.5 in float32, as RapidOCR computes it for cls and rec
LINE_LUT = (np.arange(256, dtype=np.float32) / np.float32(255) - np.float32(0.5)) / np.float32(0.5)


def line_input(crop: Array, height: int, width: int, max_width: int) -> Array:
    """(3, height, max_width): the crop resized to `height` (at most `width` wide), zero-padded."""
    h, w = crop.shape[:2]
    resized_w = min(math.ceil(height * (w / float(h))), width)
    resized = cv2.resize(crop, (resized_w, height))
    out = np.zeros((3, height, max_width), np.float32)
    for c in range(3):
        out[c, :, :resized_w] = LINE_LUT[resized[:, :, c]]
    return out


def rec_widths(crops: Sequence[Array], s: RecSettings) -> list[int]:
    """Each crop's padded width in RapidOCR's rec batches.

    RapidOCR sorts a page's crops by aspect ratio, takes them `batch_num` at a time and pads
    each group to its widest member (at least the nominal width). The rec model's outputs
    depend on that padding, so these widths are kept, not rounded to a coarser bucket.
    """
    _, height, base_width = s.image_shape
    ratios = np.array([c.shape[1] / float(c.shape[0]) for c in crops])
    order = np.argsort(ratios)
    widths = [0] * len(crops)
    for start in range(0, len(order), s.batch_num):
        group = order[start : start + s.batch_num]
        widest = max(base_width / height, *(float(ratios[i]) for i in group))
        for i in group:
            widths[i] = int(height * widest)
    return widths


def ctc_decode(probs: Array, charset: Sequence[str]) -> tuple[str, float]:
    """Greedy CTC over (T, C) probabilities: repeats merged, blanks (0) dropped; mean score."""
    index = probs.argmax(axis=1)
    keep = index != 0
    keep[1:] &= index[1:] != index[:-1]
    chosen = index[keep]
    if not chosen.size:
        return "", 0.0
    score = float(probs.max(axis=1)[keep].astype(np.float64).mean())
    return "".join([charset[i] for i in chosen]), score


def read_charset(path: str | None, metadata: Mapping[str, str], model_path: str) -> list[str]:
    """The rec dictionary with CTC's blank first and a space last.

    From `keys_path` (one character per line) if given, else the model's "character" metadata,
    which the backend reports or, failing that, the ONNX file holds.
    """
    if path is not None:
        chars = Path(path).read_text(encoding="utf-8").splitlines()
    elif "character" in metadata:
        chars = metadata["character"].splitlines()
    elif model_path.endswith(".onnx"):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
        chars = session.get_modelmeta().custom_metadata_map["character"].splitlines()
    else:
        raise ConfigError(f"{model_path}: no 'character' metadata; set params.rec.keys_path")
    return ["blank", *chars, " "]


# -- the pipeline ---------------------------------------------------------------------------


class StageClock:
    """Seconds spent in each named pre/post-processing stage, summed over pages."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            with self._lock:
                self.seconds[stage] = self.seconds.get(stage, 0.0) + spent

    def reset(self) -> None:
        with self._lock:
            self.seconds.clear()


class OcrPipeline(ImagePipeline):
    """A page (a path, bytes, an array or a PIL image) -> its lines `{"box", "text",
    "score"}` in RapidOCR's order. Pages are read as RapidOCR reads them where the recipe
    says `params.image.alpha: rapidocr` (as `recipe.yaml` does), in BGR."""

    channels = "bgr"  # RapidOCR's pre-processing and models take OpenCV's channel order

    def __init__(self, oi: OfflineInference) -> None:
        super().__init__(oi)
        p, source = self.params, self.recipe.source
        self.page_settings: PageSettings = _section(PageSettings, p, "page", source)
        self.det_settings: DetSettings = _section(DetSettings, p, "det", source)
        self.cls_settings: ClsSettings = _section(ClsSettings, p, "cls", source)
        self.rec_settings: RecSettings = _section(RecSettings, p, "rec", source)
        self.det_lut = det_lut(self.det_settings)
        metadata = oi.model_info("rec").metadata
        rec_path = self.recipe.model("rec").path
        self.charset = read_charset(self.rec_settings.keys_path, metadata, rec_path)
        self.clock = StageClock()

    def process(self, item: Any) -> Process:
        """One page (whatever `self.reader` reads): a det request, a cls request per line,
        then a rec request per line."""
        clock = self.clock
        with clock("det_pre"):
            page = prepare_page(self.reader.read(item), self.page_settings, self.reader)
            tensor = det_input(page.image, self.det_settings, self.det_lut, self.reader)
        if tensor is None:
            return []
        det_out = yield self.submit("det", tensor)
        with clock("det_post"):
            boxes = self.find_boxes(det_out, page)
        if not len(boxes):
            return []
        with clock("cls_pre"):
            crops = [crop_line(page.image, box) for box in boxes]
            _, cls_h, cls_w = self.cls_settings.image_shape
            cls_in = [line_input(c, cls_h, cls_w, cls_w) for c in crops]
        cls_out = yield self.oi.submit_many("cls", cls_in)
        with clock("cls_post"):
            crops = self.turn_upright(crops, cls_out)
        with clock("rec_pre"):
            rec_in = self.rec_inputs(crops)
        rec_out = yield self.oi.submit_many("rec", rec_in)
        with clock("rec_post"):
            return self.lines(boxes, page, rec_out)

    def find_boxes(self, det_out: Mapping[str, Array], page: Page) -> Array:
        """Text boxes in page pixels (float32 (N, 4, 2)), in reading order."""
        (pred,) = det_out.values()
        size = page.image.shape[:2]
        boxes = keep_boxes(db_boxes(pred[0], size, self.det_settings), size)
        return reading_order(boxes) if len(boxes) else boxes

    def turn_upright(self, crops: list[Array], cls_out: list[Mapping[str, Array]]) -> list[Array]:
        """Crops the classifier calls upside down (above its threshold), turned 180 degrees."""
        s = self.cls_settings
        turned = []
        for crop, out in zip(crops, cls_out, strict=True):
            (probs,) = out.values()
            label = int(probs.argmax())
            if "180" in s.labels[label] and probs[label] > s.thresh:
                crop = cv2.rotate(crop, cv2.ROTATE_180)
            turned.append(crop)
        return turned

    def rec_inputs(self, crops: list[Array]) -> list[Array]:
        """Rec tensors padded to RapidOCR's batch widths (rounded up to `pad_multiple`)."""
        s = self.rec_settings
        height, step = s.image_shape[1], s.pad_multiple
        inputs = []
        for crop, width in zip(crops, rec_widths(crops, s), strict=True):
            inputs.append(line_input(crop, height, width, -(-width // step) * step))
        return inputs

    def lines(self, boxes: Array, page: Page, rec_out: list[Mapping[str, Array]]) -> list[Line]:
        """Decoded lines scoring at least `text_score`, boxes in input pixels."""
        frame = to_input_frame(boxes, page)
        lines = []
        for box, out in zip(frame, rec_out, strict=True):
            (probs,) = out.values()
            text, score = ctc_decode(probs, self.charset)
            if score >= self.page_settings.text_score:
                lines.append({"box": box.tolist(), "text": text, "score": score})
        return lines

    def to_record(self, result: list[Line]) -> dict[str, Any]:
        return {"lines": result}

    def summary(self, result: list[Line]) -> str:
        head = " | ".join(line["text"] for line in result[:3])
        return f"{len(result)} lines: {head}"[:200]

    def save(self, source: Path, item: Any, result: list[Line], out_dir: Path) -> None:
        """`<stem>_ocr.png`: the page with each line's box drawn."""
        image = self.reader.read(item).copy()
        for line in result:
            points = np.array(line["box"], np.int32).reshape(-1, 1, 2)
            cv2.polylines(image, [points], True, (0, 0, 255), 2)
        cv2.imwrite(str(out_dir / f"{source.stem}_ocr.png"), image)
