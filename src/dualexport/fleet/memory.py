"""Memory of a whole process tree: the sum of PSS (proportional set size) over a process and all
its descendants. PSS splits a page shared by k processes into k parts, so the sum is the
physical memory the tree holds: a child forked from the fork server (or an export's forked
smoke run) is not charged again for the pages it shares with its parent, which VmRSS/VmHWM of
each process would count once per process. The local engine's admission charges running
entries by it; the benchmarks sample it."""

from __future__ import annotations

import os
import threading
import time
from types import TracebackType

from .._memory import pss_mb, tree, tree_pss_mb

__all__ = ["TreeSampler", "pss_mb", "tree", "tree_pss_mb"]


class TreeSampler:
    """Samples :func:`tree_pss_mb` of ``pid`` every ``interval`` seconds in a thread; ``peak``
    and ``peak_processes`` (how many were alive at the peak) once the block exits."""

    def __init__(self, pid: int | None = None, interval: float = 0.05) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.interval = interval
        self.peak = 0.0
        self.peak_processes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = tree(self.pid)
            total = sum(pss_mb(p) for p in pids)
            self.samples += 1
            if total > self.peak:
                self.peak, self.peak_processes = total, len(pids)
            time.sleep(self.interval)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
