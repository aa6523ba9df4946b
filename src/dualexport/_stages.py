"""Where an export's time and memory go: each stage's wall seconds and the peak memory of the
process tree while it ran.

Why: a 1B decoder takes minutes and most of a machine's memory; a user must see which stage is
running (the CLI draws a row per stage as it starts and ends) and the result must say what each
stage cost (``ExportResult.timings``), or an export that takes long looks hung and one that takes
much cannot be fixed. Memory is the tree's PSS (``_memory.tree_pss_mb``: a forked lowering's
pages shared with the parent counted once), sampled in a thread while anything records, and at
least this process's own high-water RSS inside the stage (the kernel's ``VmHWM``, reset as each
stage starts and ends): a spike shorter than a sampling period (judging a 1B decoder's logits in
float64 took gigabytes for a second) is not missed.

``recording()`` collects the stages run inside it (nested recordings each get theirs, the outer
one all of them); ``stage(name)`` times one; ``listening(callback)`` tells a view of each start
and end. Outside a recording ``stage`` costs nothing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ._memory import tree_pss_mb

__all__ = ["StageTiming", "recording", "stage", "listening", "SAMPLE_SECONDS"]

#: How often the tree's memory is read while a recording is on (at least).
SAMPLE_SECONDS = 0.25
#: The sampler waits this many times as long as a reading took (a few percent of a core at most).
SAMPLE_SHARE = 20


@dataclass(frozen=True)
class StageTiming:
    """One stage: its name (``"capture"``, ``"xnnpack: lower"``, ...), wall seconds, and the peak
    memory (MB) while it ran: the largest sampled PSS of the process tree, or this process's own
    high-water RSS if larger; ``started``: seconds after the recording began."""

    name: str
    seconds: float
    peak_mb: float
    started: float


class _Sampler:
    """The tree's PSS every :data:`SAMPLE_SECONDS`, kept as (time, MB) while a recording is on."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._pid = os.getpid()
        self.sample()  # one reading before any stage can end
        self._thread = threading.Thread(target=self._run, name="dualexport-memory", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        took = 0.0
        # reading a large process's smaps costs milliseconds: at most 1/SAMPLE_SHARE of a core
        while not self._stop.wait(max(SAMPLE_SECONDS, took * SAMPLE_SHARE)):
            t = time.perf_counter()
            self.sample()
            took = time.perf_counter() - t

    def sample(self) -> None:
        self.samples.append((time.perf_counter(), tree_pss_mb(self._pid)))

    def peak(self, start: float, end: float) -> float:
        """The largest reading in ``[start, end]``; for a stage shorter than a sampling period,
        the reading just before it ended (stages read nothing themselves: an export has dozens
        and a reading of a large tree costs milliseconds)."""
        samples = list(self.samples)
        inside = [mb for t, mb in samples if start <= t <= end]
        if inside:
            return max(inside)
        before = [mb for t, mb in samples if t <= end]
        return before[-1] if before else 0.0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class _HighWater:
    """This process's peak RSS (MB) inside each open stage, exact: the kernel keeps ``VmHWM``;
    writing ``5`` to ``/proc/self/clear_refs`` resets it to the current RSS. Stages nest and
    overlap (a forked lowering's stage), so each reset first folds the mark reached so far into
    every open stage's peak."""

    def __init__(self) -> None:
        self._open: dict[object, float] = {}
        self._lock = threading.Lock()
        self._works = os.access("/proc/self/clear_refs", os.W_OK)

    @staticmethod
    def _status_mb(field: str) -> float:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
        return 0.0

    def _fold_and_reset(self) -> None:
        mark = self._status_mb("VmHWM:")
        for key, peak in self._open.items():
            self._open[key] = max(peak, mark)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def open(self, key: object) -> None:
        if not self._works:
            return
        with self._lock:
            try:
                self._fold_and_reset()
                self._open[key] = self._status_mb("VmRSS:")
            except OSError:
                self._works = False

    def close(self, key: object) -> float:
        if not self._works:
            return 0.0
        with self._lock:
            try:
                self._fold_and_reset()
            except OSError:
                self._works = False
            return self._open.pop(key, 0.0)


_HIGH_WATER = _HighWater()


class _Recording:
    def __init__(self, origin: float) -> None:
        self.origin = origin
        self.timings: list[StageTiming] = []


_LOCK = threading.Lock()
_RECORDINGS: list[_Recording] = []
_LISTENERS: list[Callable[[str, StageTiming | None], None]] = []
_SAMPLER: list[_Sampler] = []


@contextlib.contextmanager
def recording() -> Iterator[list[StageTiming]]:
    """Collect the stages run in the block into the list it yields (filled as they end)."""
    rec = _Recording(time.perf_counter())
    with _LOCK:
        _RECORDINGS.append(rec)
        if not _SAMPLER and os.path.isdir("/proc"):
            _SAMPLER.append(_Sampler())
    try:
        yield rec.timings
    finally:
        with _LOCK:
            _RECORDINGS.remove(rec)
            sampler = _SAMPLER.pop() if not _RECORDINGS and _SAMPLER else None
        if sampler is not None:
            sampler.stop()


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the block as stage ``name`` for every recording that is on (nothing when none is)."""
    if not _RECORDINGS:
        yield
        return
    for listener in list(_LISTENERS):
        listener(name, None)
    sampler = _SAMPLER[0] if _SAMPLER else None
    key = object()
    _HIGH_WATER.open(key)
    start = time.perf_counter()
    try:
        yield
    finally:
        end = time.perf_counter()
        own = _HIGH_WATER.close(key)
        peak = max(sampler.peak(start, end) if sampler is not None else 0.0, own)
        outer = _RECORDINGS[0].origin if _RECORDINGS else start
        timing = StageTiming(name, end - start, peak, start - outer)
        for rec in list(_RECORDINGS):
            rec.timings.append(timing)
        for listener in list(_LISTENERS):
            listener(name, timing)


@contextlib.contextmanager
def listening(callback: Callable[[str, StageTiming | None], None]) -> Iterator[None]:
    """``callback(name, None)`` as each stage starts and ``callback(name, timing)`` as it ends."""
    _LISTENERS.append(callback)
    try:
        yield
    finally:
        _LISTENERS.remove(callback)
