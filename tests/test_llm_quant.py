"""Quantized decoders (issue 19, step 3): ``dx.export_llm(quantize="int4" | "int8")``.

One set of codes for both files: the shared program holds int4 (group 32) or int8 (per channel)
codes, bfloat16-valued scales and zero points as buffers; the .onnx writes them as blocked
``DequantizeLinear`` that ONNX Runtime fuses into ``MatMulNBits``, the .pte as XNNPACK's
8-bit-dynamic-activation kernels. Checked from the files on disk: the weight proof finds every
code and scale (packed, transposed, bfloat16) bit for bit, ONNX Runtime fuses one MatMulNBits
per quantized linear, the .pte runs in one XNNPACK delegate, and ``dx.generate`` on both files
gives the quantized eager program's greedy tokens wherever its top-2 margin is above the bound.
One export per case, shared by its checks; the second architecture runs in the slow suite.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import pathlib
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import dualexport as dx
from dualexport.errors import InputError
from dualexport.llm.parity import QUANTIZED_TOLERANCE, generation_parity
from dualexport.llm.quantize import SCHEMES, quantized_weights
from dualexport.shared_state.quantize import is_quantized, quantized_outputs
from test_llm import COMMON, make_model, prompts

T = 32
NEW = 8
#: Llama's hidden 64 and intermediate 128 are multiples of the group (32): every linear quantized.
CASES = {
    "llama-int4": ("llama", "int4-sym"),
    "qwen3-int4": ("qwen3", "int4-sym"),  # q/k norm, head_dim 16
    "llama-int8": ("llama", "int8"),
}
#: every case exports a decoder and lowers it twice (~160 s on 2 cores): all in `make test-slow`; the
#: default run keeps the unit checks below (refusals, encodings, the margin bound, CLI choices)
FAST: tuple[str, ...] = ()
LINEARS = 7 * COMMON["num_hidden_layers"] + 1  # q, k, v, o, gate, up, down per layer; lm_head


@dataclasses.dataclass(frozen=True)
class Quantized:
    case: str
    arch: str
    scheme: str
    res: Any
    report: Any


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Any:
    done: dict[str, Quantized] = {}

    def get(case: str) -> Quantized:
        if case not in done:
            arch, scheme = CASES[case]
            model = make_model(arch)
            # the explicit-cache .pte too: its int4 codes, delegation and manifest copies are
            # what these tests read (a deploy export makes only the runner .pte by default)
            res = dx.export_llm(
                model,
                max_seq_len=T,
                out_dir=tmp_path_factory.mktemp(case),
                name=arch,
                quantize=scheme,
                explicit_pte=True,
            )
            assert res.ok, dict(res.errors)
            report = generation_parity(res, model, prompts=prompts(), max_new_tokens=NEW)
            sizes = {t: pathlib.Path(a.path).stat().st_size for t, a in res.artifacts.items()}
            print(
                f"{case}: {sizes}\n{report.to_markdown()}\n{res.artifacts['xnnpack'].delegation.to_markdown()}"
            )
            done[case] = Quantized(case, arch, scheme, res, report)
        return done[case]

    return get


@pytest.fixture(params=[pytest.param(c, marks=() if c in FAST else pytest.mark.slow) for c in CASES])
def quantized(request: pytest.FixtureRequest, exports: Any) -> Quantized:
    return exports(request.param)


def ort_optimized_ops(path: pathlib.Path, tmp_path: pathlib.Path) -> collections.Counter[str]:
    """Op types of the graph ONNX Runtime runs (its optimized model, written to ``tmp_path``),
    with the session entries the file records (the MatMulNBits accuracy level)."""
    import json

    import onnx
    import onnxruntime as ort

    from dualexport.exporters.onnx_quant import SESSION_CONFIG_KEY

    meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    for key, value in json.loads(meta.get(SESSION_CONFIG_KEY, "{}")).items():
        options.add_session_config_entry(key, value)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    model = onnx.load(options.optimized_model_filepath, load_external_data=False)
    return collections.Counter(n.op_type for n in model.graph.node)


# ------------------------------------------------------------------------- one set of codes
def test_codes_and_scales_proven_in_both_files(quantized: Quantized) -> None:
    """Every linear is quantized, and each code/scale buffer of the shared program is found in
    both files, read back from disk: the .onnx's transposed INT4 (two per byte) and scales, the
    .pte's packed nibbles and bfloat16 scales (int4), or the int8 codes (transposed in the .onnx,
    its scales repeated per block: MatMulNBits' 8-bit weight)."""
    program = quantized.res.program.exported_program
    groups = quantized_weights(program)
    assert len(groups) == LINEARS
    assert not any(n.endswith("_proj.weight") or n == "model.lm_head.weight" for n in program.state_dict)
    # the lowering keeps no tensor of its own but the scalars it lifts (eps, clamp bounds)
    assert quantized.res.artifacts["xnnpack"].outcome.kept_not_shared == ()
    check = quantized.res.verify_weights()
    assert check.copies and check.copies["onnx"] > 0 and check.copies["xnnpack"] > 0
    manifest = quantized.res.manifest
    for names in groups.values():
        for role in ("codes", "scales"):
            entry = manifest.entry(names[role])
            for target in ("onnx", "xnnpack"):
                stored = [c for c in entry.copies[target] if c.status in ("exact", "transformed")]
                assert stored, (names[role], target, entry.copies[target])
    codes = manifest.entry(next(iter(groups.values()))["codes"])
    if quantized.scheme == "int4-sym":
        (onnx_copy,) = codes.copies["onnx"]
        assert (onnx_copy.status, onnx_copy.encoding, onnx_copy.permutation) == (
            "transformed",
            "int4_packed",
            (1, 0),
        )
        (pte_copy,) = codes.copies["xnnpack"]
        assert (pte_copy.status, pte_copy.encoding) == ("transformed", "uint4_packed_offset8")
    else:  # int8: MatMulNBits' 8-bit weight at level 4 (export_llm's default), transposed
        assert {(c.status, c.permutation, c.encoding) for c in codes.copies["onnx"]} == {
            ("transformed", (1, 0), None)
        }
        assert {c.status for c in codes.copies["xnnpack"]} == {"exact"}


