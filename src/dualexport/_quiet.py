"""Other libraries' output, kept off the terminal unless asked for.

Why: a two-layer conv export printed about 16 lines from the libraries it drives before any
result (torchao's "Failed to load _C_mxfp8", "Detected no triton", torch's pytree
``register_constant`` deprecation, ``copyreg`` FutureWarnings about LeafSpec), and a user cannot
tell from them whether the export is broken. Most come from importing ExecuTorch, which imports
torchao itself (``executorch/exir/operator/util.py``), so they cannot be avoided by importing
less; they are captured instead.

While :func:`library_output` is active, warnings (the ``warnings`` module) raised outside
dualexport and log records of loggers outside ``dualexport`` are recorded as text lines and, at
default verbosity, not shown. They are shown as they happen when dualexport logs at INFO (the
CLI's ``-v``, or ``logging.getLogger("dualexport").setLevel(logging.INFO)``), and kept either way
(``ExportResult.library_messages``, the export page). Output that a native library writes to
the file descriptor itself is not Python's to capture and is left alone.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import threading
import warnings
from collections.abc import Iterator
from typing import TextIO

__all__ = ["library_output", "verbose"]

_PACKAGE = pathlib.Path(__file__).resolve().parent
_LOCK = threading.Lock()
_active: list[str] | None = None


def verbose() -> bool:
    """Whether dualexport was asked to be loud (its logger enabled for INFO)."""
    return logging.getLogger("dualexport").isEnabledFor(logging.INFO)


def _ours(name: str) -> bool:
    return name == "dualexport" or name.startswith("dualexport.")


def _keep(messages: list[str], line: str) -> None:
    """Each distinct first line once, in order (a warning repeated per call is one line)."""
    line = (line.splitlines() or [""])[0]
    if line not in messages:
        messages.append(line)


class _CaptureFilter(logging.Filter):
    """On every handler: pass dualexport's records; record the others' and pass them only when
    ``show``."""

    def __init__(self, messages: list[str], show: bool) -> None:
        super().__init__()
        self.messages = messages
        self.show = show

    def filter(self, record: logging.LogRecord) -> bool:
        if _ours(record.name):
            return True
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is the library's problem, not a reason to fail
            text = str(record.msg)
        _keep(self.messages, f"{record.levelname} {record.name}: {text}")
        return self.show


def _handlers() -> list[logging.Handler]:
    """Every handler a record can reach: the root's, each logger's, and the last resort that
    prints WARNING records when nothing is configured."""
    found: list[logging.Handler] = list(logging.root.handlers)
    for logger in list(logging.root.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            found += logger.handlers
    if logging.lastResort is not None:
        found.append(logging.lastResort)
    unique: dict[int, logging.Handler] = {id(h): h for h in found}
    return list(unique.values())


@contextlib.contextmanager
def library_output(show: bool | None = None) -> Iterator[list[str]]:
    """Capture other libraries' warnings and log records for the duration; yields the list the
    lines are appended to. ``show`` (default: :func:`verbose`) lets them through as well.
    Nested uses share the outermost capture."""
    global _active
    with _LOCK:
        outer = _active
    if outer is not None:
        yield outer
        return
    import torch  # noqa: F401  (torch installs its loggers' handlers on import: filter those too)

    show = verbose() if show is None else show
    messages: list[str] = []
    capture = _CaptureFilter(messages, show)
    handlers = _handlers()
    for h in handlers:
        h.addFilter(capture)
    previous_show = warnings.showwarning

    def showwarning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        try:
            ours = pathlib.Path(filename).resolve().is_relative_to(_PACKAGE)
        except (OSError, ValueError):
            ours = False
        if not ours:
            _keep(messages, f"{category.__name__} ({pathlib.Path(filename).name}:{lineno}): {message}")
        if ours or show:
            previous_show(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    with _LOCK:
        _active = messages
    try:
        yield messages
    finally:
        with _LOCK:
            _active = None
        if warnings.showwarning is showwarning:
            warnings.showwarning = previous_show
        for h in handlers:
            h.removeFilter(capture)
