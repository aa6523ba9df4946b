"""The four charts the pages draw, with matplotlib: a histogram, horizontal bars, a line per series
over named points, and a dot per category.

Each reads on its own, printed or offline: axes say what they measure (quantity, unit, scale) with
ticks in real units, a legend names every series with its colour, every mark has a tooltip with its
value, and a value the axes cannot hold (inf, nan, beyond the range) is clipped to the edge and
drawn with its own marker instead of breaking the picture. Each returns the chart as inline SVG.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._figure import GLYPH_WIDTH, Canvas, LegendItem, chart, empty_chart, header_px, mark_style, text_px
from .style import FONT_SIZE, MUTED, ROW_RULE, SMALL_SIZE, WARN
from .values import BarSeries, DotSeries, HistogramSeries, LineMark, LineSeries, format_number

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["histogram", "bar_chart", "line_chart", "dot_plot"]

Formatter = Callable[[float], str]


# ----------------------------------------------------------------------------- shared pieces
def _fit(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max(max_chars - 1, 1)] + "\u2026"


def _ticks(ax: Axes, axis: str, ticks: Sequence[float], fmt: Formatter) -> None:
    labels = [fmt(t) for t in ticks]
    if axis == "x":
        ax.set_xticks(list(ticks), labels=labels)
    else:
        ax.set_yticks(list(ticks), labels=labels)


def _span(lo: float, hi: float, *, integer: bool = False, bins: int = 5) -> list[float]:
    """Round ticks whose first is at or below ``lo`` and last at or above ``hi``: the axis then
    holds every value."""
    from matplotlib.ticker import MaxNLocator

    hi = hi if hi > lo else lo + 1.0
    ticks = [float(t) for t in MaxNLocator(nbins=bins, integer=integer, min_n_ticks=2).tick_values(lo, hi)]
    first = max((t for t in ticks if t <= lo), default=ticks[0])
    last = min((t for t in ticks if t >= hi), default=ticks[-1])
    return [t for t in ticks if first <= t <= last]


def _cut(categories: Sequence[str], width: float, share: float) -> list[str]:
    """Category names cut to ``share`` of the chart's width (the whole name in the tooltip)."""
    max_chars = int(width * share / (FONT_SIZE * GLYPH_WIDTH))
    return [_fit(s, max_chars) for s in categories]


def _category_axis(c: Canvas, categories: Sequence[str], labels: Sequence[str]) -> None:
    """One row per category, top to bottom, each name with its whole text as tooltip. The
    names are plain texts beside the axes, not ticks: a tick is five artists, and a batch
    page has a row per entry."""
    from matplotlib.transforms import blended_transform_factory, offset_copy

    c.ax.set_yticks([])
    c.ax.set_ylim(len(categories) - 0.5, -0.5)
    beside = offset_copy(
        blended_transform_factory(c.ax.transAxes, c.ax.transData), c.fig, x=-6, units="points"
    )
    for i, (label, cat) in enumerate(zip(labels, categories, strict=True)):
        c.tip(c.ax.text(0, i, label, transform=beside, ha="right", va="center"), cat)


