"""Inline SVG plots for self-contained HTML pages: stdlib only, no script, no network.

Why a module of its own: the parity report, the export page and the batch page draw the same few
kinds of plot, and each must be readable on its own, printed or opened offline: axes say what
they measure (quantity, unit, scale) with tick labels in real units, a legend names every series
with its colour, every mark has a ``<title>`` tooltip with its value, and a value the axes cannot
hold (inf, nan, beyond the range) is clipped to the edge and drawn with its own marker instead of
breaking the picture. All text goes through ``html.escape``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "HistogramSeries",
    "BarSeries",
    "LineSeries",
    "LineMark",
    "DotSeries",
    "histogram",
    "bar_chart",
    "line_chart",
    "dot_plot",
    "nice_ticks",
    "format_number",
]

Formatter = Callable[[float], str]

_FS = 11  # ticks, labels, legend
_TITLE_FS = 13
_GLYPH = 0.6  # average sans-serif glyph width per font size, to size margins without a font
_AXIS = "#333333"
_GRID = "#e6e6e6"
_INK = "#222222"
_CLIP = "#000000"


# ----------------------------------------------------------------------------- series values
@dataclass(frozen=True)
class HistogramSeries:
    """One series of a histogram: ``counts[i]`` values fell in ``[edges[i], edges[i + 1])``."""

    label: str
    color: str
    edges: tuple[float, ...]
    counts: tuple[float, ...]


@dataclass(frozen=True)
class BarSeries:
    """One value per category (``None``: no value, drawn as "n/a")."""

    label: str
    color: str
    values: tuple[float | None, ...]


@dataclass(frozen=True)
class LineSeries:
    """Named points in order; the x axis is the union of the names in first-seen order, so two
    series over the same nodes line up even when one has fewer points."""

    label: str
    color: str
    points: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class LineMark:
    """A dashed vertical line at the point named ``at`` (e.g. the first divergence)."""

    at: str
    label: str
    color: str = "#000000"


@dataclass(frozen=True)
class DotSeries:
    """One dot per category (``None``: no value, no dot)."""

    label: str
    color: str
    values: tuple[float | None, ...]


# ----------------------------------------------------------------------------- small helpers
def format_number(v: float | None, digits: int = 3) -> str:
    """Short, unambiguous number text: integers as such, tiny or huge values in e-notation,
    and the non-finite ones by name (never an exception)."""
    if v is None:
        return "n/a"
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if float(v).is_integer() and abs(v) < 1e6:
        return str(int(v))
    if v == 0 or 1e-3 <= abs(v) < 1e6:
        return f"{v:.{digits}g}"
    return f"{v:.{max(digits - 1, 1)}e}"


def nice_ticks(lo: float, hi: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """Round tick positions (1, 2, 2.5, 5 times a power of ten) covering ``[lo, hi]``;
    ``integer``: no step below 1 (for counts)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    span = hi - lo
    mag = 10 ** math.floor(math.log10(span / max(count, 1)))
    step = mag
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        step = m * mag
        if span / step <= count and not (integer and step < 1):
            break
    if integer:
        step = max(round(step), 1)
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    i = first
    while i * step <= hi + step * 1e-9:
        ticks.append(round(i * step, 12))
        i += 1
    return ticks


