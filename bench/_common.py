"""Shared helpers for benchmarks: repeats with min/median/max, and peak RSS of a child process."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object], repeats: int = 5) -> tuple[float, float, float]:
    """min, median, max wall seconds of ``fn`` over ``repeats`` runs (after one warm-up)."""
    fn()
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return min(samples), statistics.median(samples), max(samples)


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def fmt(t: tuple[float, float, float]) -> str:
    return f"min {t[0] * 1e3:.1f} ms / median {t[1] * 1e3:.1f} ms / max {t[2] * 1e3:.1f} ms"
