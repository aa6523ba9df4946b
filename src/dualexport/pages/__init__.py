"""HTML pages from Jinja2 templates shipped in the package (``templates/``): one base template (the
page frame and its stylesheet) that the export page, the parity page and the batch page extend,
and the macros they share.

Why a package of its own, low in the layers: the parity page (``dualexport.parity``) and the pages of
``dualexport.reporting`` sit at different heights and must look alike. Why templates: a new page or
section is HTML a reader already knows, filled from small frozen records built by each page's
module; every value is escaped by Jinja2 (autoescape), charts arrive as SVG already escaped by the
chart module. Jinja2 is imported when a page is rendered, not with ``dualexport``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..charts import format_number

if TYPE_CHECKING:
    import jinja2

__all__ = ["Badge", "STATUS_CLASS", "render", "human_bytes"]

#: status words (entry statuses, target verdicts, weight statuses) and the class that colours them
STATUS_CLASS: Mapping[str, str] = MappingProxyType(
    {
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
)


@dataclass(frozen=True)
class Badge:
    """A status word in colour (a "pill"); the word stays as text, so colour is never the only
    cue. ``text``: what to show instead of the word; ``title``: the tooltip."""

    word: str
    text: str = ""
    title: str = ""

    @property
    def css(self) -> str:
        return STATUS_CLASS.get(self.word.lower(), "muted")

    @property
    def label(self) -> str:
        return self.text or self.word


def human_bytes(n: int | None) -> str:
    """``1.2 MB`` style (powers of 1000); ``n/a`` for a file that is not there."""
    if n is None:
        return "n/a"
    size = float(n)
    for unit in ("B", "KB", "MB"):
        if size < 1000:
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


@functools.cache
def _environment() -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dualexport.pages", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html",), disabled_extensions=("css", "js")),
        undefined=jinja2.StrictUndefined,  # a misspelt field is an error, not an empty cell
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["num"] = format_number
    env.filters["bytes"] = human_bytes
    return env


def render(template: str, **context: Any) -> str:
    """The page (or fragment) ``template`` filled with ``context``."""
    return _environment().get_template(template).render(**context)
