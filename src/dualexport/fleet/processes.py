"""Where the local engine's children come from, and how they are stopped.

Why a fork server: a clean interpreter, started once per batch, that imports the stack (torch,
ExecuTorch, ONNX Runtime; transformers when an entry needs it) and forks one child per task. A
child is as clean as a spawned one (the server runs no threads and no user code) but starts in
~0.1 s instead of the imports' seconds. ``spawn`` is the fallback where there is no fork server.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
from collections.abc import Sequence
from typing import Any

__all__ = ["context", "kill_group", "hf_modules", "START_METHODS"]

START_METHODS = ("forkserver", "spawn")
_PRELOAD = ["dualexport.fleet._preload"]
_PRELOAD_HF = "dualexport.fleet._preload_hf"


def hf_modules(config_classes: Sequence[str]) -> list[str]:
    """transformers' modeling modules for these config classes, by its naming convention
    (``LlamaConfig`` -> ``transformers.models.llama.modeling_llama``); a wrong guess costs
    nothing (the fork server skips a preload that does not import)."""
    out = []
    for c in dict.fromkeys(config_classes):
        family = c.removesuffix("Config").lower()
        out.append(f"transformers.models.{family}.modeling_{family}")
    return out


def context(method: str, hf: Sequence[str] = ()) -> Any:
    """The multiprocessing context for ``method``; the fork server also preloads transformers
    and the modeling modules of the config classes ``hf`` names. The server starts once per
    process (the first batch decides its preloads) and is started now, so its imports overlap
    with the caller's own work."""
    if method == "forkserver" and "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD + ([_PRELOAD_HF, *hf_modules(hf)] if hf else []))
        from multiprocessing import forkserver

        forkserver.ensure_running()
        return ctx
    return mp.get_context("spawn")


def kill_group(pid: int) -> None:
    """SIGKILL a child that leads its own process group, and everything it forked."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
