"""Stage timings (``dualexport._stages``): each stage's peak memory includes a spike shorter
than a sampling period (this process's own high-water mark), and nested stages each get theirs."""

from __future__ import annotations

import os
import time

import pytest
import torch

from dualexport._stages import SAMPLE_SECONDS, recording, stage

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def test_a_short_spike_is_in_its_stage_and_the_stages_around_it_only() -> None:
    """The stage's peak is at least this process's own high-water mark inside it (the sampled
    tree PSS may be larger: a pytest worker's tree holds other processes)."""
    from dualexport._stages import _HighWater

    spike_mb = 300
    with recording() as timings:
        with stage("outer"):
            with stage("before"):
                time.sleep(0.01)
            rss_before = _rss_mb()
            with stage("spike"):
                t0 = time.perf_counter()
                x = torch.ones(spike_mb * 2**20 // 4)  # written: resident, then freed
                del x
                assert time.perf_counter() - t0 < SAMPLE_SECONDS  # shorter than a sampling period
    peak = {t.name: t.peak_mb for t in timings}
    assert set(peak) == {"outer", "before", "spike"}
    assert peak["spike"] >= rss_before + 0.9 * spike_mb
    assert peak["outer"] >= peak["spike"]
    # the mark is reset as a stage opens: a stage after the spike does not carry it
    marks = _HighWater()
    marks.open("after")
    time.sleep(0.01)
    assert marks.close("after") < rss_before + 0.5 * spike_mb
