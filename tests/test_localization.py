"""A deliberately broken artifact is caught, and localization names the node that was changed."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
import torch

import dualexport as dx
from models import ConvBN


@pytest.fixture(scope="module")
def res(tmp_path_factory: pytest.TempPathFactory) -> dx.ExportResult:
    r = dx.export(ConvBN(), (torch.randn(1, 3, 8, 8),), out_dir=tmp_path_factory.mktemp("loc"), name="cb")
    assert not r.errors
    return r


def test_good_artifacts_have_no_divergence(res: dx.ExportResult) -> None:
    report = dx.compare(res)
    assert report.ok and report.first_divergence == {"onnx": None, "xnnpack": None}


def test_constant_changed_in_onnx_file_is_localized(res: dx.ExportResult) -> None:
    path = res.artifacts["onnx"].path
    model = onnx.load(str(path), load_external_data=False)
    init = next(i for i in model.graph.initializer if i.name == "bn.weight")
    arr = np.frombuffer(init.raw_data, dtype=np.float32).copy()
    arr[2] += 0.5
    init.raw_data = arr.tobytes()
    onnx.save(model, str(path))
    report = dx.compare(res)
    assert not report.ok
    assert report.first_divergence["onnx"] == "batch_norm"
    assert report.first_divergence["xnnpack"] is None
    d = report.divergences["onnx"]
    assert d.op == "aten.batch_norm.default" and "models.py" in (d.source or "")
    assert len(d.curve) >= 3  # the per-layer error curve covers the graph
    with pytest.raises(dx.WeightMismatchError, match="bn.weight"):
        res.verify_weights()


def test_op_swapped_in_one_target_only_is_localized(tmp_path: pathlib.Path) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    r = dx.export(ConvBN(), (torch.randn(1, 3, 8, 8),), out_dir=tmp_path, name="cb")
    dec = r.program.decomposed["xnnpack"]  # a transform applied to the XNNPACK program only
    for n in dec.graph.nodes:
        if n.target == torch.ops.aten.relu.default:
            n.target = torch.ops.aten.sigmoid.default
    dec.graph_module.recompile()
    edge = to_edge_transform_and_lower(dec, partitioner=[XnnpackPartitioner()])
    r.artifacts["xnnpack"].path.write_bytes(edge.to_executorch().buffer)
    report = dx.compare(r)
    assert not report.ok
    assert report.first_divergence == {"onnx": None, "xnnpack": "relu"}
    assert report.divergences["xnnpack"].metrics.max_abs > 0.1
    md = report.to_markdown()
    assert "first divergence" in md and "`relu`" in md
