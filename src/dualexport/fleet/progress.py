"""What a batch tells its caller while it runs (the CLI draws it with rich; a library caller may
log it or ignore it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .record import EntryRecord

__all__ = ["BatchEvent", "ProgressCallback", "Tally"]


@dataclass(frozen=True)
class BatchEvent:
    """``kind``: ``start`` (an entry was admitted), ``phase`` (it entered ``phase``), ``retry`` (its
    worker died and it runs again) or ``done`` (``record`` is its result)."""

    kind: str
    name: str
    total: int
    done: int
    running: int
    failed: int
    elapsed: float
    phase: str | None = None
    record: EntryRecord | None = None

    @property
    def eta(self) -> float | None:
        """Seconds left at the pace so far (None before the first entry finished)."""
        if not self.done:
            return None
        return self.elapsed / self.done * (self.total - self.done)


ProgressCallback = Callable[[BatchEvent], None]


class Tally:
    """Counts for events: how many entries are done, running and failed."""

    def __init__(self, total: int, started: float) -> None:
        self.total, self.started = total, started
        self.done = self.running = self.failed = 0

    def event(self, kind: str, name: str, now: float, **kw: object) -> BatchEvent:
        return BatchEvent(
            kind,
            name,
            self.total,
            self.done,
            self.running,
            self.failed,
            now - self.started,
            **kw,  # type: ignore[arg-type]
        )
