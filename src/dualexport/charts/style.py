"""The one style of every chart: the palette (a runtime has the same colour on every page) and the
matplotlib settings the charts are drawn with.

Why fixed hex values: the screenshot tests count these exact pixel colours, and a reader who has
learnt "blue is ONNX" on one page must not have to relearn it on the next. Why the settings are a
mapping applied with ``matplotlib.rc_context`` around each chart (never ``rcParams.update``): a
user's own matplotlib state is theirs; it is restored the moment a chart is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = [
    "ONNX_COLOR",
    "XNNPACK_COLOR",
    "DELEGATED_COLOR",
    "NOT_DELEGATED_COLOR",
    "FALLBACK_COLOR",
    "INK",
    "AXIS",
    "GRID",
    "ROW_RULE",
    "MUTED",
    "WARN",
    "CLIP_EDGE",
    "RUNTIME_COLORS",
    "RUNTIME_LABELS",
    "runtime_color",
    "runtime_label",
    "FONT_SIZE",
    "SMALL_SIZE",
    "TITLE_SIZE",
    "MPL_STYLE",
]

# ----------------------------------------------------------------------------- palette
ONNX_COLOR = "#1f77b4"
XNNPACK_COLOR = "#d62728"
DELEGATED_COLOR = "#2ca02c"
NOT_DELEGATED_COLOR = "#7f7f7f"
FALLBACK_COLOR = "#555555"

INK = "#222222"  # text
AXIS = "#333333"  # spines and ticks
GRID = "#e6e6e6"
ROW_RULE = "#f2f2f2"  # the faint line under each row of a dot plot
MUTED = "#666666"  # "n/a", "no data"
WARN = "#bb0000"  # a note that something was drawn other than as given
CLIP_EDGE = "#000000"  # the outline of a mark clipped to the axes' edge

RUNTIME_COLORS: Mapping[str, str] = MappingProxyType({"onnx": ONNX_COLOR, "xnnpack": XNNPACK_COLOR})
RUNTIME_LABELS: Mapping[str, str] = MappingProxyType(
    {"onnx": "ONNX (ONNX Runtime)", "xnnpack": "XNNPACK (ExecuTorch)"}
)


def runtime_color(name: str) -> str:
    """The runtime's colour; an unknown runtime (a plugin target) gets a neutral grey."""
    return RUNTIME_COLORS.get(name, FALLBACK_COLOR)


def runtime_label(name: str) -> str:
    """The runtime's legend name: which file format and which runtime ran it."""
    return RUNTIME_LABELS.get(name, name)


# ----------------------------------------------------------------------------- matplotlib settings
FONT_SIZE = 11  # ticks, labels, legend (px: the charts are drawn at 72 dpi, 1 pt = 1 px)
SMALL_SIZE = 10  # values written beside marks
TITLE_SIZE = 13

MPL_STYLE: Mapping[str, Any] = MappingProxyType(
    {
        # text stays text (searchable, selectable, small), in a font every browser has a stand-in for
        "svg.fonttype": "none",
        "font.family": "sans-serif",
        "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"],
        "font.size": FONT_SIZE,
        "text.color": INK,
        # labels are model and node names: a "$" is a character, not the start of TeX
        "text.parse_math": False,
        "figure.dpi": 72,
        "savefig.dpi": 72,
        "figure.facecolor": "#ffffff",
        "axes.edgecolor": AXIS,
        "axes.labelcolor": INK,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.axisbelow": True,
        "grid.color": GRID,
        "grid.linewidth": 1.0,
        "xtick.color": AXIS,
        "ytick.color": AXIS,
        "xtick.labelcolor": INK,
        "ytick.labelcolor": INK,
        "xtick.labelsize": FONT_SIZE,
        "ytick.labelsize": FONT_SIZE,
        "legend.frameon": False,
        "legend.fontsize": FONT_SIZE,
        "legend.handlelength": 1.0,
        "legend.handleheight": 1.0,
        "legend.columnspacing": 1.2,
    }
)
