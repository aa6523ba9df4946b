"""How the local engine's children are stopped; where they come from is ``_forkserver``."""

from __future__ import annotations

import contextlib
import os
import signal

from .._forkserver import START_METHODS, context, hf_modules

__all__ = ["context", "kill_group", "hf_modules", "START_METHODS"]


def kill_group(pid: int) -> None:
    """SIGKILL a child that leads its own process group, and everything it forked."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