@pytest.mark.slow
def test_a_changed_code_on_disk_fails_the_proof(exports: Any, tmp_path: pathlib.Path) -> None:
    """The proof reads the packed copy: flip one nibble of one INT4 initializer in a copy of the
    .onnx and verification names the weight."""
    import shutil

    import onnx

    from dualexport.errors import WeightMismatchError
    from dualexport.weights import verify_manifest

    q = exports("llama-int4")
    onnx_path = q.res.artifacts["onnx"].path
    for f in pathlib.Path(onnx_path).parent.iterdir():
        if f.name.startswith(q.arch + "."):
            shutil.copy(f, tmp_path / f.name)
    copy = tmp_path / pathlib.Path(onnx_path).name
    model = onnx.load(str(copy), load_external_data=False)
    init = next(i for i in model.graph.initializer if i.name.endswith("q_proj.int4_sym_codes.kn"))
    if init.HasField("raw_data"):
        raw = bytearray(init.raw_data)
        raw[0] ^= 0x01
        init.raw_data = bytes(raw)
        onnx.save(model, str(copy))
    else:  # stored in the .onnx.data file
        info = {e.key: e.value for e in init.external_data}
        data = tmp_path / info["location"]
        blob = bytearray(data.read_bytes())
        blob[int(info.get("offset", 0))] ^= 0x01
        data.write_bytes(bytes(blob))
    holder = {k: v for k, v in q.res.program.exported_program.state_dict.items()}
    with pytest.raises(WeightMismatchError, match="q_proj.int4_sym_codes"):
        verify_manifest(q.res.manifest, tmp_path, holder)


@pytest.mark.slow
def test_a_retrained_quantized_decoder_ships_its_new_codes(exports: Any, tmp_path: pathlib.Path) -> None:
    """Issue 18's stale-file case on quantized copies: the int4 decoder retrained and exported
    again into the folder of its first export. Codes and scales derive from the new weights, so
    the files must carry the new ones (patched or lowered anew) and compute the new model."""
    import shutil

    q = exports("llama-int4")
    out = tmp_path / "out"
    shutil.copytree(pathlib.Path(q.res.artifacts["onnx"].path).parent, out)
    model = make_model("llama")
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():  # one "training step": every parameter moves
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    res = dx.export_llm(model, max_seq_len=T, out_dir=out, name=q.arch, quantize=q.scheme, deploy=False)
    assert res.ok, dict(res.errors)
    for target, art in res.artifacts.items():
        assert isinstance(art.outcome, (dx.Lowered, dx.Patched)), (target, art.outcome)
    res.verify_weights()
    old = q.res.program.exported_program.state_dict
    new = res.program.exported_program.state_dict
    codes = next(k for k in new if k.endswith("q_proj.int4_sym_codes"))
    assert not torch.equal(old[codes], new[codes]), "the retrained program kept the old codes"
    report = generation_parity(res, model, prompts=prompts(), max_new_tokens=NEW)
    assert report.ok, report.to_markdown()


# ----------------------------------------------------------------------------- the targets
def test_onnx_runtime_fuses_every_linear_into_matmulnbits(
    quantized: Quantized, tmp_path: pathlib.Path
) -> None:
    """ONNX Runtime fuses one MatMulNBits (block 32, accuracy level 4: export_llm's default) per
    quantized linear, 4 bits for int4 and 8 for int8 (its per-channel scale repeated per block):
    no float weight is rebuilt at load."""
    import onnx

    path = quantized.res.artifacts["onnx"].path
    ops = ort_optimized_ops(path, tmp_path)
    assert ops["MatMulNBits"] == LINEARS, dict(ops)
    model = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    attrs = {
        a.name: onnx.helper.get_attribute_value(a)
        for a in next(n for n in model.graph.node if n.op_type == "MatMulNBits").attribute
    }
    bits = 4 if quantized.scheme == "int4-sym" else 8
    assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (bits, 32, 4)


