"""The explicit list of targets. Nothing is discovered by importing a folder: adding a target
means adding a line here, and only the chosen target's module (and its heavy library) is imported."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from ..errors import InputError
from .base import Exporter

__all__ = ["TARGETS", "get_exporter", "normalize_targets"]

_EXPORTERS: dict[str, tuple[str, str]] = {
    "onnx": ("dualexport.exporters.onnx", "OnnxExporter"),
    "xnnpack": ("dualexport.exporters.xnnpack", "XnnpackExporter"),
}
TARGETS: tuple[str, ...] = tuple(_EXPORTERS)


def normalize_targets(target: str | Sequence[str]) -> tuple[str, ...]:
    """Accept "onnx", "onnx,xnnpack" or a sequence; refuse unknown names and duplicates."""
    items = [t.strip() for t in target.split(",")] if isinstance(target, str) else list(target)
    if not items or any(not isinstance(t, str) for t in items):
        raise InputError(f"target must be one of {TARGETS} or a sequence of them, got {target!r}")
    unknown = [t for t in items if t not in _EXPORTERS]
    if unknown:
        raise InputError(f"unknown target(s) {unknown}", hint=f"use one or more of {', '.join(TARGETS)}")
    if len(set(items)) != len(items):
        raise InputError(f"target {target!r} names a target twice")
    return tuple(items)


def get_exporter(target: str) -> Exporter:
    module_name, class_name = _EXPORTERS[normalize_targets(target)[0]]
    return getattr(importlib.import_module(module_name), class_name)()
