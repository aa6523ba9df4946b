"""One module per target (onnx.py, xnnpack.py) behind the explicit registry in registry.py."""

from __future__ import annotations

from .base import Exporter, ExportOptions, LoweredTarget
from .delegation import DelegationReport
from .registry import TARGETS, get_exporter, normalize_targets

__all__ = [
    "Exporter",
    "ExportOptions",
    "LoweredTarget",
    "DelegationReport",
    "TARGETS",
    "get_exporter",
    "normalize_targets",
]
