"""int8 on every family people quantize, built as users get them (transformers' default SDPA
attention, tiny configs, random seeded weights, called as the model cards show): a decoder, an
encoder with a padding mask, a ViT, a Swin (window indices), a speech encoder and a CNN, each
static (calibrated) and dynamic (``int8-dynamic``), both targets.

Each export is checked for what a user relies on: both files published (the export's own proof
judged each file against the quantized program at its example), ``dx.compare`` passes by the
int8 criterion (parity/tolerances.py ``quantized_tolerance``), the int8 weight codes are the same
bytes in both files and in the program (the weight proof), the integer computations (masks,
positions, indices) were left alone, what stayed in float is recorded, and each file is as
close to the float model as the quantized reference is. A planted wrong scale in a transformer
fails and is localized; plain PT2E's failure on the same models is a strict xfail.

All slow (an int8 transformer export is 30-60 s on 2 cores); the default run keeps the MLP/CNN
cases of test_quantize.py and the CLI's int8-dynamic case.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import dualexport as dx
from dualexport.loading.models import hf_model, outputs_constant, settle_batchnorm
from zoo.hf import HF_CASES

pytestmark = pytest.mark.slow

#: the zoo's tiny configs (tests/zoo/hf.py), built as users get them; Swin, which the zoo has only
#: from torchvision, from a config here
_ZOO = {c.name: c for c in HF_CASES}


def _zoo_inputs(name: str) -> Callable[[int], tuple[torch.Tensor, ...]]:
    """The zoo case's input maker, seeded (calibration sets must differ from the example)."""

    def make(seed: int) -> tuple[torch.Tensor, ...]:
        torch.manual_seed(seed)
        return tuple(_ZOO[name].inputs()[0])

    return make


def _image(seed: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed)),)


def _settled_resnet() -> torch.nn.Module:
    """BatchNorm statistics from a few batches: with the defaults, parity on random weights is vacuous."""
    return settle_batchnorm(_ZOO["hf_resnet"].factory(), [_image(100 + i) for i in range(4)])


#: family -> (model factory, input maker)
FAMILIES: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[int], tuple[torch.Tensor, ...]]]] = {
    "decoder": (_ZOO["hf_llama"].factory, _zoo_inputs("hf_llama")),
    "encoder_mask": (_ZOO["hf_bert"].factory, _zoo_inputs("hf_bert")),
    "vit": (_ZOO["hf_vit"].factory, _zoo_inputs("hf_vit")),
    "swin": (
        lambda: hf_model(
            "SwinConfig",
            dict(image_size=32, patch_size=4, embed_dim=16, depths=[2, 1], num_heads=[2, 4], window_size=4),
            input_names=("pixel_values",),
        ),
        _image,
    ),
    "speech": (_ZOO["hf_wav2vec2"].factory, _zoo_inputs("hf_wav2vec2")),
    "cnn": (_settled_resnet, _zoo_inputs("hf_resnet")),
}

SCHEMES = ("int8", "int8-dynamic")
#: int8-dynamic quantizes linear layers only: a CNN without one is refused (see the test below)
_REFUSED = {("cnn", "int8-dynamic")}
#: families whose graphs compute integers (masks, positions, window indices) next to the floats
_INTEGER_FAMILIES = {"decoder", "encoder_mask", "swin"}


def _export(family: str, scheme: str, out: pathlib.Path) -> dx.ExportResult:
    make, inputs = FAMILIES[family]
    torch.manual_seed(0)
    model = make()
    calibration = [inputs(10 + i) for i in range(4)] if scheme == "int8" else None
    return dx.export(
        model, inputs(0), out_dir=out, name="q", quantize=scheme, calibration=calibration, cache=False
    )


