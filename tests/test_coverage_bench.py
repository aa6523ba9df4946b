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

#: (architecture, static bar, dynamic bar): BERT and ModernBERT with batch and sequence dynamic
#: (per-head attention, xnnpack_heads.py; ModernBERT's fused q/k/v projection and rotary
#: embeddings, xnnpack_head_inputs.py); Swin with a dynamic batch (window masks with a learned
#: bias: xnnpack_masked_rows.py and the batch-shared mask); BLOOM with a dynamic sequence (alibi
#: scores viewed with a (s**2)//s key length: graph_edit.same_size); RoBERTa, whose position ids
#: (a cumsum over the mask) and token-type lookup of a zero buffer (passes/lookups.py) keep its
#: share at 91% rather than 95%: its bar is the issue's floor for any one architecture, 85%, plus
#: what it measures now less noise
CASES = [
    ("llama", 0.95, 0.90),
    ("vit", 0.95, 0.90),
    ("bert", 0.95, 0.90),
    ("modernbert", 0.95, 0.90),
    ("swin", 0.95, 0.90),
    ("bloom", 0.95, 0.90),
    ("roberta", 0.90, 0.90),
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


@pytest.mark.parametrize(("name", "static_bar", "dynamic_bar"), CASES, ids=[c[0] for c in CASES])
def test_architecture_meets_the_bar(name: str, static_bar: float, dynamic_bar: float) -> None:
    from bench_coverage import run_one

    result = run_one(name, "test", dx_only=True, kinds=("static", "dynamic"))
    _assert_export(result["dx_static"], static_bar, f"{name} static")
    _assert_export(result["dx_dynamic"], dynamic_bar, f"{name} dynamic ({result['dynamic']})")
