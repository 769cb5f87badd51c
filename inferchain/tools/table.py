"""Plain-text tables for the command line's reports (bench, info, doctor), so they line up."""

from __future__ import annotations

from collections.abc import Sequence


def render(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> str:
    """Columns padded to their widest cell; text left-aligned, numbers right-aligned.

    Floats are shown with 2 decimals; None as "-".
    """
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    numeric = [
        bool(rows) and all(isinstance(r[i], int | float) or r[i] is None for r in rows)
        for i in range(len(headers))
    ]

    def line(texts: Sequence[str]) -> str:
        parts = [
            t.rjust(w) if num else t.ljust(w)
            for t, w, num in zip(texts, widths, numeric, strict=True)
        ]
        return (indent + "  ".join(parts)).rstrip()

    return "\n".join([line(headers), *(line(row) for row in cells)])


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def megabytes(n: int | None) -> float | None:
    """Bytes as MiB (None stays None), for the tables."""
    return None if n is None else n / 2**20
