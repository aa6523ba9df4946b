"""Library versions, recorded in every manifest and report, and part of every cache key.

Why dualexport's own source is hashed: the package version string changes only at a release, so
a changed lowering, pass or manifest rule in a checkout would otherwise reuse files the old code
made. The digest covers the package's Python sources by path relative to the package and by
content, so two clones at different paths agree and any edit disagrees.
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
import platform
from importlib import metadata

__all__ = ["library_versions", "source_digest"]

_PACKAGES = ("dualexport", "torch", "executorch", "onnx", "onnxruntime", "onnxscript", "onnx_ir")


@functools.cache
def source_digest() -> str:
    """sha256 over every ``*.py`` of the installed dualexport package (relative path + bytes)."""
    root = pathlib.Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in rel:
            continue
        h.update(rel.encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in _PACKAGES:
        try:
            out[pkg] = metadata.version(pkg.replace("_", "-"))
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    out["dualexport_source"] = source_digest()[:16]
    return out