@pytest.fixture(
    scope="module",
    params=[(f, s) for f in FAMILIES for s in SCHEMES if (f, s) not in _REFUSED],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def family_export(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, str, dx.ExportResult, Any]:
    family, scheme = request.param
    res = _export(family, scheme, tmp_path_factory.mktemp(f"{family}-{scheme}"))
    report = dx.compare(res) if not res.errors else None
    return family, scheme, res, report


def test_both_files_published_and_agree_with_the_quantized_program(
    family_export: tuple[str, str, dx.ExportResult, Any],
) -> None:
    family, scheme, res, report = family_export
    assert not res.errors, {t: str(e) for t, e in res.errors.items()}
    assert set(res.artifacts) == {"onnx", "xnnpack"}
    assert report is not None and report.ok, report.to_markdown()
    assert report.outputs
    sources = {t.source for o in report.outputs for t in o.tolerance.values()}
    assert any("quantization" in s for s in sources), sources  # judged by the int8 criterion


def test_outputs_are_not_flat(family_export: tuple[str, str, dx.ExportResult, Any]) -> None:
    """Random weights must not make the comparison vacuous."""
    family, _, res, _ = family_export
    _, inputs = FAMILIES[family]
    outs = res.program.exported_program.module()(*inputs(0))
    assert not outputs_constant(outs), family


def test_int8_codes_are_the_same_bytes_in_both_files(
    family_export: tuple[str, str, dx.ExportResult, Any],
) -> None:
    _, _, res, _ = family_export
    manifest = json.loads((res.out_dir / "q.weights.json").read_text())
    int8 = [e for e in manifest["entries"] if e["dtype"] == "int8"]
    assert len(int8) >= 2, [e["name"] for e in manifest["entries"]]
    for e in int8:
        assert {c["status"] for c in e["copies"]["onnx"]} == {"exact"}, e
        assert {c["status"] for c in e["copies"]["xnnpack"]} <= {"exact", "transformed"}, e
    res.verify_weights()


def test_integer_subgraphs_left_alone_and_float_ops_recorded(
    family_export: tuple[str, str, dx.ExportResult, Any],
) -> None:
    family, scheme, res, _ = family_export
    record = json.loads((res.out_dir / "q.weights.json").read_text())["program"]["quantization"]
    assert record["scheme"] == scheme and record["quantized_ops"], record
    if family in _INTEGER_FAMILIES:
        assert record["integer_ops"] > 0, record
    for f in record["float_ops"]:
        assert f["reason"] and f["count"] > 0, f


def test_each_file_is_as_close_to_the_float_model_as_the_reference(
    family_export: tuple[str, str, dx.ExportResult, Any],
) -> None:
    """The question a user asks first: what did int8 cost? Each runtime stays within 6 dB of
    the quantized reference's own distance to the float model."""
    family, _, _, report = family_export
    assert report is not None
    compared = 0
    for o in report.outputs:
        if "eager" not in o.against_float:
            continue
        ref = o.against_float["eager"]
        for rt in ("onnx", "xnnpack"):
            got = o.against_float[rt]
            assert got.snr_db > ref.snr_db - 6.0, (family, o.label, rt, got, ref)
            compared += 1
    assert compared, "no output was compared with the float model"


def test_int8_dynamic_refuses_a_model_without_linear_layers(tmp_path: pathlib.Path) -> None:
    """A ResNet has no linear layer: int8-dynamic would write float files labelled int8."""
    with pytest.raises(dx.DualExportError, match="no linear layer"):
        _export("cnn", "int8-dynamic", tmp_path)
    assert not list(tmp_path.glob("**/*.onnx")) and not list(tmp_path.glob("**/*.pte"))


def _double_a_weight_scale(folder: pathlib.Path) -> str:
    """Double the scale of the last per-channel weight DequantizeLinear in the .onnx on disk
    (a parameter only that node reads); return the name of the value it produces."""
    path = folder / "q.onnx"
    model = onnx.load(str(path))
    values = {i.name: i for i in model.graph.initializer}
    consts = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant"}
    # the last layer's weight: it feeds the output through the residual alone. Why not an early
    # one: on random tiny weights attention is near uniform, and a doubled query or key scale
    # (the second dequantize) stayed inside the int8 criterion (measured: compare passed)
    node = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and "per_channel" in n.name][-1]
    name = node.input[1]
    if name in values:
        arr = numpy_helper.to_array(values[name])
        values[name].CopyFrom(numpy_helper.from_array((arr * 2).astype(arr.dtype), name))
    else:
        t = consts[name].attribute[0].t
        arr = numpy_helper.to_array(t)
        t.CopyFrom(numpy_helper.from_array(np.asarray(arr * 2, dtype=arr.dtype), name))
    onnx.save(model, str(path), save_as_external_data=False)
    return str(node.output[0])


def test_a_planted_wrong_scale_in_a_transformer_fails_and_is_localized(tmp_path: pathlib.Path) -> None:
    """A BERT with a padding mask, static int8: the correct files pass by the int8 criterion; a
    doubled weight scale in one layer of the .onnx fails, and the first divergence is that
    layer's dequantize (the .pte untouched passes)."""
    res = _export("encoder_mask", "int8", tmp_path)
    assert not res.errors and dx.compare(res).ok
    changed = _double_a_weight_scale(res.out_dir)
    report = dx.compare(res)
    assert not report.ok
    assert report.first_divergence["xnnpack"] is None
    assert report.first_divergence["onnx"] == changed, (report.first_divergence, changed)


@pytest.mark.xfail(
    strict=True,
    raises=IndexError,
    reason="torchao 0.18 PT2E with ExecuTorch 1.4.1's XNNPACKQuantizer turns the scalar of the "
    "mask's integer index arithmetic into a float32 attribute (transform_for_annotation), so "
    "aten.index gets float indices; dualexport's IntegerSafeQuantizer keeps integer nodes out",
)
def test_plain_pt2e_fails_on_a_bert_with_a_padding_mask() -> None:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    make, inputs = FAMILIES["encoder_mask"]
    model = make()
    args = inputs(0)
    program = torch.export.export(model, args, strict=False)
    quantizer = XNNPACKQuantizer()
    quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(program.module(), quantizer)
    prepared(*args)
    convert_pt2e(prepared)(*args)
