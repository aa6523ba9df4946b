"""One chart as inline SVG: a matplotlib ``Figure`` (no pyplot, no display, the Agg canvas for text
metrics) drawn in the project's style, saved by the SVG backend and fitted to sit in an HTML page.

Why matplotlib is imported here, inside the functions: ``import dualexport`` stays light and only a
process that draws a page pays for it. Why the SVG is post-processed: a page holds several charts,
so the XML prolog, the namespaces and the newlines are dropped, the root says what the chart shows
(``role="img"``, ``aria-label``, ``<title>``), and each mark that was given a tooltip gets its
``<title>`` (matplotlib's own recipe: the artist's gid names its ``<g>``). The output is the same
bytes for the same chart: ids are hashed from the fixed ``svg.hashsalt`` and no date is written.
"""

from __future__ import annotations

import hashlib
import html
import io
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .style import CLIP_EDGE, FONT_SIZE, INK, MPL_STYLE, MUTED, SMALL_SIZE, TITLE_SIZE

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["Canvas", "LegendItem", "chart", "empty_chart", "header_px", "mark_style", "text_px"]

#: average sans-serif glyph width per font size: to cut long labels before they are drawn
GLYPH_WIDTH = 0.6
_NO_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
_ROOT = re.compile(r"<svg\b[^>]*>")


@dataclass(frozen=True)
class LegendItem:
    """A legend entry: ``shape`` is ``rect`` (a swatch) or a mark: ``circle``, ``ring`` (not a
    number), ``up`` / ``right`` / ``left`` (clipped to that edge of the axes)."""

    label: str
    color: str
    shape: str = "rect"


def text_px(text: str, size: float = FONT_SIZE) -> float:
    """The width a line of text takes, estimated without a font (to size margins before drawing)."""
    return len(text) * size * GLYPH_WIDTH


def _legend_grid(items: Sequence[LegendItem], width: float) -> tuple[int, int]:
    """(columns, rows) of the legend: as many columns as fit ``width``, in the order given."""
    cols, used = 0, 0.0
    for it in items:
        used += 30 + text_px(it.label)
        if cols and used > width - 16:
            break
        cols += 1
    cols = max(cols, 1)
    return cols, math.ceil(len(items) / cols)


def header_px(items: Sequence[LegendItem], width: float) -> float:
    """Height of the title and the legend above the axes."""
    return 34 + (18 * _legend_grid(items, width)[1] if items else 0)


@dataclass
class Canvas:
    """The chart being drawn: its figure and axes, and the tooltips given to its marks. Mutable
    while drawing; ``svg`` holds the page-ready markup once the ``chart`` block has closed."""

    fig: Figure
    ax: Axes
    key: str
    width: float
    height: float
    tips: dict[str, str] = field(default_factory=dict)
    mark_tips: dict[str, tuple[str, ...]] = field(default_factory=dict)
    svg: str = ""

    def _gid(self) -> str:
        return f"{self.key}-{len(self.tips) + len(self.mark_tips)}"

    def tip(self, artist: Artist, text: str) -> None:
        """Hovering ``artist`` shows ``text`` (its value, in words)."""
        gid = self._gid()
        artist.set_gid(gid)
        self.tips[gid] = text

    def marks(
        self, xs: Sequence[float], ys: Sequence[float], tips: Sequence[str], style: Mapping[str, Any]
    ) -> None:
        """One mark per point, all of one ``style``, drawn as a single artist (a curve over
        thousands of nodes stays fast and small), each mark with its own tooltip."""
        if not xs:
            return
        (line,) = self.ax.plot(list(xs), list(ys), linestyle="none", clip_on=False, **style)
        gid = self._gid()
        line.set_gid(gid)
        self.mark_tips[gid] = tuple(tips)

    def legend(self, items: Sequence[LegendItem]) -> None:
        """The legend under the title, above the axes (``header_px`` kept room for it)."""
        if not items:
            return
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        handles: list[Artist] = []
        for it in items:
            if it.shape == "rect":
                handles.append(Patch(facecolor=it.color, label=it.label))
            else:
                handles.append(Line2D([], [], ls="", label=it.label, **mark_style(it.shape, it.color)))
        self.fig.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(2 / self.width, 1 - 24 / self.height),
            ncols=_legend_grid(items, self.width)[0],
            borderaxespad=0,
            borderpad=0,
            handletextpad=0.4,
            labelspacing=0.3,
        )

    def note(self, text: str, color: str = INK) -> None:
        """A short remark at the top right of the axes (e.g. what was clipped)."""
        self.ax.text(
            1.0,
            1.01,
            text,
            transform=self.ax.transAxes,
            ha="right",
            va="bottom",
            color=color,
            fontsize=SMALL_SIZE,
        )


