"""Parity: metrics, tolerances, inputs, per-layer alignment, reports."""

from __future__ import annotations

from .metrics import Metrics, compute_metrics
from .report import Divergence, OutputParity, ParityReport
from .tolerances import DEFAULT_TOLERANCES, Tolerance, tolerance_for

__all__ = [
    "Metrics",
    "compute_metrics",
    "Divergence",
    "OutputParity",
    "ParityReport",
    "DEFAULT_TOLERANCES",
    "Tolerance",
    "tolerance_for",
]
