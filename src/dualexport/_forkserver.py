"""The local fleet engine's fork server, startable before anything heavy is imported.

Why a fork server: a clean interpreter, started once per batch, that imports the stack (torch,
ExecuTorch, ONNX Runtime; transformers when an entry needs it) and forks one child per task. A
child is as clean as a spawned one (the server runs no threads and no user code) but starts in
~0.1 s instead of the imports' seconds. ``spawn`` is the fallback where there is no fork server.

Why here and not in ``fleet``: ``dualexport batch`` starts the server before it imports the
fleet package (which imports torch), so the server's imports (5 s) overlap with the driver's.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tomllib
from collections.abc import Sequence
from typing import Any

__all__ = ["context", "hf_modules", "prestart", "START_METHODS"]

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
    process (the first call decides its preloads) and is started now, so its imports overlap
    with the caller's own work."""
    if method == "forkserver" and "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD + ([_PRELOAD_HF, *hf_modules(hf)] if hf else []))
        from multiprocessing import forkserver

        forkserver.ensure_running()
        return ctx
    return mp.get_context("spawn")


def prestart(manifest: str | os.PathLike[str]) -> None:
    """Start the fork server for the entries of a manifest, read just enough to know which
    transformers families to preload (the full reading, with its errors, comes after)."""
    try:
        with open(manifest, "rb") as f:
            models = tomllib.load(f).get("models", {})
    except (OSError, tomllib.TOMLDecodeError, AttributeError):
        return
    hf = [t["hf"] for t in models.values() if isinstance(t, dict) and isinstance(t.get("hf"), str)]
    context("forkserver", hf)
