"""Refuse early when the output folder's file system cannot hold the artifacts.

Why before any work: a full disk found while writing the second target wastes the whole export
(minutes for a big model) and, without set-level commits, could leave a half-written folder.
The new set is staged beside the previous one until it is committed, so the estimate does not
subtract the space the old files use.
"""

from __future__ import annotations

import os
import pathlib
import shutil

from ..errors import DiskSpaceError

__all__ = ["check_free_space", "needed_bytes", "free_bytes"]

_MARGIN = 16 << 20  # graphs, manifest, reports, file system slack


def needed_bytes(weight_bytes: int, n_targets: int) -> int:
    """Upper estimate for one export: each target stores the weights once (ONNX initializers or
    external data; .pte constants or XNNPACK named data), the reference .pt2 once more."""
    return int(weight_bytes) * (int(n_targets) + 1) + _MARGIN


def free_bytes(path: pathlib.Path) -> int:
    return shutil.disk_usage(os.fspath(path)).free


def check_free_space(out_dir: pathlib.Path, need: int) -> None:
    """Raise DiskSpaceError when ``out_dir`` has less than ``need`` bytes free (0 skips)."""
    if need <= 0:
        return
    free = free_bytes(pathlib.Path(out_dir))
    if free < need:
        raise DiskSpaceError(
            f"{str(out_dir)!r} has {free / 2**20:.1f} MiB free, the artifacts need about "
            f"{need / 2**20:.1f} MiB",
            need=need,
            free=free,
            hint="free disk space, or choose an out_dir on a file system with more room",
        )
