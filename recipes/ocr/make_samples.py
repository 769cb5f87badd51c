"""Render the OCR recipe's sample pages (committed in `samples/`), deterministically.

Six small document pages in English and digits: different font sizes and line lengths, a
letter, an invoice, a receipt, a slide with tilted and upside-down lines, a form with a
vertical margin note, and a table of figures. Fonts are the DejaVu family when installed
under /usr/share/fonts, else PIL's built-in scalable font. Run it to regenerate::

    .venv/bin/python recipes/ocr/make_samples.py
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
SAMPLES = Path(__file__).resolve().parent / "samples"
INK = (20, 20, 20)
PAPER = (255, 255, 255)

Font = ImageFont.FreeTypeFont | ImageFont.ImageFont


def font(style: str, size: int) -> Font:
    """A DejaVu font by style ("Sans", "Serif-Bold", ...) or PIL's default at that size."""
    path = FONT_DIR / f"DejaVu{style}.ttf"
    if path.is_file():
        return ImageFont.truetype(str(path), size)
    return ImageFont.load_default(size=size)


def new_page(width: int, height: int) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    page = Image.new("RGB", (width, height), PAPER)
    return page, ImageDraw.Draw(page)


def write_lines(
    draw: ImageDraw.ImageDraw, x: int, y: int, lines: list[str], face: Font, gap: int
) -> int:
    """Draw lines top-down from (x, y); returns the y below the last line."""
    for line in lines:
        draw.text((x, y), line, font=face, fill=INK)
        y += gap
    return y


def paste_rotated(
    page: Image.Image, xy: tuple[int, int], text: str, face: Font, angle: float
) -> None:
    """Draw `text` on its own tile, rotate it by `angle` degrees and paste it at `xy`."""
    _, _, right, bottom = face.getbbox(text)
    tile = Image.new("RGB", (int(right) + 16, int(bottom) + 16), PAPER)
    ImageDraw.Draw(tile).text((8, 8), text, font=face, fill=INK)
    rotated = tile.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=PAPER)
    page.paste(rotated, xy)


def letter() -> Image.Image:
    page, draw = new_page(760, 1000)
    draw.text((60, 50), "Northwind Trading Ltd.", font=font("Serif-Bold", 34), fill=INK)
    body = font("Serif", 19)
    y = write_lines(
        draw,
        60,
        110,
        ["42 Harbour Street, Portsmouth PO1 3AX", "Phone 023 9281 7745"],
        font("Sans", 15),
        24,
    )
    y = write_lines(draw, 60, y + 30, ["Reference: NT-2024-0917", "Date: 17 May 2024"], body, 30)
    paragraphs = [
        "Dear Ms Patel,",
        "",
        "Thank you for your order of 12 March. We are pleased to confirm",
        "that all 240 units were shipped today by road freight and",
        "should arrive within 3 to 5 working days.",
        "",
        "The invoice total of 4,812.50 GBP is due within 30 days.",
        "Please quote the reference above with your payment.",
        "",
        "Kind regards,",
        "",
        "James Whitfield",
        "Head of Sales",
    ]
    write_lines(draw, 60, y + 40, paragraphs, body, 34)
    draw.text((60, 940), "Registered in England No. 08123456", font=font("Sans", 13), fill=INK)
    return page


def invoice() -> Image.Image:
    page, draw = new_page(760, 1000)
    draw.rectangle((0, 0, 760, 90), fill=(32, 64, 128))
    draw.text((40, 24), "INVOICE 2024-0381", font=font("Sans-Bold", 36), fill=PAPER)
    small = font("Sans", 16)
    write_lines(draw, 40, 120, ["Bill to: Patel Engineering", "Unit 7, Riverside Park"], small, 26)
    write_lines(draw, 470, 120, ["Issued: 2024-05-17", "Due: 2024-06-16"], small, 26)
    mono = font("SansMono", 17)
    rows = [
        ("Item", "Qty", "Price", "Amount"),
        ("Steel bracket M8", "120", "3.20", "384.00"),
        ("Hinge assembly", "40", "12.75", "510.00"),
        ("Cable tray 2m", "16", "45.90", "734.40"),
        ("Mounting kit", "64", "8.15", "521.60"),
        ("Delivery", "1", "95.00", "95.00"),
    ]
    y = 230
    for name, qty, price, amount in rows:
        draw.text((40, y), name, font=mono, fill=INK)
        draw.text((360, y), qty, font=mono, fill=INK)
        draw.text((460, y), price, font=mono, fill=INK)
        draw.text((600, y), amount, font=mono, fill=INK)
        y += 44
    draw.line((40, y, 720, y), fill=INK, width=2)
    total = font("Sans-Bold", 24)
    write_lines(draw, 430, y + 20, ["Subtotal 2245.00", "VAT 449.00", "Total 2694.00"], total, 40)
    note = font("Sans", 14)
    write_lines(
        draw,
        40,
        880,
        ["Payment by bank transfer to account 31926819, sort code 60-16-13.", "Thank you."],
        note,
        24,
    )
    return page


