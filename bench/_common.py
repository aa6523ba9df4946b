"""Shared helpers for benchmarks: repeats with min/median/max, and peak RSS of a child process."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


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


def greedy_timing(session: Any, prompt: list[int], new: int) -> tuple[float, list[float], list[int]]:
    """A decoder session (``step(ids) -> logits``, ``reset()``): after a short warm-up, the
    seconds of the prompt's prefill, of each single-token greedy step, and the tokens."""
    session.step(prompt[:4])
    session.reset()
    t0 = time.perf_counter()
    logits = session.step(prompt)[-1]
    prefill = time.perf_counter() - t0
    tokens, steps = [], []
    for _ in range(new):
        tokens.append(int(logits.argmax()))
        t = time.perf_counter()
        logits = session.step([tokens[-1]])[-1]
        steps.append(time.perf_counter() - t)
    return prefill, steps, tokens


def add_decoder_args(ap: Any) -> None:
    """The decoder benchmarks' common options: SmolLM2-135M's depth, the cache and the run."""
    ap.add_argument("--layers", type=int, default=30, help="layers (each of the model's shape)")
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    ap.add_argument("--new", type=int, default=64, help="greedy tokens after the prompt")
    ap.add_argument("--out", default=None, help="keep the files here")
