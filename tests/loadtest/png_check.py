"""What a sweep's picture must be: a whole, decodable PNG of the size loadtest/plot.py draws."""

from __future__ import annotations

from pathlib import Path


def check_png(path: Path) -> None:
    from PIL import Image

    from loadtest.plot import DPI, FIGSIZE_INCHES

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size == (round(FIGSIZE_INCHES[0] * DPI), round(FIGSIZE_INCHES[1] * DPI))
        image.load()  # decodes every row: a truncated file fails here
