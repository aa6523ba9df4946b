"""A child process's CPU time, to tell a slow child from a stuck one.

Why CPU time and not a deadline: a lowering or a runtime run of a large model may take many
minutes, but it keeps using CPU; a child that uses none for a long while is deadlocked (libgomp
after a fork, a runtime waiting on a lock its dead thread held) and will never answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["cpu_ticks", "StallWatch"]


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` in clock ticks (Linux /proc), or None when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


class StallWatch:
    """``stalled()`` is True once ``pid`` has used no CPU for ``seconds`` (progress seen by the
    caller, e.g. bytes received, resets it with ``progress()``)."""

    def __init__(self, pid: int, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.pid, self.seconds, self._clock = pid, seconds, clock
        self._ticks, self._since = cpu_ticks(pid), clock()

    def progress(self) -> None:
        self._since = self._clock()

    def stalled(self) -> bool:
        ticks = cpu_ticks(self.pid)
        if ticks != self._ticks:
            self._ticks, self._since = ticks, self._clock()
            return False
        return self._clock() - self._since > self.seconds
