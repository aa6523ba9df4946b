"""One way to swap a library's module attribute for the length of a block.

Why one: dualexport swaps a few library globals while it lowers (ExecuTorch's partition deep-copy,
XNNPACK's pass manager and batch-norm placeholder naming, torch's CIA walk). Each swap had its own
lock, depth counter and saved original, written three times. ``patched`` is that logic once:
re-entrant and thread-safe (blocks in any thread share the swap; the first to open makes it, the
last to close restores the original, also on an exception), so two lowerings in two threads never
restore a swap the other still relies on.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["patched", "is_patched"]


@dataclass
class _Swap:
    owner: Any
    name: str
    original: Any
    depth: int = 0


_LOCK = threading.Lock()
_OPEN: dict[tuple[int, str], _Swap] = {}


@contextlib.contextmanager
def patched(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[Any]:
    """Within the block ``owner.name`` is ``make(original)``: made when the first block for this
    attribute opens (later blocks, in any thread, share it) and the original put back when the
    last one closes. Yields the original."""
    key = (id(owner), name)
    with _LOCK:
        swap = _OPEN.get(key)
        if swap is None:
            swap = _Swap(owner, name, getattr(owner, name))
            setattr(owner, name, make(swap.original))
            _OPEN[key] = swap
        swap.depth += 1
    try:
        yield swap.original
    finally:
        with _LOCK:
            swap.depth -= 1
            if swap.depth == 0:
                setattr(owner, name, swap.original)
                del _OPEN[key]


def is_patched(owner: Any, name: str) -> bool:
    """Whether a :func:`patched` block for ``owner.name`` is open."""
    with _LOCK:
        return (id(owner), name) in _OPEN
