"""One walk of the dispatcher's CompositeImplicitAutograd ops per change, not one per namespace.

Why: every ``run_decompositions`` in torch 2.13 (ours, torch.onnx's and ExecuTorch's) collects
the preservable CIA ops namespace by namespace, and ``_collect_all_valid_cia_ops_for_namespace``
starts each time with ``_materialize_cpp_cia_ops()``: a walk over every CIA registration (about
800) that creates the ``torch.ops`` overloads. With ExecuTorch and torchao loaded there are ~40
namespaces and several decompositions per export, so a small model's export spent a third of its
time (3.4 s of 9.1 s, measured with cProfile on ``dualexport.examples.TinyMLP``) re-creating
overloads that already existed. The walk is idempotent; it only has new work when an op was
registered since the last one. So it is skipped while the dispatcher's list of CIA registrations
(one C call, under 1 ms) is the one already walked; a newly registered op is still materialized.
torch's own comment explains why it does not cache: ops can be added at any time; this keys on
exactly that.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["walk_cia_ops_once_per_change"]

_lock = threading.Lock()
_walked: tuple[str, ...] | None = None


def walk_cia_ops_once_per_change() -> None:
    """Install the skip in ``torch._export.utils`` (idempotent)."""
    import torch
    from torch._export import utils

    original: Callable[[], None] = utils._materialize_cpp_cia_ops
    if getattr(original, "dualexport_walk_once", False):
        return

    def materialize_when_changed() -> None:
        global _walked
        current = tuple(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"))
        with _lock:
            if current == _walked:
                return
            original()
            _walked = current

    materialize_when_changed.dualexport_walk_once = True  # type: ignore[attr-defined]
    utils._materialize_cpp_cia_ops = materialize_when_changed