def test_pte_runs_the_quantized_linears_in_one_xnnpack_delegate(quantized: Quantized) -> None:
    """8-bit dynamic activations with int4/int8 weights: XNNPACK takes every linear and its
    activation quantization; the program stays one delegate."""
    d = quantized.res.artifacts["xnnpack"].delegation
    assert d.subgraphs == 1, d.to_markdown()
    assert d.by_op["aten_linear_default"][1] == 0, d.to_markdown()
    for op in ("torchao_choose_qparams_affine_default", "torchao_quantize_affine_default"):
        assert d.by_op[op] == (LINEARS, 0), d.to_markdown()
    assert d.delegated_share >= 0.90, d.to_markdown()


def test_files_store_half_a_byte_per_int4_weight(quantized: Quantized) -> None:
    """Each file keeps the codes at their width (int4: two per byte, int8: one), read from the
    files on disk at the place the manifest records: no float copy of a quantized weight."""
    from dualexport.weights.readers import read_onnx, read_pte

    art = quantized.res.artifacts
    onnx_store, pte_store = (
        read_onnx(pathlib.Path(art["onnx"].path)),
        read_pte(pathlib.Path(art["xnnpack"].path)),
    )
    per_byte = 2 if quantized.scheme == "int4-sym" else 1
    for names in quantized_weights(quantized.res.program.exported_program).values():
        entry = quantized.res.manifest.entry(names["codes"])
        numel = entry.nbytes  # int8 storage in the holder: one byte per weight
        (onnx_copy,) = entry.copies["onnx"]
        assert onnx_store.nbytes[onnx_copy.ref.split("@")[0]] == numel // per_byte
        (pte_copy,) = entry.copies["xnnpack"]
        assert pte_store.named_sizes[pte_copy.ref] == numel // per_byte


# ------------------------------------------------------------------------------ generation
def test_generate_matches_the_quantized_program(quantized: Quantized) -> None:
    """dx.generate on both files against the quantized program run eagerly (the reference of a
    quantized file), teacher-forced logits within the quantized tolerance; a token difference
    counts only above the margin bound; the tokens are not one repeated id."""
    report = quantized.report
    assert report.reference == "eager" and report.tolerance == QUANTIZED_TOLERANCE
    assert report.ok, report.to_markdown()
    # not one repeated id over both prompts (int8 Llama's short prompt repeats one token)
    assert len({t for p in report.prompts for t in p.reference}) > 1, [p.reference for p in report.prompts]
    for p in report.prompts:
        # the explicit-cache files and the deploy folder's runner files, each held to the program
        assert set(p.teacher_forced) == {"onnx", "xnnpack", "onnx:genai", "xnnpack:runner"}
        for rt, m in p.teacher_forced.items():
            # a .onnx at MatMulNBits level 4 (the default) is held to the kernel's looser bound
            bound = report.tolerances.get(rt, QUANTIZED_TOLERANCE).max_abs
            assert m.unexplained_flips == 0 and m.max_abs <= bound, (rt, m)
    assert set(report.tolerances) == {"onnx", "onnx:genai"}  # the .pte computes the program
    from dualexport.llm.export import QUANTIZE_KEY

    art = quantized.res.artifacts
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(art["onnx"].path), load_external_data=False).metadata_props}
    assert meta[QUANTIZE_KEY].startswith(quantized.scheme + ":")
    prompt = prompts()[0]
    out = {t: dx.generate(art[t].path, prompt, max_new_tokens=NEW, return_logits=True) for t in art}
    eager = report.prompts[0].tokens["eager"]
    for t, (tokens, logits) in out.items():
        assert tokens.shape == (1, len(prompt) + NEW)
        assert float(logits.std(-1).min()) > 1e-3, f"{t}: flat logits"
        if report.prompts[0].first_divergence[t] is None:
            assert tuple(tokens[0, len(prompt) :].tolist()) == eager


def test_quantized_program_differs_from_the_float_model(quantized: Quantized) -> None:
    """The quantization reached the program (its logits are not the float model's), within
    what 4/8-bit weights allow."""
    model = make_model(quantized.arch)
    prompt = torch.tensor([prompts()[0]])
    with torch.no_grad():
        float_logits = model(prompt).logits[0, -1]
    _, logits = dx.generate(
        quantized.res.artifacts["onnx"].path, prompt, max_new_tokens=1, return_logits=True
    )
    diff = float((logits[0] - float_logits).abs().max())
    assert 1e-4 < diff < 0.5 * float(float_logits.abs().max()), diff


# ---------------------------------------------------------------------------------- refusals
def test_bad_quantize_values_are_refused(tmp_path: pathlib.Path) -> None:
    model = make_model("llama")
    with pytest.raises(InputError, match="int2") as info:
        dx.export_llm(model, max_seq_len=T, out_dir=tmp_path, quantize="int2")
    assert "int4" in (info.value.hint or "")
    with pytest.raises(InputError, match="opset"):
        dx.export_llm(
            model, max_seq_len=T, out_dir=tmp_path, quantize="int4", options=dx.ExportOptions(onnx_opset=18)
        )
    with pytest.raises(InputError, match="optimize=False"):
        dx.export_llm(model, max_seq_len=T, out_dir=tmp_path, quantize="int8", optimize=False)
    assert not any(tmp_path.iterdir())
    assert set(SCHEMES) == {"int4", "int4-sym", "int8"}


