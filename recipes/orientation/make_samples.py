"""Render the orientation recipe's sample pages: text documents at 0, 90, 180 and 270 degrees.

Run from the repository root: `python recipes/orientation/make_samples.py`. Deterministic;
the PNGs are committed. An image named `*_rot90.png` is the upright page turned 90 degrees
clockwise, which is what the model's label "90" means.
"""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

OUT = Path(__file__).parent / "samples"
WORDS = [
    "inference",
    "batch",
    "scheduler",
    "engine",
    "worker",
    "model",
    "request",
    "buffer",
    "stream",
    "device",
    "memory",
    "queue",
    "priority",
    "latency",
    "throughput",
    "recipe",
    "pipeline",
    "layer",
    "context",
    "tensor",
    "shape",
    "result",
    "invoice",
    "total",
    "amount",
    "date",
    "customer",
    "order",
    "number",
    "quantity",
    "price",
    "account",
    "report",
]
FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf")
FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")


def font(name: str, size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    path = FONT_DIR / name
    if path.exists():
        return ImageFont.truetype(str(path), size)
    return ImageFont.load_default(size=size)


def page(seed: int, size: tuple[int, int] = (480, 640)) -> Image.Image:
    rng = random.Random(seed)
    img = Image.new("L", size, 255)
    draw = ImageDraw.Draw(img)
    face = font(FONTS[seed % len(FONTS)], 18 + 3 * (seed % 3))
    y = 40
    draw.text((40, y), f"Document {seed + 1}: quarterly report", fill=0, font=face)
    y += 60
    while y < size[1] - 60:
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 7))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(10, 99999)))
        draw.text((40, y), " ".join(words), fill=0, font=face)
        y += 30 + 3 * (seed % 3)
    return img


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for seed in range(3):
        upright = page(seed)
        for angle in (0, 90, 180, 270):
            turned = upright.rotate(-angle, expand=True)  # PIL turns counter-clockwise
            turned.save(OUT / f"page{seed + 1}_rot{angle}.png", optimize=True)


if __name__ == "__main__":
    main()
