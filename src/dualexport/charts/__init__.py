"""Charts for the self-contained HTML pages, drawn with matplotlib and returned as inline SVG.

Imports nothing of dualexport, so every layer may draw with it; matplotlib itself is imported
only when a chart is drawn (``import dualexport`` stays light).
"""

from __future__ import annotations

from .plots import bar_chart, dot_plot, histogram, line_chart
from .style import (
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
from .values import BarSeries, DotSeries, HistogramSeries, LineMark, LineSeries, format_number

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
    # how a number reads
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
