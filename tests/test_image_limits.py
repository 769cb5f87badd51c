"""A tiny file must not exhaust memory: image sizes are checked before anything is allocated.

A PNG or JPEG of a few hundred bytes may declare a 100000 x 100000 image, and a 12000 x 1
page resized to a short side of 256 makes 2.3 GB. Each case runs in a subprocess that
measures its own peak RSS around the refused item (and caps its address space, so that a
regression fails here instead of taking the machine's memory).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import inferchain as ic
from inferchain.images import PLAIN, RAPIDOCR, ImageReader

ORIENTATION = Path(__file__).resolve().parent.parent / "recipes" / "orientation"
OCR = ORIENTATION.parent / "ocr"
GROWTH_MB = 64  # what a refused item may add to the peak RSS (its file, the decoder's state)


def chunk(kind: bytes, data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")


def png_declaring(width: int, height: int, colour_type: int = 2) -> bytes:
    """A PNG whose header declares `width` x `height` 8-bit pixels (2: RGB, 0: gray) and
    whose data is a few zero bytes: far smaller than what it declares."""
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, colour_type, 0, 0, 0])
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def jpeg_declaring(width: int, height: int) -> bytes:
    """A small JPEG whose frame header (SOF0) is patched to declare `width` x `height`."""
    out = io.BytesIO()
    Image.new("RGB", (16, 16), (90, 120, 150)).save(out, format="JPEG")
    data = bytearray(out.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)


PROBE = """
import json, resource, sys
from pathlib import Path

def vm_kb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1])

def peak_kb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

{setup}
limit = (vm_kb() + 1024 * 1024) * 1024  # 1 GiB of address space more, no more
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
before = peak_kb()
try:
    {call}
    outcome = {{"error": None}}
except BaseException as e:
    outcome = {{"error": f"{{type(e).__name__}}: {{e}}"}}
outcome["grew_mb"] = (peak_kb() - before) / 1024
print(json.dumps(outcome))
"""


def probe(setup: str, call: str) -> dict[str, Any]:
    """Run `setup`, then `call` under an address-space cap; its error and peak RSS growth."""
    script = PROBE.format(setup=textwrap.dedent(setup), call=call)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


READER = """
import cv2, PIL.Image, simplejpeg
from inferchain.images import ImageReader
reader = ImageReader(channels={channels!r}, alpha={alpha!r})
"""


@pytest.mark.parametrize(
    ("name", "data", "declared"),
    [
        ("wide.png", png_declaring(100_000, 100_000), "100000x100000x3"),
        ("gray.png", png_declaring(20_000, 20_000, colour_type=0), "20000x20000x3"),
        ("rgb.png", png_declaring(20_000, 20_000), "20000x20000x3"),
        ("wide.jpg", jpeg_declaring(60_000, 60_000), "60000x60000x3"),
    ],
)
@pytest.mark.parametrize("reader", [PLAIN, RAPIDOCR], ids=["plain", "rapidocr"])
def test_a_tiny_file_declaring_a_huge_image_fails_fast_naming_it_and_the_sizes(
    name: str, data: bytes, declared: str, reader: ImageReader, tmp_path: Path
) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    assert len(data) < 1000
    setup = READER.format(channels=reader.channels, alpha=reader.alpha)
    outcome = probe(setup, f"reader.read(Path({str(path)!r}))")
    assert outcome["error"] is not None
    assert outcome["error"].startswith(f"InvalidInput: {path}: decodes to {declared} uint8 (")
    assert "over the image limit of 256 MB" in outcome["error"]
    assert outcome["grew_mb"] < GROWTH_MB, outcome
    with pytest.raises(ic.InvalidInput, match=f"an image of {len(data)} bytes: decodes to"):
        reader.read(data)  # bytes: the same check


def test_the_limit_is_a_recipe_key_and_an_image_under_it_reads(tmp_path: Path) -> None:
    page = sorted((ORIENTATION / "samples").iterdir())[0]
    small = ic.load_recipe(ORIENTATION, models={"orientation": {"warmup": False}})
    with ic.OfflineInference(small) as oi:
        assert oi.pipeline.reader.max_mb == 256  # type: ignore[attr-defined]
        (fine,) = oi.run([page])
        assert fine["angle"] in (0, 90, 180, 270)
    tight = ic.load_recipe(
        ORIENTATION,
        models={"orientation": {"warmup": False}},
        params={"image": {"alpha": "rapidocr", "max_mb": 0.1}},
    )
    with ic.OfflineInference(tight) as oi:
        (error,) = oi.run([page], on_error="return")
    assert isinstance(error, ic.InvalidInput)
    assert f"{page}: decodes to" in str(error) and "image limit of 0.1 MB" in str(error)


def orientation_setup(page: Path) -> str:
    """The orientation recipe started (no warm-up), `page` the path to run."""
    return (
        "import inferchain as ic\n"
        "from pathlib import Path\n"
        f"recipe = ic.load_recipe({str(ORIENTATION)!r}, "
        "models={'orientation': {'warmup': False}})\n"
        "oi = ic.OfflineInference(recipe).init()\n"
        f"page = Path({str(page)!r})\n"
    )


def test_a_tiny_png_whose_resize_would_make_gigabytes_is_refused_before_the_resize(
    tmp_path: Path,
) -> None:
    """A 12000 x 1 page: the orientation recipe's resize to a short side of 256 would make
    3072000 x 256 x 3 bytes (2.3 GB); the recipe refuses it, naming the file and the sizes,
    and nothing else of the run is lost."""
    page = tmp_path / "line.png"
    Image.new("RGB", (12000, 1), (255, 255, 255)).save(page)
    assert page.stat().st_size < 300
    call = "(result,) = oi.run([page], on_error='return'); raise result"
    outcome = probe(orientation_setup(page), call)
    assert outcome["error"] == (
        f"InvalidInput: {page}: a page of 12000x1 pixels: resizing it makes 3072000x256x3 uint8 "
        "(2250.0 MB), over the image limit of 256 MB (max_mb: a recipe's params.image.max_mb)"
    )
    assert outcome["grew_mb"] < GROWTH_MB, outcome


def test_the_ocr_recipe_refuses_a_page_whose_resizes_would_make_gigabytes(tmp_path: Path) -> None:
    """A 1999 x 1 page is scaled up to a short side of 30 and letterboxed (RapidOCR's steps):
    59968 x 14992 pixels; refused before the letterbox is made."""
    pytest.importorskip("rapidocr_onnxruntime")
    page = tmp_path / "line.png"
    Image.new("L", (1999, 1), 0).save(page)
    with ic.OfflineInference(OCR) as oi:
        first, line, last = oi.run(
            [sorted((OCR / "samples").iterdir())[0], page, np.full((40, 200, 3), 255, np.uint8)],
            on_error="return",
        )
    assert isinstance(line, ic.InvalidInput), line
    assert str(line).startswith(
        f"{page}: a page of 59968x32 pixels: letterboxing it makes 59968x14992x3 uint8 "
    )
    assert isinstance(first, list) and first and last == []
