"""Inline SVG plots for the self-contained HTML reports (stdlib only: imports nothing of
dualexport, so every layer may draw with it)."""

from __future__ import annotations

from .palette import (
    DELEGATED_COLOR,
    FALLBACK_COLOR,
    NOT_DELEGATED_COLOR,
    ONNX_COLOR,
    RUNTIME_COLORS,
    RUNTIME_LABELS,
    XNNPACK_COLOR,
    runtime_color,
    runtime_label,
)
from .svg import (
    BarSeries,
    DotSeries,
    HistogramSeries,
    LineMark,
    LineSeries,
    bar_chart,
    dot_plot,
    format_number,
    histogram,
    line_chart,
    nice_ticks,
)

__all__ = [
    # plots
    "histogram",
    "bar_chart",
    "line_chart",
    "dot_plot",
    # their series
    "HistogramSeries",
    "BarSeries",
    "LineSeries",
    "LineMark",
    "DotSeries",
    # axis helpers
    "nice_ticks",
    "format_number",
    # colours and names
    "ONNX_COLOR",
    "XNNPACK_COLOR",
    "DELEGATED_COLOR",
    "NOT_DELEGATED_COLOR",
    "FALLBACK_COLOR",
    "RUNTIME_COLORS",
    "RUNTIME_LABELS",
    "runtime_color",
    "runtime_label",
]
