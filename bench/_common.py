"""Shared helpers for benchmarks: repeats with min/median/max, and peak RSS of a child process."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object], repeats: int = 5) -> tuple[float, float, float]:
    """min, median, max wall seconds of ``fn`` over ``repeats`` runs (after one warm-up)."""
    return samples(fn, repeats, warmup=True)


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def fmt(t: tuple[float, float, float]) -> str:
    """Per-call latency in ms, or in µs when the median is under a millisecond (tiny BERT)."""
    scale, unit = (1e6, "µs") if t[1] < 1e-3 else (1e3, "ms")
    return f"min {t[0] * scale:.1f} {unit} / median {t[1] * scale:.1f} {unit} / max {t[2] * scale:.1f} {unit}"


def samples(fn: Callable[[], object], repeats: int = 3, warmup: bool = False) -> tuple[float, float, float]:
    """min, median, max wall seconds over ``repeats`` runs; no warm-up by default, for phases
    (export, lowering) that are too slow to run an extra time on 2 cores."""
    if warmup:
        fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out), statistics.median(out), max(out)


def ratio(ours: tuple[float, float, float], plain: tuple[float, float, float]) -> str:
    """``ours / plain`` as median (min, max): the ratio printed by every benchmark."""
    return f"median {ours[1] / plain[1]:.2f}x (min {ours[0] / plain[0]:.2f}x, max {ours[2] / plain[2]:.2f}x)"


def fmt_s(t: tuple[float, float, float]) -> str:
    return f"min {t[0]:.2f} s / median {t[1]:.2f} s / max {t[2]:.2f} s"


def quiet() -> None:
    """Silence library warnings and log chatter so the printed figures stay readable."""
    import logging
    import os
    import warnings

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