def test_cli_quantize_choices(capsys: pytest.CaptureFixture[str]) -> None:
    from dualexport.cli import build_parser

    ns = build_parser().parse_args(["export-llm", "cfg.json", "--max-seq-len", "16", "--quantize", "int4"])
    assert ns.quantize == "int4"
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["export-llm", "cfg.json", "--max-seq-len", "16", "--quantize", "int2"])
    assert info.value.code == 2 and "int2" in capsys.readouterr().err
    assert ns.ort_int4_accuracy_level is None  # export_llm's default: 4 for quantized decoders
    args = [
        "export-llm",
        "cfg.json",
        "--max-seq-len",
        "16",
        "--quantize",
        "int4",
        "--ort-int4-accuracy-level",
    ]
    assert build_parser().parse_args([*args, "4"]).ort_int4_accuracy_level == 4
    with pytest.raises(SystemExit):
        build_parser().parse_args([*args, "2"])


def test_session_config_key_is_shared_by_exporter_and_runner() -> None:
    from dualexport.exporters.onnx_quant import ACCURACY_LEVEL_ENTRY, SESSION_CONFIG_KEY
    from dualexport.runtimes import ort

    assert ort.SESSION_CONFIG_KEY == SESSION_CONFIG_KEY
    assert ort.ACCURACY_LEVEL_ENTRY == ACCURACY_LEVEL_ENTRY


def test_linears_the_group_does_not_divide_stay_float(caplog: pytest.LogCaptureFixture) -> None:
    """in_features 48 is no multiple of 32: that linear keeps its float weight, named in the log
    and in the program's meta; the other is quantized and still computes the float result within
    int4's error."""
    import logging

    from dualexport.llm.quantize import FLOAT_LINEARS_KEY, quantize_linears

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 16)).eval()
    x = torch.randn(2, 64)
    program = torch.export.export(model, (x,))
    with caplog.at_level(logging.WARNING, logger="dualexport.llm.quantize"):
        quantize_linears(program, SCHEMES["int4-sym"])
    assert list(quantized_weights(program)) == ["0.int4_sym_codes"]
    assert "2.weight" in program.state_dict and "0.weight" not in program.state_dict
    assert set(program.graph_module.meta[FLOAT_LINEARS_KEY]) == {"2.weight"}
    assert "2.weight is not quantized" in caplog.text
    # the proof and compare judge its output as a quantized program's (float after the last
    # dequantize: the SNR requirement), not by the fp32 table, which failed correct int4 files
    # of a 576-wide decoder (SNR 50 dB)
    assert is_quantized(program) and quantized_outputs(program) == {0: None}
    with torch.no_grad():
        want, got = model(x), program.module()(x)
    err = float((got - want).abs().max())
    assert 0 < err < 0.1 * float(want.abs().max()), err