# ----------------------------------------------------------------------------- histogram
def _decade(e: float) -> str:
    """The quantity whose log10 is ``e`` (past float range, the exponent alone)."""
    return f"{10.0**e:.3g}" if abs(e) < 300 else f"1e{e:.0f}"


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
    usable = [s for s in series if s.usable]
    if not usable:
        names = ", ".join(s.label for s in series)
        return empty_chart(title, f"no data ({names})" if names else "no data", width)
    counts = [[float(v) if math.isfinite(v) and v >= 0 else 0.0 for v in s.counts] for s in usable]
    bad = sum(1 for s in usable for v in s.counts if not (math.isfinite(v) and v >= 0))
    lo = min(s.edges[0] for s in usable)
    hi = max(max(s.edges[-1] for s in usable), lo + 1e-9)
    top = max(max(cs) for cs in counts) or 1.0
    legend = [LegendItem(s.label if s.usable else f"{s.label} (no data)", s.color) for s in series]
    left = 26 + text_px(format_number(top)) + 10
    with chart(title, width, height, left=left, top=header_px(legend, width) + (8 if bad else 0)) as c:
        for k, (s, cs) in enumerate(zip(usable, counts, strict=True)):
            _histogram_lane(c, s, cs, k, len(usable), fmt)
        _count_axis(c.ax, top, y_label, log_counts)
        c.ax.set_xlim(lo, hi)
        if x_log10:
            step = max(1, math.ceil((hi - lo) / max(2, int((width - left) // 60))))
            decades = range(math.ceil(lo / step) * step, math.floor(hi) + 1, step)
            c.ax.set_xticks(list(decades), labels=[f"1e{k}" for k in decades])
        else:
            _ticks(c.ax, "x", [t for t in _span(lo, hi, bins=6) if lo <= t <= hi], fmt)
        c.ax.set_xlabel(x_label)
        c.legend(legend)
        if bad:
            c.note(f"{bad} non-finite count(s) drawn as 0", WARN)
    return c.svg


def _histogram_lane(
    c: Canvas, s: HistogramSeries, counts: list[float], k: int, n: int, fmt: Formatter
) -> None:
    bins = [i for i, v in enumerate(counts) if v > 0]
    if not bins:
        return
    lanes = [(s.edges[i + 1] - s.edges[i]) / n for i in bins]
    bars = c.ax.bar(
        [s.edges[i] + k * lane for i, lane in zip(bins, lanes, strict=True)],
        [counts[i] for i in bins],
        width=[lane * 0.94 for lane in lanes],
        align="edge",
        color=s.color,
        linewidth=0,
    )
    for rect, i in zip(bars, bins, strict=True):
        c.tip(rect, f"{s.label}: {format_number(counts[i])} in [{fmt(s.edges[i])}, {fmt(s.edges[i + 1])})")


def _count_axis(ax: Axes, top: float, label: str, log_counts: bool) -> None:
    """Counts from 0; on a log scale, 0, then each decade up to the largest count (named too)."""
    if not log_counts:
        ticks = _span(0.0, top, integer=True)
        ax.set_ylim(0, ticks[-1])
        _ticks(ax, "y", ticks, format_number)
        ax.set_ylabel(label)
        ax.grid(axis="y")
        return
    ax.set_yscale("symlog", linthresh=1.0, linscale=0.5)
    ticks = [0.0] + [10.0**k for k in range(int(math.floor(math.log10(top))) + 1)]
    if math.log10(top) - math.log10(ticks[-1]) > 0.3:
        ticks.append(top)
    ax.set_ylim(0, top)
    _ticks(ax, "y", ticks, format_number)
    ax.yaxis.minorticks_off()
    ax.set_ylabel(label + " (log scale)")
    ax.grid(axis="y")


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
        return empty_chart(title, "no data", width)
    if x_max is not None and x_max > 0:
        ticks = [t for t in _span(0.0, x_max, integer=integer) if t <= x_max]
        limit = x_max
    else:
        ticks = _span(0.0, _bar_extent(len(categories), series, stacked) or 1.0, integer=integer)
        limit = ticks[-1]
    row_px = 22.0 if stacked else 10.0 * len(series) + 8
    legend = [LegendItem(s.label, s.color) for s in series]
    labels = _cut(categories, width, 0.4)
    top = header_px(legend, width)
    height = top + 4 + row_px * len(categories) + 42
    right = 14 + max(text_px(t, SMALL_SIZE) for t in _bar_texts(len(categories), series, stacked, fmt))
    with chart(title, width, height, left=max(map(text_px, labels)) + 14, top=top + 4, right=right) as c:
        clipped = _draw_bars(c, _bar_layout(categories, series, stacked, limit, fmt), series, stacked)
        _category_axis(c, categories, labels)
        c.ax.set_xlim(0, limit)
        _ticks(c.ax, "x", ticks, fmt)
        c.ax.grid(axis="x")
        c.ax.set_xlabel(x_label)
        c.legend(legend)
        if clipped:
            c.note("\u25b6 beyond the axis (clipped)")
    return c.svg


def _bar_texts(rows: int, series: Sequence[BarSeries], stacked: bool, fmt: Formatter) -> list[str]:
    """The value texts written after the bars (to keep room for them on the right)."""
    if stacked:
        return [" / ".join(fmt(v) for s in series if (v := s.at(i)) is not None) for i in range(rows)]
    return ["n/a", *(fmt(v) for s in series for i in range(rows) if (v := s.at(i)) is not None)]


def _bar_extent(rows: int, series: Sequence[BarSeries], stacked: bool) -> float:
    extents = [0.0]
    for i in range(rows):
        row = [v for s in series if (v := s.at(i)) is not None and math.isfinite(v)]
        extents += [sum(max(v, 0.0) for v in row)] if stacked else row
    return max(extents)


@dataclass(frozen=True)
class _Segment:
    """One bar: series ``k`` on row ``row`` from ``a`` to ``b`` (clipped to the axis: ``over``)."""

    k: int
    row: int
    a: float
    b: float
    v: float
    tip: str
    over: bool


@dataclass(frozen=True)
class _BarLayout:
    segments: tuple[_Segment, ...]
    texts: tuple[tuple[float, float, str], ...]  # (x, y, text) written after the bars
    empty: tuple[tuple[int, str], ...]  # rows without any value: (row, category)


def _bar_layout(
    categories: Sequence[str], series: Sequence[BarSeries], stacked: bool, limit: float, fmt: Formatter
) -> _BarLayout:
    """Where each bar goes, row by row: series end to end (``stacked``) or one under another."""
    segments, texts, empty = [], [], []
    n = len(series)
    for i, cat in enumerate(categories):
        values = [s.at(i) for s in series]
        if all(v is None or math.isnan(v) for v in values):
            empty.append((i, cat))
            continue
        start = 0.0
        for k, (s, v) in enumerate(zip(series, values, strict=True)):
            if v is None or math.isnan(v):
                continue
            end = start + v if stacked else v
            over = math.isinf(v) or v < 0 or end > limit * (1 + 1e-9)
            tip = f"{cat} \u2014 {s.label}: {fmt(v)}" + (" (clipped to the axis)" if over else "")
            a = min(max(start, 0.0), limit) if stacked else 0.0
            b = min(max(end, 0.0), limit)
            segments.append(_Segment(k, i, a, b, v, tip, over))
            if stacked:
                start += max(v, 0.0) if math.isfinite(v) else limit
            else:
                texts.append((b, _bar_y(i, k, n, stacked), fmt(v)))
        if stacked:
            texts.append((min(start, limit), float(i), " / ".join(fmt(v) for v in values if v is not None)))
    return _BarLayout(tuple(segments), tuple(texts), tuple(empty))


def _bar_y(row: int, k: int, n: int, stacked: bool) -> float:
    return float(row) if stacked else row - 0.4 + (k + 0.5) * 0.8 / n


def _draw_bars(c: Canvas, layout: _BarLayout, series: Sequence[BarSeries], stacked: bool) -> bool:
    """Draw the layout (one bar artist per series); True when a value was clipped to the axis."""
    from matplotlib.transforms import offset_copy

    n = len(series)
    height = 0.64 if stacked else 0.8 / n * 0.9
    for k, s in enumerate(series):
        drawn = [g for g in layout.segments if g.k == k and g.b - g.a > 0]
        if drawn:
            bars = c.ax.barh(
                [_bar_y(g.row, k, n, stacked) for g in drawn],
                [g.b - g.a for g in drawn],
                left=[g.a for g in drawn],
                height=height,
                color=s.color,
                linewidth=0,
            )
            for rect, g in zip(bars, drawn, strict=True):
                c.tip(rect, g.tip)
    for g in layout.segments:
        if g.over:
            style = mark_style("right" if g.v > 0 else "left", series[g.k].color, 7)
            (mark,) = c.ax.plot([g.b], [_bar_y(g.row, g.k, n, stacked)], clip_on=False, **style)
            c.tip(mark, g.tip)
    after = offset_copy(c.ax.transData, c.fig, x=6, units="points")
    for x, y, text in layout.texts:
        c.ax.text(x, y, text, transform=after, va="center", fontsize=SMALL_SIZE)
    for row, cat in layout.empty:
        c.tip(c.ax.text(0, row, "n/a", transform=after, va="center", color=MUTED), f"{cat}: no value")
    return any(g.over for g in layout.segments)


# ----------------------------------------------------------------------------- line over named points
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
        return empty_chart(title, "no data", width)
    finite = [v for s in series for _, v in s.points if math.isfinite(v)]
    if log_y:
        k_lo = math.floor(math.log10(max(min(finite, default=floor), floor)))
        k_hi = max(math.ceil(math.log10(max(max(finite, default=1.0), floor))), k_lo + 1)
        step = max(1, math.ceil((k_hi - k_lo) / 6))
        lo, hi = 10.0**k_lo, 10.0**k_hi
    else:
        span = _span(min([*finite, 0.0]), max([*finite, 0.0]) or 1.0)
        lo, hi = span[0], span[-1]
    nonfinite = len(finite) < sum(len(s.points) for s in series)
    legend = [LegendItem(s.label, s.color) for s in series]
    if nonfinite:
        legend.append(LegendItem("non-finite (drawn at the top edge)", "#ffffff", "up"))
    y_labels = [f"1e{k}" for k in range(k_lo, k_hi + 1)] if log_y else [format_number(t) for t in span]
    left = 26 + max(map(text_px, y_labels)) + 10
    with chart(title, width, height, left=left, top=header_px(legend, width)) as c:
        for s in series:
            _line(c, s, order, floor if log_y else -math.inf, hi)
        if log_y:
            c.ax.set_yscale("log")
            decades = list(range(k_lo, k_hi + 1, step))
            c.ax.set_yticks([10.0**k for k in decades], labels=[f"1e{k}" for k in decades])
            c.ax.yaxis.minorticks_off()
        else:
            _ticks(c.ax, "y", span, format_number)
        c.ax.set_ylim(lo, hi)
        _line_marks(c, marks, order)
        _x_positions(c.ax, len(order), width - left)
        c.ax.grid(axis="y")
        c.ax.set_xlabel(x_label)
        c.ax.set_ylabel(y_label)
        c.legend(legend)
    return c.svg


def _line(c: Canvas, s: LineSeries, order: dict[str, int], floor: float, top: float) -> None:
    """The series' line through every point; a dot per finite point (at the floor when below
    it), a triangle on the top edge per non-finite one."""
    xs = [order[name] for name, _ in s.points]
    ys = [max(v, floor) if math.isfinite(v) else top for _, v in s.points]
    c.ax.plot(xs, ys, color=s.color, linewidth=1.5, clip_on=False)
    finite = [(x, y, name, v) for x, y, (name, v) in zip(xs, ys, s.points, strict=True) if math.isfinite(v)]
    c.marks(
        [x for x, _, _, _ in finite],
        [y for _, y, _, _ in finite],
        [
            f"{s.label}: {name}: {format_number(v)}"
            + (f" (drawn at the floor {floor:g})" if v < floor else "")
            for _, _, name, v in finite
        ],
        mark_style("circle", s.color, 5),
    )
    for x, (name, v) in zip(xs, s.points, strict=True):
        if not math.isfinite(v):
            (mark,) = c.ax.plot([x], [top], clip_on=False, **mark_style("up", s.color, 7))
            c.tip(mark, f"{s.label}: {name}: {format_number(v)}")


def _line_marks(c: Canvas, marks: Sequence[LineMark], order: dict[str, int]) -> None:
    """Dashed lines at named points, each labelled on its own row, inside the plot."""
    n = len(order)
    for j, m in enumerate(marks):
        if m.at not in order:
            continue
        x = order[m.at]
        right = n > 1 and x > 0.6 * (n - 1)
        c.ax.axvline(x, color=m.color, linestyle="--", linewidth=1)
        text = c.ax.annotate(
            m.label,
            (x, 0),
            xycoords=("data", "axes fraction"),
            xytext=(-4 if right else 4, 6 + 13 * j),
            textcoords="offset points",
            ha="right" if right else "left",
            color=m.color,
            fontsize=SMALL_SIZE,
        )
        c.tip(text, m.label)


def _x_positions(ax: Axes, n: int, plot_width: float) -> None:
    """Integer ticks over point positions 0..n-1 (a single point sits in the middle)."""
    if n == 1:
        ax.set_xlim(-1, 1)
        ax.set_xticks([0], labels=["0"])
        return
    ax.set_xlim(0, n - 1)
    ticks = [t for t in _span(0, n - 1, integer=True, bins=max(2, int(plot_width // 60))) if t <= n - 1]
    _ticks(ax, "x", ticks, format_number)


# ----------------------------------------------------------------------------- dots per category
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
        return empty_chart(title, "no data", width)
    if x_range is not None and x_range[1] > x_range[0]:
        lo, hi = x_range
        ticks = [t for t in _span(lo, hi) if lo <= t <= hi]
    else:
        values = [v for s in series for v in s.values if v is not None and math.isfinite(v)]
        ticks = _span(min([*values, 0.0]), max(values, default=1.0) or 1.0)
        lo, hi = ticks[0], ticks[-1]
    every = [v for s in series for v in s.values if v is not None]
    legend = [LegendItem(s.label, s.color, "circle") for s in series]
    if any(math.isinf(v) or (math.isfinite(v) and not lo <= v <= hi) for v in every):
        legend.append(LegendItem("beyond the axis, inf included (clipped)", "#ffffff", "right"))
    if any(math.isnan(v) for v in every):
        legend.append(LegendItem("not a number", "#555555", "ring"))
    row_px = max(18.0, 7.0 * len(series) + 10)
    labels = _cut(categories, width, 0.35)
    top = header_px(legend, width) + 4
    height = top + row_px * len(categories) + 42
    right = 10 + text_px(fmt(ticks[-1])) / 2
    with chart(title, width, height, left=max(map(text_px, labels)) + 14, top=top, right=right) as c:
        c.ax.hlines(range(len(categories)), lo, hi, color=ROW_RULE, linewidth=1, zorder=0)
        for k, s in enumerate(series):
            _dots(c, s, categories, (k - (len(series) - 1) / 2) * 7 / row_px, lo, hi, fmt)
        _category_axis(c, categories, labels)
        c.ax.set_xlim(lo, hi)
        _ticks(c.ax, "x", ticks, fmt)
        c.ax.grid(axis="x")
        c.ax.set_xlabel(x_label)
        c.legend(legend)
    return c.svg


def _dots(
    c: Canvas,
    s: DotSeries,
    categories: Sequence[str],
    offset: float,
    lo: float,
    hi: float,
    fmt: Formatter,
) -> None:
    """The series' dot on each row (shifted by ``offset`` rows); nan as a ring on the left
    edge, a value beyond the axis as a triangle on that edge."""
    inside: list[tuple[float, float, str]] = []
    for i, cat in enumerate(categories):
        v = s.at(i)
        if v is None:
            continue
        y, tip = i + offset, f"{cat} \u2014 {s.label}: {fmt(v)}"
        if lo <= v <= hi:
            inside.append((v, y, tip))
            continue
        if math.isnan(v):
            x, style, tip = lo, mark_style("ring", s.color), tip + " (not a number)"
        else:
            x, style, tip = (
                min(max(v, lo), hi),
                mark_style("right" if v > hi else "left", s.color),
                tip + " (clipped)",
            )
        (dot,) = c.ax.plot([x], [y], clip_on=False, **style)
        c.tip(dot, tip)
    c.marks(
        [x for x, _, _ in inside],
        [y for _, y, _ in inside],
        [t for _, _, t in inside],
        mark_style("circle", s.color, 8),
    )
