"""The colours and names every report uses, so one runtime looks the same on every page.

Why fixed hex values: the screenshot tests count these exact pixel colours, and a reader who has
learnt "blue is ONNX" on one page must not have to relearn it on the next.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
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

ONNX_COLOR = "#1f77b4"
XNNPACK_COLOR = "#d62728"
DELEGATED_COLOR = "#2ca02c"
NOT_DELEGATED_COLOR = "#7f7f7f"
FALLBACK_COLOR = "#555555"

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
