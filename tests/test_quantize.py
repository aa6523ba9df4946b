"""quantize="int8": PT2E static per-channel quantization applied once to the shared program; the
ONNX model (QuantizeLinear/DequantizeLinear) and the fully delegated .pte carry the same scales
and zero points and agree with the quantized eager reference within one quantization step."""

from __future__ import annotations

import pathlib
import struct

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import dualexport as dx
from models import MLP, ConvBN


def _calibration(shape: tuple[int, ...], n: int = 8) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(*shape, generator=g),) for _ in range(n)]


@pytest.fixture(scope="module", params=["mlp", "conv"])
def qres(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dx.ExportResult:
    model, shape = (MLP(), (4, 16)) if request.param == "mlp" else (ConvBN(), (1, 3, 8, 8))
    res = dx.export(
        model,
        (torch.randn(*shape),),
        out_dir=tmp_path_factory.mktemp("q"),
        name="q",
        quantize="int8",
        calibration=_calibration(shape),
    )
    assert not res.errors, res.errors
    return res


def test_one_quantized_program_feeds_both_targets(qres: dx.ExportResult) -> None:
    ep = qres.program.exported_program
    assert any("quantize_per_tensor" in str(n.target) for n in ep.graph.nodes)
    assert qres.program.transforms[-1].name.startswith("pt2e-int8")
    ops = {n.op_type for n in onnx.load(str(qres.artifacts["onnx"].path)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    d = qres.artifacts["xnnpack"].delegation
    assert d.subgraphs == 1 and d.non_delegated_ops() == ("getitem",)  # fully delegated


def test_scales_and_zero_points_are_the_same_in_both_artifacts(qres: dx.ExportResult) -> None:
    qres.verify_weights()
    scales = [e for e in qres.manifest.entries if e.name.startswith("_scale")]
    zps = [e for e in qres.manifest.entries if e.name.startswith("_zero_point")]
    assert scales and zps
    for e in scales:  # per-channel weight scales, bit for bit in both files
        assert e.locations["onnx"].status == "exact"
        assert e.locations["xnnpack"].status == "exact", e.locations["xnnpack"]
    for e in zps:  # symmetric: ONNX stores them, XNNPACK encodes the all-zero case implicitly
        assert e.locations["onnx"].status == "exact"
        assert e.locations["xnnpack"].status == "not_stored"
        assert not bool(qres.program.state_dict.get(e.name, qres.program.constants.get(e.name)).any())
    int8 = [e for e in qres.manifest.entries if e.dtype == "int8"]
    assert int8 and all(e.locations["onnx"].status == "exact" for e in int8)
    assert all(e.locations["xnnpack"].status in ("exact", "transformed") for e in int8)


def test_activation_scales_are_in_both_artifacts(qres: dx.ExportResult) -> None:
    ep = qres.program.exported_program
    act = {float(n.args[1]) for n in ep.graph.nodes if "quantize_per_tensor" in str(n.target)}
    model = onnx.load(str(qres.artifacts["onnx"].path))
    consts = {}
    for n in model.graph.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    for i in model.graph.initializer:
        consts[i.name] = numpy_helper.to_array(i)
    onnx_scales = {
        float(np.float32(consts[n.input[1]]))
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" and n.input[1] in consts
    }
    pte = qres.artifacts["xnnpack"].path.read_bytes()
    for s in act:
        assert float(np.float32(s)) in onnx_scales
        assert struct.pack("<f", s) in pte


def test_within_one_quantization_step_of_quantized_eager(qres: dx.ExportResult) -> None:
    shape = tuple(qres.program.example_args[0].shape)
    report = dx.compare(qres, inputs=_calibration(shape, 3))
    assert report.ok, report.to_markdown()
    for o in report.outputs:
        for rt in ("onnx", "xnnpack"):
            tol = o.tolerance[rt]
            assert tol.rtol == 0 and "quantization step" in tol.source
            assert o.metrics[rt].max_abs <= tol.atol


def test_quantize_needs_calibration(tmp_path: pathlib.Path) -> None:
    with pytest.raises(dx.InputError, match="calibration"):
        dx.export(MLP(), (torch.randn(2, 16),), out_dir=tmp_path, quantize="int8")
