"""HTML pages: one per export (``<name>.report.html``) and one per batch (``batch.html``).

Self-contained (inline style and SVG, nothing loaded from anywhere); the export page has no script,
the batch page only a small optional one to sort its table."""

from __future__ import annotations

from .batch_page import render_batch_page, write_batch_page
from .export_page import render_export_page, write_export_page
from .post_export import Checked, CompareSettings, check_export

__all__ = [
    "render_export_page",
    "write_export_page",
    "render_batch_page",
    "write_batch_page",
    # what runs after an export (CLI and fleet)
    "check_export",
    "Checked",
    "CompareSettings",
]
