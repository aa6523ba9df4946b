"""The declared dynamic range travels with both files, and both runtimes (through dualexport's
runners) refuse inputs outside it with an error naming the dim, instead of ONNX Runtime running
any size and ExecuTorch running sizes below the minimum."""

from __future__ import annotations

import json
import pathlib

import onnx
import pytest
import torch
from torch import nn

import dualexport as dx
from dualexport.runtimes import open_runner


@pytest.fixture(scope="module")
def res(tmp_path_factory: pytest.TempPathFactory) -> dx.ExportResult:
    b = torch.export.Dim("b", min=2, max=8)
    r = dx.export(
        nn.Linear(8, 4),
        (torch.randn(4, 8),),
        out_dir=tmp_path_factory.mktemp("dyn"),
        name="lin",
        dynamic_shapes=({0: b},),
    )
    assert not r.errors
    return r


def test_ranges_are_recorded_in_the_onnx_file(res: dx.ExportResult) -> None:
    meta = {p.key: p.value for p in onnx.load(str(res.artifacts["onnx"].path)).metadata_props}
    assert json.loads(meta["dualexport.input_ranges"]) == [{"dtype": "float32", "dims": [[2, 8], 8]}]


@pytest.mark.parametrize("target", ["onnx", "xnnpack"])
@pytest.mark.parametrize("batch", [1, 9, 64])
def test_out_of_range_is_refused_by_both_runtimes(res: dx.ExportResult, target: str, batch: int) -> None:
    runner = open_runner(target, res.artifacts[target].path)
    with pytest.raises(dx.InputError, match=rf"dim 0 is {batch}, outside the exported range \[2, 8\]"):
        runner.run([torch.randn(batch, 8)])


@pytest.mark.parametrize("target", ["onnx", "xnnpack"])
def test_min_mid_max_run_and_match(res: dx.ExportResult, target: str) -> None:
    runner = open_runner(target, res.artifacts[target].path)
    for batch in (2, 5, 8):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(runner.run([x])[0], res.program.run_eager(x), rtol=1e-3, atol=1e-3)


def test_static_dim_mismatch_is_refused(res: dx.ExportResult, tmp_path: pathlib.Path) -> None:
    runner = open_runner("onnx", res.artifacts["onnx"].path)
    with pytest.raises(dx.InputError, match="exported static at 8"):
        runner.run([torch.randn(4, 7)])
