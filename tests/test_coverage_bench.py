"""A few architectures of bench/bench_coverage.py, as users build them (SDPA, padding masks,
serving-style dynamic shapes), against the issue's bar: each one XNNPACK subgraph, delegated
share over compute ops at least 95% static and 90% dynamic, both targets matching eager (on every
declared range's min, max-1 and max) and the weight proof passing. The whole sweep (46
architectures, with the plain libraries and latency) is the bench; these run in ``make
test-slow``."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))

pytestmark = pytest.mark.slow

#: (architecture, whether its dynamic shapes are checked too): BERT and ModernBERT with batch and
#: sequence dynamic (per-head attention, xnnpack_heads.py; ModernBERT's fused q/k/v projection and
#: rotary embeddings, xnnpack_head_inputs.py); Swin with a dynamic batch (window masks with a
#: learned bias: xnnpack_masked_rows.py and the batch-shared mask) and BLOOM with a dynamic
#: sequence (alibi scores viewed with a (s**2)//s key length: graph_edit.same_size)
CASES = [
    ("llama", True),
    ("vit", True),
    ("bert", True),
    ("modernbert", True),
    ("swin", True),
    ("bloom", True),
]


def _assert_export(row: dict[str, Any], share: float, label: str) -> None:
    assert "error" not in row, row
    assert not row["errors"], row["errors"]
    assert row["weights"], row.get("weights_error")
    assert row["parity"] == {"onnx": True, "xnnpack": True}, row
    d = row["xnnpack"]
    assert d["subgraphs"] == 1, (label, d)
    assert d["share"] >= share, (label, d)
    assert row["ref_std"] > 1e-3  # the comparison is not vacuous


@pytest.mark.parametrize(("name", "dynamic_ok"), CASES, ids=[c[0] for c in CASES])
def test_architecture_meets_the_bar(name: str, dynamic_ok: bool) -> None:
    from bench_coverage import run_one

    result = run_one(name, "test", dx_only=True, kinds=("static", "dynamic") if dynamic_ok else ("static",))
    _assert_export(result["dx_static"], 0.95, f"{name} static")
    if dynamic_ok:
        _assert_export(result["dx_dynamic"], 0.90, f"{name} dynamic ({result['dynamic']})")
