"""Headless Chromium for the HTML tests: a screenshot of a page, and how many pixels of a colour
it shows. Why pixels: an SVG that is in the file but does not render (a bad attribute, a chart
off the page) would pass any test of the text."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import numpy as np

__all__ = ["CHROMIUM", "screenshot", "count_color", "hex_rgb"]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def screenshot(
    html: pathlib.Path, png: pathlib.Path, profile: pathlib.Path, *, size: tuple[int, int] = (1280, 1400)
) -> None:
    """Render ``html`` at ``size`` (the screenshot is the window: pass a tall one for a long page)."""
    assert CHROMIUM is not None
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
            f"--screenshot={png}",
            html.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def count_color(png: pathlib.Path, rgb: tuple[int, int, int]) -> int:
    """Pixels within a small distance of ``rgb`` (anti-aliased edges do not count)."""
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    return int((np.abs(img - np.array(rgb)).sum(axis=-1) < 30).sum())


def hex_rgb(color: str) -> tuple[int, int, int]:
    c = color.lstrip("#")
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)
