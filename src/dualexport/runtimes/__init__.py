"""Run an artifact from disk (ORT, ExecuTorch) or the eager reference, on flat tensor lists."""

from __future__ import annotations

import pathlib

from .base import Runner

__all__ = ["Runner", "open_runner"]


def open_runner(target: str, path: pathlib.Path, *, lean: bool = False, isolated: bool = True) -> Runner:
    """Load the artifact for ``target``; imports only that runtime. ``lean`` trades speed for
    memory where the runtime allows (used by the export's smoke runs). ``isolated`` (default)
    runs it in a forked child (runtimes/isolated.py): a runtime that crashes on a bad file is an
    error of the target, not the end of this process."""
    if isolated:
        from .isolated import IsolatedRunner

        return IsolatedRunner(target, path, lean=lean)
    if target == "onnx":
        from .ort import OrtRunner

        return OrtRunner(path, lean=lean)
    if target == "xnnpack":
        from .executorch import ExecuTorchRunner

        return ExecuTorchRunner(path)
    raise ValueError(f"no runtime for target {target!r}")
