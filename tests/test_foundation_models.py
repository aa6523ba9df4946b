"""Both artifacts, loaded from disk in their own runtimes, match eager on a handful of models.
Each test reads as stages (export, structure, weights, numerics), like ExecuTorch's XNNPACK tester."""

from __future__ import annotations

import pathlib

import pytest
import torch

import dualexport as dx
from models import MLP, ConvBN, TiedEmbedding, WithNonPersistentBuffer

CASES = {
    "mlp": (MLP, lambda: (torch.randn(4, 16),), 1),
    "conv_bn": (ConvBN, lambda: (torch.randn(2, 3, 8, 8),), 1),
    "non_persistent_buffer": (WithNonPersistentBuffer, lambda: (torch.randn(3, 8),), 1),
    "tied_weights": (TiedEmbedding, lambda: (torch.randint(0, 50, (2, 6)),), None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_artifacts_match_eager(case: str, tmp_path: pathlib.Path) -> None:
    factory, make_args, subgraphs = CASES[case]
    model, args = factory(), make_args()
    eager = model.eval()(*args)

    # stage 1: export both targets from one program
    res = dx.export(model, args, out_dir=tmp_path, name=case)
    assert not res.errors, res.errors
    assert res.artifacts["onnx"].path == tmp_path / f"{case}.onnx"
    assert res.artifacts["xnnpack"].path == tmp_path / f"{case}.pte"

    # stage 2: structure
    d = res.artifacts["xnnpack"].delegation
    assert d.delegated_nodes > 0
    if subgraphs is not None:
        assert d.subgraphs == subgraphs
    assert (tmp_path / f"{case}.weights.json").is_file()

    # stage 3: weights, re-read from disk
    check = res.verify_weights()
    assert check.exact["onnx"] >= 1 and check.entries == len(res.manifest.entries)

    # stage 4: numerics against eager, from the files on disk
    report = dx.compare(res, inputs=[make_args()])
    assert report.ok, report.to_markdown()
    assert set(report.runtimes) == {"onnx", "xnnpack"}
    for o in report.outputs:
        assert o.metrics["onnx"].max_abs <= 1e-4 and o.metrics["xnnpack"].max_abs <= 1e-3
    # the reference is the shared program, which is the eager model
    torch.testing.assert_close(res.program.run_eager(*args), eager)


def test_conv_weight_without_bn_is_found_in_nhwc(tmp_path: pathlib.Path) -> None:
    res = dx.export(ConvBN(), (torch.randn(1, 3, 8, 8),), out_dir=tmp_path, name="cb")
    e = res.manifest.entry("conv2.weight")
    loc = e.locations["xnnpack"]
    assert loc.status == "transformed" and loc.permutation == (0, 2, 3, 1)
    assert e.locations["onnx"].status == "exact"
    fused = res.manifest.entry("conv.weight").locations["xnnpack"]
    assert fused.status == "not_stored" and "BatchNorm" in fused.reason
    assert res.manifest.entry("bn.running_var").locations["onnx"].status == "exact"