def receipt() -> Image.Image:
    page, draw = new_page(420, 900)
    draw.text((110, 30), "CORNER CAFE", font=font("Sans-Bold", 30), fill=INK)
    mono = font("SansMono", 18)
    lines = [
        "Table 12   Guests 3",
        "2024-05-17  13:42",
        "",
        "Flat white      3.40",
        "Cappuccino      3.60",
        "Tea             2.10",
        "Club sandwich   8.95",
        "Soup of day     6.50",
        "Brownie         3.25",
        "",
        "TOTAL          27.80",
        "Card           27.80",
    ]
    write_lines(draw, 50, 100, lines, mono, 36)
    paste_rotated(page, (70, 560), "PAID WITH THANKS", font("Sans-Bold", 28), 8.0)
    write_lines(draw, 60, 760, ["Open daily 7am to 6pm", "www.cornercafe.example"], mono, 34)
    return page


def slide() -> Image.Image:
    page, draw = new_page(1000, 640)
    draw.text((60, 40), "Quarterly Results 2024", font=font("Sans-Bold", 48), fill=INK)
    bullets = [
        "Revenue up 14 percent to 8.3 million",
        "Operating margin 21.5 percent",
        "3 new offices opened in Leeds, Bristol and York",
        "Headcount 412 at the end of June",
    ]
    write_lines(draw, 80, 150, bullets, font("Sans", 26), 52)
    paste_rotated(page, (80, 390), "Draft for board review", font("Serif", 24), -6.0)
    paste_rotated(page, (560, 470), "Confidential 2024", font("Sans", 26), 180.0)
    draw.text((60, 590), "Page 4 of 12", font=font("Sans", 16), fill=INK)
    return page


def form() -> Image.Image:
    page, draw = new_page(760, 1000)
    draw.text((90, 40), "Application Form A7", font=font("Sans-Bold", 30), fill=INK)
    label, value = font("Sans", 15), font("SansMono", 20)
    fields = [
        ("Full name", "Alexander Thompson"),
        ("Date of birth", "1987-11-23"),
        ("Phone", "+44 7700 900123"),
        ("Postcode", "SW1A 1AA"),
        ("Account number", "40518822"),
        ("Amount requested", "15000"),
    ]
    y = 120
    for name, filled in fields:
        draw.text((90, y), name, font=label, fill=INK)
        draw.text((300, y - 2), filled, font=value, fill=INK)
        draw.line((300, y + 26, 700, y + 26), fill=(150, 150, 150), width=1)
        y += 62
    terms = [
        "I confirm that the information given above is correct and complete.",
        "Signed applications are processed within 10 working days.",
    ]
    write_lines(draw, 90, y + 30, terms, font("Serif", 16), 28)
    paste_rotated(page, (14, 300), "Office use only 0042", font("Sans", 18), 90.0)
    return page


def table() -> Image.Image:
    page, draw = new_page(1000, 700)
    draw.text((40, 30), "Monthly Sales by Region", font=font("Serif-Bold", 30), fill=INK)
    header = ["Region", "Jan", "Feb", "Mar", "Apr", "May"]
    data = [
        ["North", "1204", "1187", "1350", "1422", "1518"],
        ["South", "987", "1032", "1105", "998", "1240"],
        ["East", "765", "801", "842", "910", "887"],
        ["West", "1430", "1398", "1512", "1604", "1677"],
        ["Total", "4386", "4418", "4809", "4934", "5322"],
    ]
    cell = font("Sans", 22)
    for r, row in enumerate([header, *data]):
        for c, text in enumerate(row):
            draw.text((40 + c * 150, 110 + r * 70), text, font=cell, fill=INK)
    draw.text((40, 560), "Figures in units sold, 2024.", font=font("Sans", 14), fill=INK)
    return page


PAGES: dict[str, Callable[[], Image.Image]] = {
    "letter": letter,
    "invoice": invoice,
    "receipt": receipt,
    "slide": slide,
    "form": form,
    "table": table,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SAMPLES, help="output folder")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for i, (name, render) in enumerate(PAGES.items(), start=1):
        path = args.out / f"{i:02d}_{name}.png"
        render().save(path, optimize=True)
        print(f"{path} {path.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