def mark_style(shape: str, color: str, size: float = 7.0) -> dict[str, Any]:
    """Keyword arguments of ``Axes.plot`` for a mark of ``shape`` (see ``LegendItem``)."""
    if shape == "circle":
        return {"marker": "o", "markersize": size, "color": color, "markeredgewidth": 0}
    if shape == "ring":
        return {"marker": "o", "markersize": size, "markerfacecolor": "#ffffff", "markeredgecolor": color}
    marker = {"up": "^", "right": ">", "left": "<"}[shape]
    return {
        "marker": marker,
        "markersize": size + 1,
        "markerfacecolor": color,
        "markeredgecolor": CLIP_EDGE,
        "markeredgewidth": 1.0,
    }


def _key(title: str, width: float, height: float) -> str:
    """Ids of this chart's tooltips: unique on a page that shows several charts, same every time."""
    return "c" + hashlib.sha256(f"{title}\0{width}\0{height}".encode()).hexdigest()[:8]


def _style(key: str) -> dict[Any, Any]:
    """The project's settings, and this chart's own salt for the ids matplotlib hashes (fixed:
    the same chart gives the same bytes; its own: two charts on a page share no id)."""
    return {**MPL_STYLE, "svg.hashsalt": key}


@contextmanager
def chart(
    title: str, width: float, height: float, *, left: float, top: float, right: float = 14, bottom: float = 42
) -> Iterator[Canvas]:
    """A figure of ``width`` x ``height`` px with ``title`` and one axes, inset by the margins
    (px), in the project's style (applied only inside this block). When the block closes,
    ``Canvas.svg`` holds the chart. Why margins by estimate and not a layout engine: the
    constrained layout draws every chart twice, and the pages draw several."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    key = _key(title, width, height)
    with matplotlib.rc_context(_style(key)):
        fig = Figure(figsize=(width / 72, height / 72))
        FigureCanvasAgg(fig)  # text metrics, without choosing a global backend
        fig.subplots_adjust(
            left=left / width, right=1 - right / width, top=1 - top / height, bottom=bottom / height
        )
        fig.text(6 / width, 1 - 17 / height, title, fontsize=TITLE_SIZE, fontweight="bold", va="baseline")
        canvas = Canvas(fig, fig.add_subplot(), key, width, height)
        yield canvas
        canvas.svg = _to_page_svg(fig, title, width, height, canvas.tips, canvas.mark_tips)


def empty_chart(title: str, message: str, width: float) -> str:
    """A chart that has nothing to draw says so, under its title, at the size of a line of text."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    height = 56.0
    key = _key(title, width, height)
    with matplotlib.rc_context(_style(key)):
        fig = Figure(figsize=(width / 72, height / 72))
        FigureCanvasAgg(fig)
        fig.text(6 / width, 1 - 17 / height, title, fontsize=TITLE_SIZE, fontweight="bold", va="baseline")
        fig.text(6 / width, 1 - 42 / height, message, color=MUTED, va="baseline")
        return _to_page_svg(fig, f"{title}: {message}", width, height, {}, {})


def _to_page_svg(
    fig: Figure,
    label: str,
    width: float,
    height: float,
    tips: Mapping[str, str],
    mark_tips: Mapping[str, tuple[str, ...]],
) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata=_NO_METADATA)
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r">\s+<", "><", re.sub(r"\s*\n\s*", " ", text)).strip()
    esc_label = html.escape(label, quote=True)
    root = (
        f'<svg class="chart" width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'role="img" aria-label="{esc_label}"><title>{esc_label}</title>'
    )
    text = _ROOT.sub(lambda _: root, text, count=1)
    if tips:
        text = _GROUP.sub(
            lambda m: m.group(0) + _title(tips[m.group(1)]) if m.group(1) in tips else m.group(0), text
        )
    for gid, each in mark_tips.items():
        text = _title_marks(text, gid, each)
    return text


_GROUP = re.compile(r'<g id="(c[0-9a-f]{8}-\d+)">')
_TAG = re.compile(r"<g\b[^>]*>|</g>|<use\b[^>]*/>")


def _title(text: str) -> str:
    return f"<title>{html.escape(text, quote=False)}</title>"


def _title_marks(text: str, gid: str, tips: Sequence[str]) -> str:
    """Give the i-th ``<use>`` (mark) inside the group ``gid`` the i-th tooltip; when the count
    differs (a mark was not drawn) no tooltip is given rather than one on the wrong mark."""
    start = text.find(f'<g id="{gid}">')
    if start < 0:
        return text
    depth, uses = 0, []
    for m in _TAG.finditer(text, start):
        tag = m.group(0)
        if tag.startswith("</g"):
            depth -= 1
            if depth == 0:
                break
        elif tag.startswith("<g"):
            depth += 1
        else:
            uses.append(m)
    if len(uses) != len(tips):
        return text
    parts, last = [], 0
    for m, tip in zip(uses, tips, strict=True):
        parts += [text[last : m.start()], m.group(0)[:-2], ">", _title(tip), "</use>"]
        last = m.end()
    return "".join(parts) + text[last:]
