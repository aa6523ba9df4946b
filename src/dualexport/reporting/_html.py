"""What the export page and the batch page share: the stylesheet, the page frame and small cell
formatters.

Why here and not in ``charts``: these are page decisions (status colours, table look), while the
charts stay page-agnostic; both pages must look alike so a reader moves between them freely.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping
from typing import Any

from ..charts import format_number
from ..parity.html import PARITY_CSS

__all__ = [
    "esc",
    "page",
    "pill",
    "human_bytes",
    "fmt_value",
    "sort_key_number",
    "versions_table",
    "STATUS_CLASS",
]

#: status words (entry statuses, target verdicts, weight statuses) and their pill class
STATUS_CLASS = {
    "passed": "ok",
    "pass": "ok",
    "exact": "ok",
    "transformed": "info",
    "not_stored": "muted",
    "check_failed": "warn",
    "failed": "bad",
    "fail": "bad",
    "error": "bad",
    "missing": "bad",
    "mismatch": "bad",
    "timeout": "violet",
    "killed": "violet",
    "invalid": "muted",
    "not checked": "muted",
    "regression": "bad",
    "improvement": "ok",
    "new": "info",
    "removed": "muted",
    "changed": "warn",
}

_CSS = (
    "body{font-family:sans-serif;margin:24px;color:#222;max-width:1500px}"
    "h1{margin-bottom:4px}h2{margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:3px}"
    "code,.mono{font-family:monospace;font-size:12px}"
    "table.kv td:first-child{color:#555}"
    ".pill{display:inline-block;padding:1px 7px;border-radius:9px;font-size:12px;font-weight:bold;"
    "border:1px solid transparent}"
    ".pill.ok{background:#e3f2e1;color:#1b5e20;border-color:#a5d6a7}"
    ".pill.bad{background:#fde7e7;color:#a00000;border-color:#ef9a9a}"
    ".pill.warn{background:#fff3e0;color:#8a4b00;border-color:#ffcc80}"
    ".pill.violet{background:#f1e6fa;color:#5b2a86;border-color:#ce93d8}"
    ".pill.info{background:#e6f0fa;color:#0d3c6e;border-color:#90caf9}"
    ".pill.muted{background:#f0f0f0;color:#555;border-color:#ccc}"
    "h1 .pill{font-size:20px;padding:2px 12px;vertical-align:middle}"
    ".err{border-left:4px solid #b00;background:#fff6f6;padding:6px 10px;margin:8px 0;font-size:13px}"
    ".err pre{white-space:pre-wrap;margin:4px 0}"
    "small,.small{font-size:11px;color:#555}"
    "details>summary{cursor:pointer;margin:6px 0}"
)


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def page(title: str, body: str, *, css: str = "", script: str = "") -> str:
    """A whole, self-contained page: inline style, no external resource of any kind."""
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{esc(title)}</title><style>{_CSS}{PARITY_CSS}{css}</style></head><body>\n"
        f"{body}\n{script}</body></html>\n"
    )


def pill(word: str, text: str | None = None, *, title: str | None = None) -> str:
    """A status word in colour; the word itself stays as text, so colour is never the only cue."""
    cls = STATUS_CLASS.get(word.lower(), "muted")
    tip = f" title='{esc(title)}'" if title else ""
    return f"<span class='pill {cls}'{tip}>{esc(text if text is not None else word)}</span>"


def human_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"  # pragma: no cover


def fmt_value(v: Any, limit: int = 80) -> str:
    """A diff's before/after value as short text (numbers short, containers as JSON)."""
    if v is None:
        return "\u2014"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int | float):
        return format_number(float(v)) if not isinstance(v, int) else str(v)
    text = v if isinstance(v, str) else json.dumps(v, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def sort_key_number(v: float | None) -> str:
    """A ``data-sort`` value JavaScript's parseFloat reads (inf included); '' for no value."""
    if v is None or math.isnan(v):
        return ""
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return repr(float(v))


def versions_table(versions: Mapping[str, str]) -> str:
    if not versions:
        return "<p class='small'>not recorded</p>"
    rows = "".join(f"<tr><td>{esc(k)}</td><td class='mono'>{esc(v)}</td></tr>" for k, v in versions.items())
    return f"<table class='kv'>{rows}</table>"
