"""Self-test bundles for the device: ``export(bundle=True)`` writes ``<name>.bpte`` (ExecuTorch's
BundledProgram) and ``<name>_onnx_tests/test_data_set_N/`` (the layout onnx_test_runner reads),
listed with their hashes in the manifest; ``dualexport selftest DIR`` runs both from disk.

Stages: export with bundles -> files and manifest records -> selftest passes (exit 0) with a row
per set, output and runtime -> an altered expected output fails (exit 1) and names the output ->
the same with the weights in a .ptd -> a stateful model is refused before any lowering.
"""

from __future__ import annotations

import json
import pathlib

import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import dualexport as dx
from dualexport.cli import EXIT_CHECK_FAILED, EXIT_OK, main
from dualexport.parity.selftest import run_selftest


def _model() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10)
    )
    m.train()
    with torch.no_grad():
        m(torch.randn(4, 3, 8, 8))
    return m.eval(), (torch.randn(1, 3, 8, 8),)


@pytest.fixture(params=["inline", "ptd"])
def bundled(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> dx.ExportResult:
    model, args = _model()
    options = dx.ExportOptions(xnnpack_external_data=request.param == "ptd")
    res = dx.export(model, args, out_dir=tmp_path, name="m", cache=False, bundle=True, options=options)
    assert not res.errors
    return res


def test_bundles_are_written_and_listed_with_their_hashes(bundled: dx.ExportResult) -> None:
    out = bundled.out_dir
    assert (out / "m.bpte").is_file()
    tests = out / "m_onnx_tests"
    assert (tests / "m.onnx").is_file() and (tests / "test_data_set_0" / "input_0.pb").is_file()
    assert sorted(p.name for p in tests.iterdir() if p.is_dir()) == [
        "test_data_set_0",
        "test_data_set_1",
        "test_data_set_2",
    ]
    manifest = json.loads((out / "m.weights.json").read_text())
    assert len(manifest["artifacts"]["xnnpack"]["bundle"]["sha256"]) == 64
    assert manifest["artifacts"]["onnx"]["bundle"]["sets"] == ["example", "seed0", "seed1"]
    assert len(manifest["artifacts"]["onnx"]["bundle"]["files"]) == 6  # 3 sets x (input, output)


def test_selftest_passes_on_the_files_as_written(bundled: dx.ExportResult, capsys) -> None:  # type: ignore[no-untyped-def]
    report, name = run_selftest(bundled.out_dir)
    assert name == "m" and report.ok, report.to_markdown()
    rows = {(o.label, rt) for o in report.outputs for rt in o.metrics}
    assert len(rows) == 6  # 3 sets x 2 runtimes, one output each
    assert all(m.snr_db > 60 for o in report.outputs for m in o.metrics.values())
    assert main(["selftest", str(bundled.out_dir)]) == EXIT_OK


def test_an_altered_expected_output_fails_and_is_named(bundled: dx.ExportResult, capsys) -> None:  # type: ignore[no-untyped-def]
    out = bundled.out_dir
    # the ONNX set: one expected logit moved
    pb = out / "m_onnx_tests" / "test_data_set_1" / "output_0.pb"
    t = onnx.TensorProto()
    t.ParseFromString(pb.read_bytes())
    arr = numpy_helper.to_array(t).copy()
    arr[0, 3] += 1.0
    pb.write_bytes(numpy_helper.from_array(arr, t.name).SerializeToString())
    # the ExecuTorch bundle: rewritten with one expected output moved
    from dualexport.pipeline.bundles import _write_bpte, bundle_sets
    from dualexport.shared_state.contract import flatten_inputs

    shared = bundled.program
    example = flatten_inputs(shared.exported_program, shared.example_args, shared.example_kwargs)
    cases = bundle_sets(shared, example)
    label, ins, outs = cases[2]
    cases[2] = (label, ins, [outs[0] + 0.5])
    _write_bpte(out / "m.pte", out / "m.bpte", cases)

    assert main(["selftest", str(out)]) == EXIT_CHECK_FAILED
    printed = capsys.readouterr().out
    assert "onnx: bundle:seed0/out0 differs" in printed
    assert "xnnpack: bundle:seed1/out0 differs" in printed
    report, _ = run_selftest(out)
    bad = {(o.label, rt) for o in report.outputs for rt, m in o.metrics.items() if not m.ok}
    assert bad == {("bundle:seed0/out0", "onnx"), ("bundle:seed1/out0", "xnnpack")}


@pytest.mark.slow  # int8 parity itself: tests/test_quantize.py (default run)
def test_int8_bundles_carry_the_quantized_tolerance(tmp_path: pathlib.Path) -> None:
    """An int8 program's bundles are judged as ``dx.compare`` judges it (one quantization step,
    or the SNR cap without a float model): ONNX Runtime requantizes with its own rounding, so
    with the float tolerance its selftest failed an export whose compare passed."""
    model, args = _model()
    g = torch.Generator().manual_seed(3)
    cal = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(8)]
    res = dx.export(model, args, out_dir=tmp_path, name="q", quantize="int8", calibration=cal, bundle=True)
    assert not res.errors and dx.compare(res).ok
    artifacts = json.loads((tmp_path / "q.weights.json").read_text())["artifacts"]
    for target in ("onnx", "xnnpack"):
        (tol,) = artifacts[target]["bundle"]["tolerances"]
        assert tol["or_snr_db"] is not None and "quantization step" in tol["source"]
    report, _ = run_selftest(tmp_path)
    assert report.ok, report.to_markdown()
    assert main(["selftest", str(tmp_path)]) == EXIT_OK


def test_a_stateful_model_is_refused_before_lowering(tmp_path: pathlib.Path) -> None:
    from zoo.models import BufferCounter

    with pytest.raises(dx.InputError, match="bundle=True needs a stateless program"):
        dx.export(BufferCounter(), (torch.randn(2, 4),), out_dir=tmp_path, name="m", bundle=True)
    assert not list(tmp_path.glob("m.*"))
