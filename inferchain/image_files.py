"""Decoding image files and bytes, each checked against a size limit before it is decoded.

- An 8-bit RGB PNG (no palette, no alpha) is decoded by OpenCV where BGR is wanted: its
  pixels as BGR at once, in about two thirds of Pillow's time (a PNG is lossless: the same
  pixels either way; EXIF orientation is ignored there as Pillow ignores it).
- A JPEG of gray or colour pixels is decoded by libjpeg-turbo through `simplejpeg` in strict
  mode: Pillow's pixels (the same library and settings), but a truncated or corrupt file is an
  error, where Pillow fills what is missing with grey and says nothing. CMYK and YCCK JPEGs
  are left to Pillow.
- Anything else is opened by Pillow, which reads the header first.

Each path reads the width, height and channels from the header and refuses an image whose
decoded size is over the limit before any pixel is decoded: a file of a few hundred bytes
may declare a 100000 x 100000 image. Every failure is an `InvalidInput` naming the image.
"""

from __future__ import annotations

from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np

from inferchain.errors import InvalidInput

Array = np.ndarray
Source = Path | bytes  # an image file, or its encoded bytes

_PNG = b"\x89PNG\r\n\x1a\n"
_JPEG = b"\xff\xd8\xff"
_HEAD = 26  # bytes that say what a file is: the PNG signature and IHDR, or the JPEG SOI
MIB = 1 << 20
ORIENTATION = 0x0112  # the EXIF orientation tag


def check_size(
    name: str, width: int, height: int, channels: int, limit: int, what: str, dtype: str = "uint8"
) -> None:
    """`InvalidInput` when `width x height x channels` samples of `dtype` exceed `limit`
    bytes (`what` says what would make them: "decodes to", "resizing it makes")."""
    size = width * height * channels * np.dtype(dtype).itemsize
    if size > limit:
        mb = round(limit / MIB, 3)
        raise InvalidInput(
            f"{name}: {what} {width}x{height}x{channels} {dtype} ({size / MIB:.1f} MB), over "
            f"the image limit of {mb:g} MB (max_mb: a recipe's params.image.max_mb)"
        )


def head_of(source: Source) -> bytes:
    """The first bytes of a file (or of encoded bytes), which say what it is."""
    if isinstance(source, bytes):
        return source[:_HEAD]
    with open(source, "rb") as f:
        return f.read(_HEAD)


_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # IHDR colour type -> samples per pixel


def png_header(head: bytes) -> tuple[int, int, int, int] | None:
    """(width, height, bit depth, colour type) of a PNG's first bytes; None for no PNG."""
    # the signature, then IHDR: length, type, width, height, bit depth (24), colour type (25)
    if len(head) < _HEAD or not head.startswith(_PNG) or head[12:16] != b"IHDR":
        return None
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    return width, height, head[24], head[25]


def check_png(head: bytes, name: str, limit: int) -> tuple[int, int, int, int] | None:
    """A PNG's header, its decoded size checked (before Pillow's own check, which names no
    sizes); None for no PNG."""
    header = png_header(head)
    if header is not None:
        width, height, depth, colour = header
        channels = max(3, _PNG_CHANNELS.get(colour, 4) * (2 if depth == 16 else 1))
        check_size(name, width, height, channels, limit, "decodes to")
    return header


def rgb_png(path: Path, name: str, limit: int) -> Array | None:
    """An 8-bit RGB PNG decoded by OpenCV, as BGR; None for any other file, or one OpenCV
    cannot decode (Pillow then reads it and names what is wrong)."""
    import cv2

    header = check_png(head_of(path), name, limit)
    if header is None or header[2:] != (8, 2):
        return None
    image = cv2.imread(str(path), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    return None if image is None else np.asarray(image)


def jpeg(source: Source, name: str, limit: int, exif: bool) -> Array | None:
    """A gray (H, W) or RGB (H, W, 3) JPEG decoded strictly, turned as its EXIF orientation
    says with `exif`; None for a file that is no JPEG, or a CMYK or YCCK one."""
    import simplejpeg

    if not head_of(source).startswith(_JPEG):
        return None
    data = source if isinstance(source, bytes) else source.read_bytes()
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as e:
        raise InvalidInput(f"{name}: not a readable image ({e})") from None
    if colorspace not in ("Gray", "YCbCr", "RGB"):
        return None
    gray = colorspace == "Gray"
    check_size(name, width, height, 3, limit, "decodes to")
    try:
        pixels = simplejpeg.decode_jpeg(data, colorspace="GRAY" if gray else "RGB", strict=True)
    except ValueError as e:  # libjpeg's warnings too: a truncated or corrupt file
        raise InvalidInput(f"{name}: not a readable image ({e})") from None
    pixels = pixels[..., 0] if gray else pixels
    return orient(pixels, exif_orientation(data)) if exif else pixels


def exif_orientation(data: bytes) -> int:
    """The EXIF orientation tag of an image's bytes (1, upright, when it has none)."""
    from PIL import Image

    try:
        with Image.open(BytesIO(data)) as image:
            return int(image.getexif().get(ORIENTATION, 1))
    except (OSError, ValueError, SyntaxError):
        return 1


def orient(pixels: Array, orientation: int) -> Array:
    """`pixels` turned as EXIF `orientation` (1-8) says, as Pillow's `exif_transpose` turns
    an image."""
    from PIL import Image

    method = {
        2: Image.Transpose.FLIP_LEFT_RIGHT,
        3: Image.Transpose.ROTATE_180,
        4: Image.Transpose.FLIP_TOP_BOTTOM,
        5: Image.Transpose.TRANSPOSE,
        6: Image.Transpose.ROTATE_270,
        7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_90,
    }.get(orientation)
    if method is None:
        return pixels
    return np.asarray(Image.fromarray(pixels).transpose(method))


def pillow(source: Source, name: str, limit: int, exif: bool) -> Any:
    """The image opened and decoded by Pillow (a `PIL.Image.Image`), its size checked from
    its header first; turned as its EXIF orientation says with `exif`."""
    from PIL import Image, ImageOps

    check_png(head_of(source), name, limit)
    try:
        image = Image.open(BytesIO(source) if isinstance(source, bytes) else source)
    except Image.DecompressionBombError as e:  # Pillow's own limit, under ours or not
        raise InvalidInput(f"{name}: refused by Pillow before decoding ({e})") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise InvalidInput(f"{name}: not a readable image ({e})") from None
    try:
        width, height = image.size
        check_size(name, width, height, decoded_channels(image), limit, "decodes to")
        image.load()
        if not exif:
            return image
        turned = ImageOps.exif_transpose(image)
        if turned is not image:
            image.close()
        return turned
    except (OSError, ValueError, SyntaxError) as e:  # Pillow's errors for bad or truncated files
        image.close()
        raise InvalidInput(f"{name}: not a readable image ({e})") from None
    except BaseException:
        image.close()
        raise


def decoded_channels(image: Any) -> int:
    """Bytes per pixel of the largest array an opened PIL image makes here once decoded: its
    bands times bytes per sample, and at least the three of the output."""
    mode = image.mode
    sample = 2 if mode.startswith("I;16") else 4 if mode in ("I", "F") else 1
    return max(3, len(image.getbands()) * sample)
