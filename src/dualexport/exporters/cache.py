"""Reuse a target's artifact when nothing that determines it has changed.

Why the key comes from the traced program: the module object or its class name says nothing
about a changed forward or a changed weight. The key hashes the shared program's graph (after
transforms and quantization), the sha256 of every weight, its symbolic shape ranges, the target,
its options and the library versions; any difference is a miss. A hit is still proven: the
previous files are linked into the new set and re-read from disk against the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any

from .._versions import library_versions
from ..shared_state.fingerprint import ProgramFingerprint
from .base import ExportOptions

__all__ = ["target_cache_key", "previous_manifest", "link_previous_files"]


def target_cache_key(
    fp: ProgramFingerprint,
    target: str,
    options: ExportOptions,
    extra: Mapping[str, Any] | None = None,
    *,
    weights: bool = True,
) -> str:
    """The key a reused artifact must match. With ``weights=False``: the structure key, equal
    for two programs that differ only in weight values (a weights-only change can be patched)."""
    payload = {
        "graph": fp.graph,
        "weights": sorted(fp.weights.items()) if weights else None,
        "shapes": fp.shapes,
        "target": target,
        "options": options.to_dict(),
        "versions": library_versions(),
        "extra": dict(extra or {}),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def previous_manifest(folder: pathlib.Path, name: str) -> Any | None:
    """The manifest of the set already in ``folder``, or None (absent or unreadable: no reuse)."""
    from ..weights import WeightManifest

    path = folder / f"{name}.weights.json"
    try:
        return WeightManifest.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def link_previous_files(
    previous: pathlib.Path, staging: pathlib.Path, files: list[str]
) -> list[pathlib.Path] | None:
    """Hard-link (or copy) the previous artifact files into the new set; None if one is gone."""
    out = []
    for fname in files:
        if pathlib.PurePath(fname).name != fname:
            return None
        src, dst = previous / fname, staging / fname
        if not src.is_file() or src.is_symlink():
            return None
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        out.append(dst)
    return out