def test_int4_holds_a_4bit_gguf_grid_and_quantizes_the_head_to_8_bits() -> None:
    """Issue 49: weights on a Q4_1 grid (per group of 32: a scale d and a minimum m, w = m + d q,
    q in 0..15, as a 4-bit GGUF holds them) are held by ``int4``'s grid within the bfloat16
    rounding of the scale, where the symmetric ``int4-sym`` re-rounds them; its output head (a linear
    whose result is returned) gets 8-bit per-channel codes, and the program stays the model's
    function within the activations' 8-bit rounding."""
    from dualexport.llm.quantize import quantize_linears, quantize_weight

    torch.manual_seed(0)
    n, k = 64, 128
    d = (torch.rand(n, k // 32) * 0.01 + 0.001).to(torch.bfloat16).float()  # bf16 scales: exact
    m = -(torch.rand(n, k // 32) * 0.05)
    q = torch.randint(0, 16, (n, k // 32, 32)).float()
    q[..., 0], q[..., 1] = 0, 15  # Q4_1 puts each group's minimum at 0 and maximum at 15
    w = (m.unsqueeze(-1) + d.unsqueeze(-1) * q).view(n, k)
    held = quantize_weight(w, SCHEMES["int4"])
    assert held.offsets is not None and int(held.codes.min()) >= -8 and int(held.codes.max()) <= 7
    assert bool((held.zero_points == 0).all())  # the kernels' symmetric codes
    exact = float((held.dequantize(32) - w).abs().max())
    rerounded = float((quantize_weight(w, SCHEMES["int4-sym"]).dequantize(32) - w).abs().max())
    assert exact < 1e-6 and rerounded > 100 * exact, (exact, rerounded)

    model = torch.nn.Sequential(torch.nn.Linear(k, n), torch.nn.ReLU(), torch.nn.Linear(n, 16)).eval()
    with torch.no_grad():
        model[0].weight.copy_(w)
    x = torch.randn(3, k)
    program = torch.export.export(model, (x,))
    quantize_linears(program, SCHEMES["int4"])
    assert sorted(quantized_weights(program)) == ["0.int4_codes", "2.int8_codes"]
    assert "0.int4_offsets" in program.state_dict
    with torch.no_grad():
        want, got = model(x), program.module()(x)
    snr = 10 * math.log10(float(want.pow(2).mean()) / float((got - want).pow(2).mean()))
    assert snr > 30, snr  # only the activations' 8-bit rounding is left


def test_a_token_difference_counts_only_above_the_margin_bound() -> None:
    """Teacher-forced: a top-1 flip where the reference's top-2 margin is under the bound is
    explained, one above it is not; free-running: the first divergence counts by the reference's
    margin at that step, and an unbounded tolerance counts every difference."""
    from dualexport.llm.parity import PromptParity, StepTolerance, teacher_forced_metrics

    bound = QUANTIZED_TOLERANCE.margin_bound
    assert bound is not None
    ref = torch.tensor([[1.0, 1.0 - bound / 2, 0.0], [2.0, 0.0, 0.0]])
    close_flip = torch.tensor([[1.0 - bound / 2, 1.0, 0.0], [2.0, 0.0, 0.0]])
    far_flip = torch.tensor([[1.0, 1.0 - bound / 2, 0.0], [0.0, 2.0, 0.0]])
    assert teacher_forced_metrics(close_flip, ref, bound).unexplained_flips == 0
    assert teacher_forced_metrics(far_flip, ref, bound).unexplained_flips == 1
    assert teacher_forced_metrics(far_flip, ref).unexplained_flips is None

    def parity(margin: float) -> PromptParity:
        return PromptParity((1,), (2, 3), {"onnx": (2, 4)}, {"onnx": 1}, {}, {"onnx": margin})

    assert not parity(bound / 2).counted("onnx", QUANTIZED_TOLERANCE)
    assert parity(bound * 2).counted("onnx", QUANTIZED_TOLERANCE)
    assert parity(bound / 2).counted("onnx", StepTolerance())


def test_encodings_are_the_libraries_own_packing() -> None:
    """The manifest's encodings reproduce what the libraries write: ONNX INT4 (onnx_ir with
    ml_dtypes.int4, two per byte), XNNPACK's ``convert_to_qc4w`` and its bfloat16 scales."""
    import ml_dtypes
    import numpy as np
    import onnx_ir as ir
    from executorch.backends.xnnpack.operators.node_visitor import NodeVisitor

    from dualexport.weights.locate import encoded_bytes

    g = torch.Generator().manual_seed(3)
    codes = torch.randint(-8, 8, (6, 64), generator=g, dtype=torch.int8)
    onnx_int4 = ir.tensor(np.ascontiguousarray(codes.numpy().T).astype(ml_dtypes.int4)).tobytes()
    assert encoded_bytes(codes, (1, 0), "int4_packed") == onnx_int4
    qc4w = NodeVisitor.convert_to_qc4w(codes.clone())
    assert encoded_bytes(codes, (), "uint4_packed_offset8") == qc4w.contiguous().numpy().tobytes()
    scales = torch.rand(6, 2, generator=g).to(torch.bfloat16).float()
    assert (
        encoded_bytes(scales, (), "bfloat16") == scales.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    )
    with pytest.raises(ValueError, match="odd"):
        encoded_bytes(codes[:, :3], (), "uint4_packed_offset8")


def test_weights_read_by_other_matmuls_are_listed_and_a_program_without_linears_refused() -> None:
    """transformers' Conv1D (GPT-2) computes addmm, not linear: its weight stays float32 and is
    listed; a program with no linear at all is refused rather than labelled int4."""
    from transformers.pytorch_utils import Conv1D

    from dualexport.llm.quantize import FLOAT_LINEARS_KEY, quantize_linears

    torch.manual_seed(0)
    x = torch.randn(2, 64)
    mixed = torch.export.export(torch.nn.Sequential(Conv1D(64, 64), torch.nn.Linear(64, 32)).eval(), (x,))
    quantize_linears(mixed, SCHEMES["int4-sym"])
    assert list(quantized_weights(mixed)) == ["1.int4_sym_codes"]
    assert "not a linear" in mixed.graph_module.meta[FLOAT_LINEARS_KEY]["0.weight"]
    only_conv1d = torch.export.export(Conv1D(64, 64).eval(), (x,))
    with pytest.raises(InputError, match="found no linear to quantize"):
        quantize_linears(only_conv1d, SCHEMES["int4-sym"])


# ------------------------------------------------------------- ONNX Runtime's int8 kernel (opt-in)
def test_accuracy_level_4_runs_float_activations_into_matmulnbits(tmp_path: pathlib.Path) -> None:
    """``ExportOptions(onnx_int4_accuracy_level=4)`` on the default ``int4`` scheme: every int4
    linear and the 8-bit head of the .onnx read their float activation (the program's 8-bit
    per-token quantization of it is left out of the ONNX file: no ``Round`` anywhere), ONNX
    Runtime fuses one MatMulNBits at accuracy level 4 per linear (the head's 8 bits, its per-row
    scale repeated per block: not a float copy 4x its bytes), the file is proven against the
    program by SNR, and generation parity holds it to the kernel's bound, reported, while the
    program (and so the .pte) keeps its quantized activations."""
    import onnx

    from dualexport.exporters.base import ExportOptions
    from dualexport.llm.parity import KERNEL_QUANTIZED_TOLERANCE

    model = make_model("llama")
    res = dx.export_llm(
        model,
        max_seq_len=T,
        out_dir=tmp_path / "out",
        name="llama",
        target="onnx",
        quantize="int4",
        options=ExportOptions(onnx_int4_accuracy_level=4),
    )
    assert res.ok, dict(res.errors)
    path = res.artifacts["onnx"].path
    written = collections.Counter(
        n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node
    )
    assert written["Round"] == 0 and written["DequantizeLinear"] == LINEARS, dict(written)
    assert any("quantize_affine" in str(n.target) for n in res.program.exported_program.graph.nodes)
    ops = ort_optimized_ops(path, tmp_path)
    assert ops["MatMulNBits"] == LINEARS, dict(ops)
    fused = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    kernels = [
        {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        for n in fused.graph.node
        if n.op_type == "MatMulNBits"
    ]
    assert {k["accuracy_level"] for k in kernels} == {4}
    assert sorted(k["bits"] for k in kernels) == [4] * (LINEARS - 1) + [8]  # the head: 8 bits
    head = next(k for k in kernels if k["bits"] == 8)
    assert head["N"] == model.config.vocab_size and head["block_size"] == 32
    manifest = (pathlib.Path(path).parent / "llama.weights.json").read_text()
    assert '"encoding": "rows_repeated:' in manifest  # the head's scales, proven per block
    proof = res.artifacts["onnx"].outcome.proof
    assert "per block" in proof.against and "accuracy level 4" in proof.against
    print(proof.values)
    assert a_doubled_scale_fails_the_proof(res, tmp_path)
    assert a_fused_genai_file_is_held_to_the_kernel_criterion(res, tmp_path)
    report = generation_parity(res, model, prompts=prompts(), max_new_tokens=NEW)
    # the deploy folder's onnxruntime-genai file is the same graph, its MatMulNBits baked at level 4
    assert report.tolerances == {"onnx": KERNEL_QUANTIZED_TOLERANCE, "onnx:genai": KERNEL_QUANTIZED_TOLERANCE}
    assert report.ok, report.to_markdown()
    worst = max(p.teacher_forced["onnx"].max_abs for p in report.prompts)
    assert 0 < worst <= KERNEL_QUANTIZED_TOLERANCE.max_abs  # other numerics, within the bound
    assert "accuracy level 4" in report.to_markdown()


def a_fused_genai_file_is_held_to_the_kernel_criterion(res: Any, tmp_path: pathlib.Path) -> bool:
    """At level 4 the onnxruntime-genai file takes ONNX Runtime's GroupQueryAttention (a quantized
    file is no longer held bit for bit to a file with another attention kernel), proven on every
    walk against the program with float activations, at least as close to it as the quantized
    program itself; a copy of it with one layer's ``down_proj`` scales doubled is refused."""
    import shutil

    import numpy as np
    import onnx
    from onnx import numpy_helper

    from dualexport.errors import ProofMismatchError
    from dualexport.exporters import ExportOptions
    from dualexport.llm.deploy.folder import _kernel_reference
    from dualexport.llm.deploy.proof import prove_deploy_file
    from dualexport.llm.layout import read_layout

    folder = res.deploy
    assert folder.ok and folder.onnx is not None, folder.errors
    assert folder.attention["onnx"] == "com.microsoft::GroupQueryAttention (packed QKV)", folder.attention
    proof = folder.proofs["onnx"]
    assert "float activations" in proof.against and proof.worst_snr_db < 80  # other kernels, judged
    bad = tmp_path / "bad_genai"
    bad.mkdir()
    for f in folder.onnx.parent.iterdir():
        if f.is_file() and (f.name.startswith(folder.onnx.name) or f.name == "genai_config.json"):
            shutil.copy(f, bad / f.name)
    path = bad / folder.onnx.name
    model = onnx.load(str(path))
    node = next(
        n for n in model.graph.node if n.op_type == "MatMulNBits" and "layers.0.mlp.down_proj" in n.input[1]
    )
    init = next(i for i in model.graph.initializer if i.name == node.input[2])
    init.CopyFrom(numpy_helper.from_array(np.asarray(numpy_helper.to_array(init) * 2), init.name))
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data")
    layout = read_layout(pathlib.Path(res.artifacts["onnx"].path))  # the program's own (rows)
    kernel = _kernel_reference(res, layout, ExportOptions(onnx_int4_accuracy_level=4))
    assert kernel is not None
    reference, noise, against = kernel
    with pytest.raises(ProofMismatchError, match="float activations"):
        prove_deploy_file(path, "onnx", reference, against, layout, True, noise)
    return True


def a_doubled_scale_fails_the_proof(res: Any, tmp_path: pathlib.Path) -> bool:
    """The level-4 proof (the file against the program with float activations, by the SNR the
    program's own activation quantization keeps) still refuses a wrong weight: the scales of one
    layer's ``down_proj`` doubled in a copy of the file."""
    import shutil

    import numpy as np
    import onnx
    from onnx import numpy_helper

    from dualexport.errors import ProofMismatchError
    from dualexport.exporters import ExportOptions, get_exporter
    from dualexport.pipeline.forced_proof import forced_stage
    from dualexport.pipeline.prove import prove_file
    from dualexport.pipeline.reference import approximated, reference_sets
    from dualexport.shared_state.contract import edge_sizes, flatten_inputs, input_specs

    path = pathlib.Path(res.artifacts["onnx"].path)
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in path.parent.iterdir():
        if f.name.startswith(path.stem + ".onnx"):
            shutil.copy(f, bad / f.name)
    model = onnx.load(str(bad / path.name))
    init = next(
        i for i in model.graph.initializer if "layers.0.mlp.down_proj" in i.name and "scale" in i.name
    )
    init.CopyFrom(numpy_helper.from_array(np.asarray(numpy_helper.to_array(init) * 2), init.name))
    onnx.save(model, str(bad / path.name), save_as_external_data=True, location=path.name + ".data")

    shared = res.program
    program = shared.exported_program
    example = flatten_inputs(program, shared.example_args, shared.example_kwargs)
    options = ExportOptions(onnx_int4_accuracy_level=4)
    exporter = get_exporter("onnx")
    approx = exporter.proof_program(program, options)
    assert approx is not None
    reference = approximated(reference_sets(shared, example, edge_sizes(program)), shared, *approx)
    forced = forced_stage("onnx", approx[0], exporter.decompose(program, options), program)
    specs = input_specs(program)
    assert prove_file("onnx", path, specs, reference, forced).values  # the file as written passes
    with pytest.raises(ProofMismatchError, match=r"layers\.0\.mlp\.down_proj"):
        prove_file("onnx", bad / path.name, specs, reference, forced)
    return True


def test_accuracy_levels_other_than_0_and_4_are_refused() -> None:
    from dualexport.exporters.base import ExportOptions

    assert ExportOptions().onnx_int4_accuracy_level is None  # the entry point's default
    assert ExportOptions().int4_level == 0 and ExportOptions(onnx_int4_accuracy_level=4).int4_level == 4
    with pytest.raises(InputError, match="onnx_int4_accuracy_level"):
        ExportOptions(onnx_int4_accuracy_level=2)


@pytest.mark.slow
def test_int4_exports_both_files_proven_in_one_delegate(tmp_path: pathlib.Path) -> None:
    """``quantize="int4"`` (group offsets, 8-bit head) end to end on a tiny Llama: both files published and proven, the
    group offsets stored bit for bit in both, every linear fused into MatMulNBits (the 8-bit
    head as an 8-bit one, at level 4), one XNNPACK delegate, and greedy generation on both files
    matching the quantized program."""
    model = make_model("llama")
    res = dx.export_llm(
        model, max_seq_len=T, out_dir=tmp_path / "out", name="m", quantize="int4", deploy=False
    )
    assert res.ok and set(res.artifacts) == {"onnx", "xnnpack"}, dict(res.errors)
    res.verify_weights()
    offsets = [e for e in res.manifest.entries if e.name.endswith("int4_offsets")]
    assert len(offsets) == LINEARS - 1 and all(set(e.copies) == {"onnx", "xnnpack"} for e in offsets)
    ops = ort_optimized_ops(res.artifacts["onnx"].path, tmp_path)
    assert ops["MatMulNBits"] == LINEARS, dict(ops)
    d = res.artifacts["xnnpack"].delegation
    assert d.subgraphs == 1 and d.delegated_share >= 0.90, d.to_markdown()
    report = generation_parity(res, model, prompts=prompts(), max_new_tokens=NEW)
    assert report.ok, report.to_markdown()


def test_the_summary_lists_every_float_linear_and_the_float32_size() -> None:
    """Issue 49: what the files hold is said: each code width with its count, every linear left in
    float32 with the reason, and the float32 bytes of the same weights (the CLI prints each file's
    size against it)."""
    from dualexport.llm.quantize import quantization_summary, quantize_linears

    model = torch.nn.Sequential(
        torch.nn.Linear(64, 48),
        torch.nn.ReLU(),
        torch.nn.Linear(48, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 16),
    ).eval()
    program = quantize_linears(torch.export.export(model, (torch.randn(2, 64),)), SCHEMES["int4"])
    summary = quantization_summary(program)
    assert summary.quantized == {"int4": 1, "int8": 1}  # the last linear is the head: 8-bit
    assert (
        set(summary.float_linears) == {"2.weight"} and "multiple of 32" in summary.float_linears["2.weight"]
    )
    assert summary.fp32_bytes == 4 * sum(p.numel() for p in model.parameters())
    assert any("2.weight" in line for line in summary.lines())


@pytest.mark.parametrize("scheme", ["int4-sym", "int8"])
def test_kernel_activations_compute_what_matmulnbits_computes_at_level_4(scheme: str) -> None:
    """The level-4 proof's reference (``kernel_activations``: each activation quantized per block
    of 32, symmetric int8, as MLAS quantizes it) against ONNX Runtime's own MatMulNBits at level 4,
    on an input with outlier channels: within float rounding, where the program with float
    activations (the kernel's input) is orders of magnitude further away. int8: the per-channel
    weight as weights_for_matmulnbits writes it (8 bits, its scale repeated per block)."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    from dualexport.exporters.onnx_quant import (
        ACCURACY_LEVEL_ENTRY,
        INT8_BLOCK,
        float_activations,
        kernel_activations,
    )
    from dualexport.llm.quantize import quantize_linears

    k, n = 576, 192
    torch.manual_seed(0)

    class Proj(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(k, n, bias=False)

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            return self.proj(hidden)

    lin = Proj().eval()
    x = torch.randn(1, 4, k)
    x[..., 5] *= 30.0
    x[..., 300] *= -15.0
    program = quantize_linears(torch.export.export(lin, (x,)), SCHEMES[scheme])
    (names,) = quantized_weights(program).values()
    codes = program.state_dict[names["codes"]].numpy()
    scales = program.state_dict[names["scales"]].numpy()
    if scheme == "int8":
        scales = np.repeat(scales.reshape(-1, 1), k // INT8_BLOCK, axis=1)
        weight = numpy_helper.from_array(np.ascontiguousarray(codes.T), "c")
    else:
        weight = helper.make_tensor("c", onnx.TensorProto.INT4, [k, n], vals=codes.T.flatten().tolist())
    graph = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["c", "s"], ["w"], axis=0, block_size=32),
            helper.make_node("MatMul", ["x", "w"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, k])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, n])],
        [weight, numpy_helper.from_array(np.ascontiguousarray(scales.T.astype(np.float32)), "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    options = ort.SessionOptions()
    options.add_session_config_entry(ACCURACY_LEVEL_ENTRY, "4")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    kernel = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])
    with torch.no_grad():
        emulated = kernel_activations(program).module()(x)
        floated = float_activations(program).module()(x)
    scale = float(kernel.abs().max())
    near = float((kernel - emulated).abs().max()) / scale
    far = float((kernel - floated).abs().max()) / scale
    assert near < 1e-5 and far > 100 * near, (near, far)


@pytest.mark.slow
def test_a_quantized_runner_pte_attends_with_executorchs_ops_proven_linear_by_linear(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The int4 runner .pte takes ``llama::update_cache`` + ``llama::custom_sdpa`` like a float
    one, proven linear by linear on every call of the walks (llm/deploy/runner_proof.py), and
    generates what the quantized program generates (margin-aware); a runner program whose
    decomposition hands back a copy of one weight (the first public bug) is refused, naming it."""
    from dualexport.errors import ProofMismatchError
    from dualexport.llm.deploy.executorch import FUSED_ATTENTION, lower_runner_pte, runner_methods
    from dualexport.llm.deploy.runner_proof import AGAINST, prove_runner_by_linears
    from dualexport.llm.layout import read_layout
    from test_forced_proof import stale_decomposition

    model = make_model("llama")
    res = dx.export_llm(
        model, max_seq_len=T, out_dir=tmp_path / "out", name="m", quantize="int4", target="xnnpack"
    )
    assert res.ok, dict(res.errors)
    folder = res.deploy
    assert folder.attention["xnnpack"] == FUSED_ATTENTION, folder.attention
    proof = folder.proofs["xnnpack"]
    assert proof.against == AGAINST and [w.calls for w in proof.walks] == [5, 5, 2], proof
    assert proof.worst_linear is not None and proof.worst_linear <= 1.0, proof
    assert proof.describe().startswith("every linear within its bound")
    report = generation_parity(res, model, prompts=prompts(), max_new_tokens=NEW)
    assert report.ok and "xnnpack:runner" in report.to_markdown(), report.to_markdown()

    copied = stale_decomposition(monkeypatch)  # an equal copy: not the shared tensor all the same
    program = res.program.exported_program
    layout = read_layout(pathlib.Path(res.artifacts["xnnpack"].path))
    staging = tmp_path / "stale"
    staging.mkdir()
    options = dx.ExportOptions(xnnpack_external_data=False)
    lowered, attention, decomposed = lower_runner_pte(
        program, layout, staging, "m", options, runner_methods(layout, None, ()), fuse=True
    )
    assert attention == FUSED_ATTENTION and copied
    with pytest.raises(ProofMismatchError, match="a copy of the shared program's"):
        prove_runner_by_linears(lowered.files[0], decomposed, layout, program)
