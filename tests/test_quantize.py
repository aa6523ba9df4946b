"""quantize="int8": PT2E static per-channel quantization applied once to the shared program; the
ONNX model (QuantizeLinear/DequantizeLinear) and the fully delegated .pte carry the same scales
and zero points and agree with the quantized eager reference within one quantization step."""

from __future__ import annotations

import json
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


# ---------------------------------------------------------------- what int8 parity means
def test_many_steps_inside_the_quantization_noise_pass_and_a_wrong_scale_fails() -> None:
    """Known answers: an output several steps off in places (a deep network's compounded 1-LSB
    roundings) passes when the runtime is still inside the reference's own quantization noise;
    a doubled scale does not, whatever the reference noise."""
    from dualexport.parity.tolerances import quantized_tolerance

    g = torch.Generator().manual_seed(0)
    step = 0.02
    ref = torch.round(torch.randn(4, 1000, generator=g) * 2 / step) * step  # int8-valued logits
    rounding = ref.clone()
    idx = torch.randint(0, ref.numel(), (200,), generator=g)
    rounding.view(-1)[idx] += step * torch.randint(-3, 4, (200,), generator=g).float()  # up to 3 steps
    tol = quantized_tolerance(step, reference_snr_db=25.0)
    assert not quantized_tolerance(step, reference_snr_db=None).judge(rounding * 1.3, ref).ok
    m = tol.judge(rounding, ref)
    assert m.max_abs > 2 * step and m.ok, m  # several steps, inside the noise
    assert not tol.judge(ref * 2, ref).ok  # a wrong scale
    assert not tol.judge(ref + 20 * step, ref).ok  # a wrong zero point (20 levels)


def _planted(qres: dx.ExportResult, what: str) -> str:
    """Edit the .onnx on disk: double the scale, or shift the zero point by 20 levels, of the
    second convolution's weight dequantize (a parameter only that node reads; an activation's
    scale is shared by its quantize and dequantize, and doubling both is only coarser rounding);
    return the name of the value the edit changes."""
    path = qres.artifacts["onnx"].path
    model = onnx.load(str(path))
    values = {i.name: i for i in model.graph.initializer}
    consts = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant"}
    node = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and "per_channel" in n.name][1]
    name = node.input[1 if what == "scale" else 2]
    if name in consts or name not in values:  # the zero point is a Cast of the stored int64 tensor
        cast = next((n for n in model.graph.node if name in n.output and n.op_type == "Cast"), None)
        name = cast.input[0] if cast is not None else name

    def edit(arr: np.ndarray) -> np.ndarray:
        return arr * 2 if what == "scale" else (arr.astype(np.int32) + 20).astype(arr.dtype)

    if name in values:
        values[name].CopyFrom(numpy_helper.from_array(edit(numpy_helper.to_array(values[name])), name))
    else:
        t = consts[name].attribute[0].t
        t.CopyFrom(numpy_helper.from_array(edit(numpy_helper.to_array(t)), name))
    onnx.save(model, str(path))
    return node.output[0]


@pytest.mark.parametrize("what", ["scale", pytest.param("zero_point", marks=pytest.mark.slow)])
def test_planted_wrong_quantization_parameter_fails_and_is_localized(
    what: str, tmp_path: pathlib.Path
) -> None:
    torch.manual_seed(0)
    model = ConvBN().eval()
    shape = (1, 3, 8, 8)
    res = dx.export(
        model,
        (torch.randn(*shape),),
        out_dir=tmp_path,
        name="q",
        cache=False,
        quantize="int8",
        calibration=_calibration(shape),
    )
    assert dx.compare(res).ok
    assert (tmp_path / "q.float.pt2").is_file()  # the float model the noise is measured against
    changed = _planted(res, what)
    report = dx.compare(res)
    assert not report.ok
    assert report.first_divergence["xnnpack"] is None
    assert report.first_divergence["onnx"] == changed, (report.first_divergence, changed)


def test_int8_parity_from_disk_uses_the_saved_float_model(qres: dx.ExportResult) -> None:
    from dualexport.parity.folder import compare_dir

    report, _, werr, _ = compare_dir(qres.out_dir)
    assert werr is None and report.ok
    assert any("quantization noise" in t.source for o in report.outputs for t in o.tolerance.values())


