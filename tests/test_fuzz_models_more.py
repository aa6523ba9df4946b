"""Issue 48's fuzz of models, the second half of ``make test-slow``'s 1000 examples (a file of its
own so that the two workers, which take a test file each, share them)."""

from __future__ import annotations

import pathlib

import pytest

from fuzz_models import explore


@pytest.mark.slow
@pytest.mark.parametrize("shard", [3, 4])
def test_fuzz_models_many(tmp_path: pathlib.Path, shard: int) -> None:
    outcomes = explore(tmp_path, 250, seed=shard)
    assert len(outcomes) >= 250
    assert outcomes.count("exported") >= 200, outcomes
