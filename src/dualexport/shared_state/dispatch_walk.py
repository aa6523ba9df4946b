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

The skip is in force only inside ``walk_cia_ops_once_per_change()``, a context manager around
dualexport's own export, decompositions and lowerings (re-entrant: the outermost block installs
it and restores torch's function); importing dualexport changes nothing in torch.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from ..compat.torch import cia_registrations, patched_cia_materializer

__all__ = ["walk_cia_ops_once_per_change"]

_lock = threading.Lock()
_walked: tuple[str, ...] | None = None


def _skipping(original: Callable[[], None]) -> Callable[[], None]:
    def materialize_when_changed() -> None:
        global _walked
        current = cia_registrations()
        with _lock:
            if current == _walked:
                return
            original()
            _walked = current

    materialize_when_changed.dualexport_walk_once = True  # type: ignore[attr-defined]
    return materialize_when_changed


@contextlib.contextmanager
def walk_cia_ops_once_per_change() -> Iterator[None]:
    """Within the block, torch walks the CIA registrations only when they changed (re-entrant;
    any thread's decomposition sees the skip while a block is open, as torch's function is a
    module global: ``compat.patching.patched``)."""
    with patched_cia_materializer(_skipping):
        yield