@pytest.mark.slow  # a fresh interpreter: ~12 s
def test_a_process_whose_first_export_was_float_still_exports_int8(tmp_path: pathlib.Path) -> None:
    """A reused worker (a Ray worker runs many entries): a float export first builds torch.onnx's
    translation table, then an int8 export in the same process must still find the
    quantized_decomposed translations (found on a two-node Ray cluster; the local engine's
    fork server hid it by importing ExecuTorch first)."""
    import subprocess
    import sys

    code = f"""
import torch, dualexport as dx
from models import MLP
x = (torch.randn(4, 16),)
dx.export(MLP(), x, out_dir={str(tmp_path / "f")!r}, name="f", target="onnx", cache=False)
cal = [(torch.randn(4, 16, generator=torch.Generator().manual_seed(i)),) for i in range(4)]
r = dx.export(MLP(), x, out_dir={str(tmp_path / "q")!r}, name="q", target="onnx", cache=False,
              quantize="int8", calibration=cal)
assert not r.errors and "onnx" in r.artifacts, r.errors
"""
    tests = str(pathlib.Path(__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tests, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_int8_dynamic_from_the_cli_shares_codes_and_fuses_in_onnx_runtime(tmp_path: pathlib.Path) -> None:
    """``--quantize int8-dynamic``: no calibration; the int8 codes and scales are the same bytes in
    both files (the weight proof), ONNX Runtime fuses the ONNX form into its integer kernels, and
    both files agree with the quantized program (compare DIR exits 0)."""
    import onnxruntime as ort

    from dualexport.cli import main

    out = tmp_path / "dyn"
    argv = ["export", "dualexport.examples:TinyMLP", "--input", "4x16", "--out", str(out), "--name", "m"]
    assert main([*argv, "--quantize", "int8-dynamic"]) == 0
    assert main(["compare", str(out)]) == 0
    manifest = json.loads((out / "m.weights.json").read_text())
    int8 = [e for e in manifest["entries"] if e["dtype"] == "int8"]
    assert int8, manifest["entries"]
    for e in int8:
        assert {c["status"] for c in e["copies"]["onnx"]} == {"exact"}, e
        assert {c["status"] for c in e["copies"]["xnnpack"]} <= {"exact", "transformed"}, e
    model = onnx.load(str(out / "m.onnx"))
    ops = {n.op_type for n in model.graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops and "QuantizeLinear" not in ops
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(out / "m.onnx"), options, providers=["CPUExecutionProvider"])
    fused = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    linears = sum(n.op_type == "MatMulInteger" for n in model.graph.node)
    assert fused.count("DynamicQuantizeMatMul") + fused.count("MatMulIntegerToFloat") == linears, fused


def test_the_report_shows_each_file_against_the_float_model(qres: dx.ExportResult) -> None:
    """What a user asks first about an int8 file: how close is it to the float model? The
    quantized reference and both files, with cosine and (scores on the last axis) top-1
    agreement; in the JSON and on the page, and not part of the verdict."""
    report = dx.compare(qres)
    assert report.ok
    for o in report.outputs:
        assert set(o.against_float) == {"eager", "onnx", "xnnpack"}, o.against_float
        ref = o.against_float["eager"]
        for rt in ("onnx", "xnnpack"):
            a = o.against_float[rt]
            assert 0.9 < a.cosine <= 1.0 + 1e-9 and abs(a.snr_db - ref.snr_db) < 6.0, (rt, a, ref)
            assert a.top1 is not None and 0.0 <= a.top1 <= 1.0
    payload = report.to_dict()["outputs"][0]["against_float"]
    assert set(payload) == {"eager", "onnx", "xnnpack"} and "top1" in payload["onnx"]
    from dualexport.parity.html import render_html

    page = render_html(report)
    assert "Against the float model" in page and "top-1 agreement" in page


def test_the_manifest_and_the_page_list_what_stayed_in_float(qres: dx.ExportResult) -> None:
    """The scheme and what the quantizer left in float (op, reason, count) are recorded in the
    manifest on disk and shown on the export page."""
    from dualexport.reporting.export_page import render_export_page

    on_disk = json.loads((qres.out_dir / f"{qres.name}.weights.json").read_text())
    record = on_disk["program"]["quantization"]
    assert record == json.loads(json.dumps(qres.manifest.program["quantization"]))
    assert record["scheme"] == "int8" and record["quantized_ops"], record
    assert isinstance(record["float_ops"], list) and isinstance(record["integer_ops"], int)
    for f in record["float_ops"]:
        assert {"op", "reason", "count"} <= set(f), f
    page = render_export_page(qres)
    assert "Quantization: int8" in page and "Integer computations" in page


def test_an_elementwise_op_with_a_constant_operand_stays_in_float() -> None:
    """RMSNorm's gain (all ones at init) times the normalized activation: observed as an
    activation, a constant's per-tensor scale degenerates (1/255 with zero point 0 clips the gain
    to 0.5) and XNNPACK's static mul computed yet another value (a tiny Llama's static int8 .pte
    at cosine 0.76 against its own program). The quantizer leaves such ops in float and says why;
    the activation-by-activation mul beside it is still quantized."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from dualexport.shared_state.quantizer import make_quantizer

    class Norm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)
            self.gain = torch.nn.Parameter(torch.ones(16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.lin(x)
            return self.gain * h + h * torch.sigmoid(h)

    x = torch.randn(2, 16)
    module = torch.export.export(Norm().eval(), (x,), strict=False).module()
    quantizer = make_quantizer(dynamic=False, weight_qmax=127, scan_sets=[(x,)])
    prepared = prepare_pt2e(module, quantizer)
    reasons = quantizer.reasons()
    muls = [n for n in prepared.graph.nodes if n.target == torch.ops.aten.mul.Tensor]
    with_constant = [n for n in muls if any(a.op == "get_attr" for a in n.all_input_nodes)]
    assert len(with_constant) == 1 and "constant operand" in reasons[with_constant[0].name], reasons
    others = [n for n in muls if n not in with_constant]
    assert others and all(n.name not in reasons for n in others)
    assert all("activation_post_process" in u.name for n in others for u in n.users)  # observed
