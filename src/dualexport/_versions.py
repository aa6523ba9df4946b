"""Library versions, recorded in every manifest and report (reproducibility)."""

from __future__ import annotations

import platform
from importlib import metadata

__all__ = ["library_versions"]

_PACKAGES = ("dualexport", "torch", "executorch", "onnx", "onnxruntime", "onnxscript", "onnx_ir")


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in _PACKAGES:
        try:
            out[pkg] = metadata.version(pkg.replace("_", "-"))
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out
