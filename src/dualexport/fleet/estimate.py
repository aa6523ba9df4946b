"""How much memory an entry needs at its peak, before it runs: what admission (local) and the
declared ``memory`` resource (Ray) are based on.

Why from the weight bytes: an export's peak grows with the weights (the model itself, the lowered
copies the libraries force, the runtime child that loads the file), on top of a fixed cost (the
imported stack and the runtimes). The weights are counted without allocating them: the model is
built on the ``meta`` device, in a child process (the factory is the user's code: it must not
run, sleep or crash in the driver). A previous run's measured peak for the same entry beats any
formula; the manifest's ``memory_mb`` beats both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .manifest import Entry
from .record import EntryRecord
from .worker import instantiate

__all__ = [
    "Estimate",
    "estimate_entry",
    "estimate_entries",
    "meta_weight_bytes",
    "available_mb",
    "BASE_MB",
    "WEIGHT_FACTOR",
]

logger = logging.getLogger(__name__)

#: The imported stack, both runtimes and the export's own structures, for a small model (MB).
BASE_MB = 900.0
#: Peak bytes per weight byte: the model, the export's peak above it (measured 1.1x-2.6x), and the
#: runtime child that loads the written file.
WEIGHT_FACTOR = 4.0
#: A learned peak is scaled by this margin (the machine's allocator is not deterministic).
LEARNED_MARGIN = 1.15
#: Weights assumed (MB) for a model that could not be sized.
DEFAULT_WEIGHT_MB = 256.0
#: Seconds a model may take to build on the meta device.
SIZING_TIMEOUT = 60.0


@dataclass(frozen=True)
class Estimate:
    mb: float
    weight_bytes: int | None
    source: str  # "manifest", "previous run", "weights", "default"


def meta_weight_bytes(entry: Entry) -> int | None:
    """Parameter and buffer bytes of the entry's model, built on the meta device (no memory);
    None when the model cannot be built that way."""
    try:
        import torch

        with torch.device("meta"):
            model = instantiate(entry)
        seen: set[int] = set()
        total = 0
        for t in [*model.parameters(), *model.buffers()]:
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
        return total
    except Exception as exc:
        logger.info("cannot size %s on the meta device: %s", entry.name, exc)
        return None


def _known(entry: Entry, previous: EntryRecord | None) -> Estimate | None:
    if entry.memory_mb is not None:
        return Estimate(entry.memory_mb, None, "manifest")
    if previous is not None and previous.peak_rss_mb and previous.status in ("passed", "check_failed"):
        return Estimate(previous.peak_rss_mb * LEARNED_MARGIN, previous.weight_bytes, "previous run")
    return None


def _from_weights(wb: int | None) -> Estimate:
    if wb is not None:
        return Estimate(BASE_MB + WEIGHT_FACTOR * wb / 2**20, wb, "weights")
    return Estimate(BASE_MB + DEFAULT_WEIGHT_MB * WEIGHT_FACTOR, None, "default")


def estimate_entry(entry: Entry, previous: EntryRecord | None = None) -> Estimate:
    """One entry's estimate, sized in this process (for a caller that trusts the factory)."""
    return _known(entry, previous) or _from_weights(meta_weight_bytes(entry))


def _meta_child(conn: Any, entry: dict[str, Any]) -> None:
    os.setsid()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        conn.send(meta_weight_bytes(Entry.from_dict(entry)))
    finally:
        conn.close()


def estimate_entries(
    entries: Sequence[Entry],
    previous: Mapping[str, EntryRecord | None],
    *,
    method: str = "forkserver",
    timeout: float = SIZING_TIMEOUT,
) -> dict[str, Estimate]:
    """Every entry's estimate; the ones to size on the meta device are sized in child processes
    (a few at once, each given at most ``timeout`` seconds, or the entry's own timeout)."""
    from multiprocessing.connection import wait

    from .processes import context, kill_group

    out: dict[str, Estimate] = {}
    todo: list[Entry] = []
    for e in entries:
        known = _known(e, previous.get(e.name))
        if known is not None:
            out[e.name] = known
        else:
            todo.append(e)
    if not todo:
        return out
    ctx = context(method, [e.hf for e in todo if e.hf is not None])
    running: dict[str, tuple[Any, Any, float, float]] = {}
    sizes: dict[str, int | None] = {}
    at_once = max(1, os.cpu_count() or 1)
    while todo or running:
        while todo and len(running) < at_once:
            e = todo.pop(0)
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_meta_child, args=(child, e.to_dict()), name=f"dualexport-size-{e.name}"
            )
            proc.start()
            child.close()
            running[e.name] = (proc, parent, time.monotonic(), min(timeout, e.timeout))
        wait([p.sentinel for p, *_ in running.values()], timeout=0.2)
        for name, (proc, conn, t0, limit) in list(running.items()):
            if proc.is_alive() and time.monotonic() - t0 <= limit:
                continue
            if proc.is_alive():
                logger.info("sizing %s took longer than %.0f s: the default estimate applies", name, limit)
            kill_group(proc.pid)
            proc.join()
            size = None
            with contextlib.suppress(EOFError, OSError):
                if conn.poll():
                    size = conn.recv()
            conn.close()
            sizes[name] = size
            del running[name]
    for name, size in sizes.items():
        out[name] = _from_weights(size)
    return out


def available_mb() -> float:
    """Memory the machine can give now (MemAvailable), in MB."""
    with contextlib.suppress(OSError, ValueError):
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20
    return 4096.0
