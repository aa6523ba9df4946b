"""What a chart is given: one frozen record per series, and how a number reads on a page.

Why records and not arrays: a series carries its name and colour with its values, so the legend,
the marks and their tooltips cannot drift apart; ``None`` is "no value" and is drawn as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "HistogramSeries",
    "BarSeries",
    "LineSeries",
    "LineMark",
    "DotSeries",
    "format_number",
]


@dataclass(frozen=True)
class HistogramSeries:
    """One series of a histogram: ``counts[i]`` values fell in ``[edges[i], edges[i + 1])``."""

    label: str
    color: str
    edges: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def usable(self) -> bool:
        """One more edge than counts, every edge finite and in order: otherwise "no data"."""
        e = self.edges
        return (
            len(self.counts) > 0
            and len(e) == len(self.counts) + 1
            and all(math.isfinite(v) for v in e)
            and all(a <= b for a, b in zip(e, e[1:], strict=False))
        )


@dataclass(frozen=True)
class BarSeries:
    """One value per category (``None``: no value, drawn as "n/a")."""

    label: str
    color: str
    values: tuple[float | None, ...]

    def at(self, i: int) -> float | None:
        return self.values[i] if i < len(self.values) else None


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

    def at(self, i: int) -> float | None:
        return self.values[i] if i < len(self.values) else None


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