def _span_ticks(lo: float, hi: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """``nice_ticks`` extended by a step on either side as needed, so the first tick is at or
    below ``lo`` and the last at or above ``hi``: the axis then holds every value."""
    ticks = nice_ticks(lo, hi, count, integer=integer) or [0.0]
    step = ticks[1] - ticks[0] if len(ticks) > 1 else (max(hi - lo, 0.0) or 1.0)
    while ticks[0] > lo:
        ticks.insert(0, ticks[0] - step)
    while ticks[-1] < hi or len(ticks) < 2:
        ticks.append(ticks[-1] + step)
    return ticks


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _text_width(text: str, size: int = _FS) -> float:
    return len(text) * size * _GLYPH


def _fit(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max(max_chars - 1, 1)] + "\u2026"


def _text(
    x: float,
    y: float,
    text: str,
    *,
    anchor: str = "start",
    size: int = _FS,
    bold: bool = False,
    fill: str = _INK,
    rotate: bool = False,
    tooltip: str | None = None,
) -> str:
    attrs = f'x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{_esc(fill)}" text-anchor="{_esc(anchor)}"'
    if bold:
        attrs += ' font-weight="bold"'
    if rotate:
        attrs += f' transform="rotate(-90 {x:.1f} {y:.1f})"'
    inner = _esc(text) + (f"<title>{_esc(tooltip)}</title>" if tooltip else "")
    return f"<text {attrs}>{inner}</text>"


def _line(x1: float, y1: float, x2: float, y2: float, color: str = _AXIS, dash: bool = False) -> str:
    extra = ' stroke-dasharray="4 3"' if dash else ""
    return f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{_esc(color)}"{extra}/>'


def _marker(shape: str, x: float, y: float, color: str, tooltip: str, r: float = 4.5) -> str:
    """A data mark with its tooltip. ``circle``: a value; ``ring``: not a number; ``right`` /
    ``left`` / ``up``: clipped to that edge of the axes."""
    tip = f"<title>{_esc(tooltip)}</title>"
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{_esc(color)}">{tip}</circle>'
    if shape == "ring":
        return (
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="#ffffff" stroke="{_esc(color)}" '
            f'stroke-width="1.5">{tip}</circle>'
        )
    if shape == "right":
        pts = f"{x - r:.1f},{y - r:.1f} {x + r:.1f},{y:.1f} {x - r:.1f},{y + r:.1f}"
    elif shape == "left":
        pts = f"{x + r:.1f},{y - r:.1f} {x - r:.1f},{y:.1f} {x + r:.1f},{y + r:.1f}"
    else:  # up
        pts = f"{x - r:.1f},{y + r:.1f} {x:.1f},{y - r:.1f} {x + r:.1f},{y + r:.1f}"
    return f'<polygon points="{pts}" fill="{_esc(color)}" stroke="{_CLIP}" stroke-width="1">{tip}</polygon>'


def _legend(items: Sequence[tuple[str, str, str]], x: float, y: float, width: float) -> tuple[str, float]:
    """Swatch + name per item, wrapped to ``width``; returns the SVG and the height it took.
    ``items``: ``(name, colour, shape)`` with shape ``rect`` or a ``_marker`` shape."""
    if not items:
        return "", 0.0
    parts, cx, cy, row = [], x, y, 16.0
    for name, color, shape in items:
        w = 16 + _text_width(name) + 14
        if cx > x and cx + w > x + width:
            cx, cy = x, cy + row
        if shape == "rect":
            parts.append(
                f'<rect x="{cx:.1f}" y="{cy - 9:.1f}" width="11" height="11" fill="{_esc(color)}">'
                f"<title>{_esc(name)}</title></rect>"
            )
        else:
            parts.append(_marker(shape, cx + 5.5, cy - 3.5, color, name, r=4.5))
        parts.append(_text(cx + 16, cy, name))
        cx += w
    return "".join(parts), cy - y + row


def _svg(width: float, height: float, label: str, body: str) -> str:
    return (
        f'<svg class="chart" width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'role="img" aria-label="{_esc(label)}" font-family="sans-serif">'
        f"<title>{_esc(label)}</title>{body}</svg>"
    )


def _empty(title: str, message: str, width: float) -> str:
    body = _text(8, 18, title, size=_TITLE_FS, bold=True) + _text(8, 42, message, fill="#666666")
    return _svg(width, 56, f"{title}: {message}", body)


def _header(title: str, legend: Sequence[tuple[str, str, str]], width: float) -> tuple[str, float]:
    """Title and legend at the top; returns the SVG and where the plot area may start."""
    svg, h = _legend(legend, 8, 38, width - 16)
    return _text(8, 18, title, size=_TITLE_FS, bold=True) + svg, 38 + h + 6


def _x_axis(x0: float, x1: float, y: float, ticks: Sequence[tuple[float, str]], label: str) -> str:
    parts = [_line(x0, y, x1, y)]
    last_end = -math.inf
    for px, text in ticks:
        parts.append(_line(px, y, px, y + 4))
        half = _text_width(text) / 2
        if px - half > last_end + 4:  # skip a label that would overlap its neighbour
            parts.append(_text(px, y + 15, text, anchor="middle"))
            last_end = px + half
    parts.append(_text((x0 + x1) / 2, y + 31, label, anchor="middle"))
    return "".join(parts)


def _y_axis(
    x: float, y0: float, y1: float, ticks: Sequence[tuple[float, str]], label: str, grid_to: float
) -> str:
    parts = [_line(x, y0, x, y1)]
    for py, text in ticks:
        parts.append(_line(x + 1, py, grid_to, py, _GRID))
        parts.append(_line(x - 4, py, x, py))
        parts.append(_text(x - 6, py + 4, text, anchor="end"))
    parts.append(_text(12, (y0 + y1) / 2, label, anchor="middle", rotate=True))
    return "".join(parts)


# ----------------------------------------------------------------------------- histogram
def _decade(e: float) -> str:
    """The quantity whose log10 is ``e`` (past float range, the exponent alone)."""
    return f"{10.0**e:.3g}" if abs(e) < 300 else f"1e{e:.0f}"


def _hist_ok(s: HistogramSeries) -> bool:
    e = s.edges
    return (
        len(s.counts) > 0
        and len(e) == len(s.counts) + 1
        and all(math.isfinite(v) for v in e)
        and all(a <= b for a, b in zip(e, e[1:], strict=False))
    )


def histogram(
    series: Sequence[HistogramSeries],
    *,
    title: str,
    x_label: str,
    y_label: str = "count",
    log_counts: bool = True,
    x_log10: bool = False,
    x_format: Formatter | None = None,
    width: float = 480,
    height: float = 260,
) -> str:
    """Bars per bin, the series side by side within each bin (each its own lane, no
    transparency, so colours stay exact); the y axis counts values (log scale says so).
    ``x_log10``: the edges are log10 of the quantity; ticks fall on whole decades and read
    ``1e-6``, tooltips give the quantity itself."""
    fmt = x_format or (_decade if x_log10 else format_number)
    usable = [s for s in series if _hist_ok(s)]
    legend = [(s.label if s in usable else f"{s.label} (no data)", s.color, "rect") for s in series]
    if not usable:
        names = ", ".join(s.label for s in series)
        return _empty(title, f"no data ({names})" if names else "no data", width)
    bad = 0
    clean: list[tuple[HistogramSeries, list[float]]] = []
    for s in usable:
        counts = []
        for c in s.counts:
            if not (math.isfinite(c) and c >= 0):
                bad += 1
                c = 0.0
            counts.append(float(c))
        clean.append((s, counts))
    top = max((max(c) for _, c in clean), default=0.0) or 1.0
    lo = min(s.edges[0] for s in usable)
    hi = max(s.edges[-1] for s in usable)
    hi = hi if hi > lo else lo + 1.0

    def frac(c: float) -> float:
        return math.log10(c + 1) / math.log10(top + 1) if log_counts else c / top

    if log_counts:
        y_ticks = [0.0] + [10.0**k for k in range(int(math.floor(math.log10(top))) + 1)]
    else:
        y_ticks = _span_ticks(0.0, top)
    ml = 24 + max(_text_width(format_number(t)) for t in [*y_ticks, top]) + 8
    head, y_top = _header(title, legend, width)
    x0, x1, y0 = ml, width - 14, height - 40
    ph, pw = y0 - y_top, x1 - x0

    def px(v: float) -> float:
        return x0 + pw * (v - lo) / (hi - lo)

    def py(c: float) -> float:
        return y0 - ph * frac(c)

    tick_rows = [(py(t), format_number(t)) for t in y_ticks]
    if top not in y_ticks and py(y_ticks[-1]) - py(top) > 14:
        tick_rows.append((py(top), format_number(top)))
    parts = [head, _y_axis(x0, y0, y_top, tick_rows, y_label + (" (log scale)" if log_counts else ""), x1)]
    n = len(clean)
    for k, (s, counts) in enumerate(clean):
        for i, c in enumerate(counts):
            if c <= 0:
                continue
            xa, xb = px(s.edges[i]), px(s.edges[i + 1])
            lane = (xb - xa) / n
            top_y = min(py(c), y0 - 1)
            parts.append(
                f'<rect x="{xa + k * lane:.1f}" y="{top_y:.1f}" width="{max(lane - 0.6, 0.8):.1f}" '
                f'height="{y0 - top_y:.1f}" fill="{_esc(s.color)}"><title>{_esc(s.label)}: '
                f"{format_number(c)} in [{_esc(fmt(s.edges[i]))}, {_esc(fmt(s.edges[i + 1]))})"
                "</title></rect>"
            )
    slots = max(2, int(pw // 60))
    if x_log10:
        step = max(1, math.ceil((hi - lo) / slots))
        k_first = math.ceil(lo / step) * step
        x_ticks = [(px(k), f"1e{k}") for k in range(k_first, math.floor(hi) + 1, step)]
    else:
        x_ticks = [(px(t), fmt(t)) for t in nice_ticks(lo, hi, slots)]
    parts.append(_x_axis(x0, x1, y0, x_ticks, x_label))
    if bad:
        parts.append(_text(x1, y_top - 4, f"{bad} non-finite count(s) drawn as 0", anchor="end", fill="#b00"))
    return _svg(width, height, title, "".join(parts))


# ----------------------------------------------------------------------------- horizontal bars
def bar_chart(
    categories: Sequence[str],
    series: Sequence[BarSeries],
    *,
    title: str,
    x_label: str,
    stacked: bool = False,
    x_max: float | None = None,
    integer: bool = False,
    value_format: Formatter | None = None,
    width: float = 640,
) -> str:
    """Horizontal bars, one row per category: ``stacked`` puts the series end to end (parts of
    a whole, e.g. delegated + not delegated), otherwise each series gets its own bar. The value(s)
    are written after the bars so the chart reads without hovering. ``integer``: the values are
    counts, so the ticks are whole numbers."""
    fmt = value_format or format_number
    if not categories or not series:
        return _empty(title, "no data", width)
    n = len(series)

    def val(s: BarSeries, i: int) -> float | None:
        return s.values[i] if i < len(s.values) else None

    extents: list[float] = [0.0]
    for i in range(len(categories)):
        row = [v for s in series if (v := val(s, i)) is not None and math.isfinite(v)]
        extents += [sum(max(v, 0.0) for v in row)] if stacked else row
    if x_max is not None and x_max > 0:
        limit, ticks = x_max, nice_ticks(0.0, x_max, integer=integer)
    else:
        ticks = _span_ticks(0.0, max(extents) or 1.0, integer=integer)
        limit = ticks[-1]
    max_chars = int((width * 0.4) / (_FS * _GLYPH))
    labels = [_fit(c, max_chars) for c in categories]
    ml = max(_text_width(lab) for lab in labels) + 14
    legend = [(s.label, s.color, "rect") for s in series]
    clipped = False
    head, y_top = _header(title, legend, width)
    bar_h = 14.0 if stacked else 10.0
    row_h = bar_h + 8 if stacked else bar_h * n + 8
    x0, x1 = ml, width - 80
    y_first = y_top + 4
    y0 = y_first + row_h * len(categories)
    pw = x1 - x0

    def px(v: float) -> float:
        return x0 + pw * min(max(v, 0.0), limit) / limit

    parts = [head]
    for t in ticks:
        parts.append(_line(px(t), y_first, px(t), y0, _GRID))
    for i, (cat, lab) in enumerate(zip(categories, labels, strict=True)):
        ry = y_first + i * row_h + 4
        parts.append(_text(x0 - 6, ry + (row_h - 8) / 2 + 4, lab, anchor="end", tooltip=cat))
        values = [val(s, i) for s in series]
        if all(v is None or math.isnan(v) for v in values):
            parts.append(
                _text(x0 + 4, ry + (row_h - 8) / 2 + 4, "n/a", fill="#666666", tooltip=f"{cat}: no value")
            )
            continue
        start = 0.0
        for k, (s, v) in enumerate(zip(series, values, strict=True)):
            if v is None or math.isnan(v):
                continue
            end = start + v if stacked else v
            over = math.isinf(v) or v < 0 or end > limit * (1 + 1e-9)
            clipped |= over
            tip = f"{cat} \u2014 {s.label}: {fmt(v)}" + (" (clipped to the axis)" if over else "")
            a = px(start) if stacked else x0
            b = px(start + v) if stacked else px(v)
            y = ry if stacked else ry + k * bar_h
            if b - a > 0:
                parts.append(
                    f'<rect x="{a:.1f}" y="{y:.1f}" width="{b - a:.1f}" height="{bar_h - 1:.1f}" '
                    f'fill="{_esc(s.color)}"><title>{_esc(tip)}</title></rect>'
                )
            if over:
                parts.append(_marker("right" if v > 0 else "left", b, y + (bar_h - 1) / 2, s.color, tip, r=4))
            if stacked:
                start += max(v, 0.0) if math.isfinite(v) else limit
            else:
                parts.append(_text(b + 6, y + bar_h - 2, fmt(v), size=10))
        if stacked:
            text = " / ".join(fmt(v) for v in values if v is not None)
            parts.append(_text(px(start) + 6, ry + bar_h - 2, text, size=10))
    if clipped:
        parts.append(_text(x1, y_top - 2, "\u25b6 beyond the axis (clipped)", anchor="end", size=10))
    parts.append(_x_axis(x0, x1, y0, [(px(t), fmt(t)) for t in ticks], x_label))
    parts.append(_line(x0, y_first, x0, y0))
    return _svg(width, y0 + 42, title, "".join(parts))


# ----------------------------------------------------------------------------- line / dot curve
def line_chart(
    series: Sequence[LineSeries],
    *,
    title: str,
    x_label: str,
    y_label: str,
    log_y: bool = True,
    floor: float = 1e-12,
    marks: Sequence[LineMark] = (),
    width: float = 720,
    height: float = 280,
) -> str:
    """A line with a dot per point, per series; x is the position of each point's name. On a
    log axis a value at or below ``floor`` (an exact 0) sits on the floor, and a non-finite value
    sits on the top edge as a triangle, both saying so in their tooltip."""
    order: dict[str, int] = {}
    for s in series:
        for name, _ in s.points:
            order.setdefault(name, len(order))
    if not order:
        return _empty(title, "no data", width)

    def tf(v: float) -> float | None:
        if not math.isfinite(v):
            return None
        return math.log10(max(v, floor)) if log_y else v

    ys = [t for s in series for _, v in s.points if (t := tf(v)) is not None]
    if log_y:
        k_lo = math.floor(min(ys, default=math.log10(floor)))
        k_hi = max(math.ceil(max(ys, default=0.0)), k_lo + 1)
        step = max(1, math.ceil((k_hi - k_lo) / 6))
        y_ticks = [float(k) for k in range(k_lo, k_hi + 1, step)]
        lo, hi = float(k_lo), float(k_hi)
    else:
        y_ticks = _span_ticks(min([*ys, 0.0]), max([*ys, 0.0]) or 1.0)
        lo, hi = y_ticks[0], max(y_ticks[-1], y_ticks[0] + 1.0)
    nonfinite = any(not math.isfinite(v) for s in series for _, v in s.points)
    legend = [(s.label, s.color, "rect") for s in series]
    if nonfinite:
        legend.append(("non-finite (drawn at the top edge)", "#ffffff", "up"))
    head, y_top = _header(title, legend, width)
    y_fmt: Formatter = (lambda t: f"1e{int(t)}") if log_y else format_number
    ml = 24 + max(_text_width(y_fmt(t)) for t in y_ticks) + 8
    x0, x1, y0 = ml, width - 14, height - 40
    pw, ph = x1 - x0, y0 - y_top
    n = len(order)

    def px(i: int) -> float:
        return x0 + pw * (i / (n - 1)) if n > 1 else (x0 + x1) / 2

    def py(t: float) -> float:
        return y0 - ph * (t - lo) / (hi - lo)

    parts = [head, _y_axis(x0, y0, y_top, [(py(t), y_fmt(t)) for t in y_ticks], y_label, x1)]
    for j, m in enumerate(marks):
        if m.at in order:
            x = px(order[m.at])
            right = x > x0 + pw * 0.6  # keep the label inside the plot
            parts.append(_line(x, y_top, x, y0, m.color, dash=True))
            parts.append(
                _text(
                    x - 4 if right else x + 4,
                    y0 - 6 - 13 * j,
                    m.label,
                    size=10,
                    fill=m.color,
                    anchor="end" if right else "start",
                    tooltip=m.label,
                )
            )
    for s in series:
        pts: list[str] = []
        dots: list[str] = []
        for name, v in s.points:
            t = tf(v)
            x = px(order[name])
            if t is None:
                y = y_top
                dots.append(_marker("up", x, y, s.color, f"{s.label}: {name}: {format_number(v)}", r=4))
            else:
                y = py(t)
                note = f" (drawn at the floor {floor:g})" if log_y and v < floor else ""
                dots.append(
                    _marker("circle", x, y, s.color, f"{s.label}: {name}: {format_number(v)}{note}", r=2.5)
                )
            pts.append(f"{'M' if not pts else 'L'}{x:.1f},{y:.1f}")
        parts.append(f'<path d="{" ".join(pts)}" fill="none" stroke="{_esc(s.color)}" stroke-width="1.5"/>')
        parts.extend(dots)
    x_ticks = [
        (px(int(t)), format_number(t)) for t in nice_ticks(0, n - 1, max(2, int(pw // 60)), integer=True)
    ]
    parts.append(_x_axis(x0, x1, y0, x_ticks, x_label))
    return _svg(width, height, title, "".join(parts))


def dot_plot(
    categories: Sequence[str],
    series: Sequence[DotSeries],
    *,
    title: str,
    x_label: str,
    x_range: tuple[float, float] | None = None,
    value_format: Formatter | None = None,
    width: float = 640,
) -> str:
    """One row per category, one dot per series on it (offset a little so equal values stay
    visible). Values beyond the axis (inf included) sit on its edge as a triangle; nan as a ring."""
    fmt = value_format or format_number
    if not categories or not series:
        return _empty(title, "no data", width)
    values = [v for s in series for v in s.values if v is not None and math.isfinite(v)]
    if x_range is not None and x_range[1] > x_range[0]:
        lo, hi = x_range
        ticks = nice_ticks(lo, hi)
    else:
        ticks = _span_ticks(min([*values, 0.0]), max(values, default=1.0) or 1.0)
        lo, hi = ticks[0], ticks[-1]
    max_chars = int((width * 0.35) / (_FS * _GLYPH))
    labels = [_fit(c, max_chars) for c in categories]
    ml = max(_text_width(lab) for lab in labels) + 14
    n = len(series)
    row_h = max(18.0, 7.0 * n + 10)
    any_clip = any(
        v is not None and (math.isinf(v) or (_finite(v) and not lo <= v <= hi))
        for s in series
        for v in s.values
    )
    any_nan = any(v is not None and math.isnan(v) for s in series for v in s.values)
    legend = [(s.label, s.color, "circle") for s in series]
    if any_clip:
        legend.append(("beyond the axis, inf included (clipped)", "#ffffff", "right"))
    if any_nan:
        legend.append(("not a number", "#555555", "ring"))
    head, y_top = _header(title, legend, width)
    x0, x1 = ml, width - 20
    y_first = y_top + 4
    y0 = y_first + row_h * len(categories)
    pw = x1 - x0

    def px(v: float) -> float:
        return x0 + pw * (min(max(v, lo), hi) - lo) / (hi - lo)

    parts = [head]
    for t in ticks:
        parts.append(_line(px(t), y_first, px(t), y0, _GRID))
    for i, (cat, lab) in enumerate(zip(categories, labels, strict=True)):
        cy = y_first + i * row_h + row_h / 2
        parts.append(_line(x0, cy, x1, cy, "#f2f2f2"))
        parts.append(_text(x0 - 6, cy + 4, lab, anchor="end", tooltip=cat))
        for k, s in enumerate(series):
            v = s.values[i] if i < len(s.values) else None
            if v is None:
                continue
            y = cy + (k - (n - 1) / 2) * 7
            tip = f"{cat} \u2014 {s.label}: {fmt(v)}"
            if math.isnan(v):
                parts.append(_marker("ring", x0, y, s.color, tip + " (not a number)"))
            elif v > hi or v < lo:
                parts.append(_marker("right" if v > hi else "left", px(v), y, s.color, tip + " (clipped)"))
            else:
                parts.append(_marker("circle", px(v), y, s.color, tip))
    parts.append(_x_axis(x0, x1, y0, [(px(t), fmt(t)) for t in ticks], x_label))
    parts.append(_line(x0, y_first, x0, y0))
    return _svg(width, y0 + 42, title, "".join(parts))
