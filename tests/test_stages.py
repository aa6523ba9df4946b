"""Stage timings (``dualexport._stages``): each stage's peak memory includes a spike shorter
than a sampling period (this process's own high-water mark), and nested stages each get theirs."""

from __future__ import annotations

import os
import time

import pytest
import torch

from dualexport._stages import SAMPLE_SECONDS, recording, stage

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")


def test_a_short_spike_is_in_its_stage_and_the_stages_around_it_only() -> None:
    spike_mb = 300
    with recording() as timings:
        with stage("outer"):
            with stage("before"):
                time.sleep(0.01)
            with stage("spike"):
                t0 = time.perf_counter()
                x = torch.ones(spike_mb * 2**20 // 4)  # written: resident, then freed
                del x
                assert time.perf_counter() - t0 < SAMPLE_SECONDS  # shorter than a sampling period
            with stage("after"):
                time.sleep(0.01)
    peak = {t.name: t.peak_mb for t in timings}
    assert set(peak) == {"outer", "before", "spike", "after"}
    assert peak["spike"] >= peak["before"] + 0.9 * spike_mb
    assert peak["outer"] >= peak["spike"]
    assert peak["after"] < peak["spike"] - 0.5 * spike_mb  # the mark was reset when the spike ended
