"""A weight stored several times by one file (a tied embedding and head, one Parameter used by
several modules and once transposed): every copy is in the manifest, every copy is verified from
disk, a weights-only change writes every copy or lowers again, and each file is proven by value
whatever made it.

Stages per model, as ExecuTorch's tester chains them: export -> the manifest lists every copy
(structure) -> tampering with each copy alone fails verify_weights naming it -> one training step
-> re-export into the same folder (Patched only when every copy was written, else Lowered with
the reason) -> both files, run by their own runtimes, match eager.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import struct
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

import dualexport as dx
from helpers_copies import TiedHand, copy_extent, flip_byte, hf_lm


def _gpt2() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    m = hf_lm("GPT2Config", "GPT2LMHeadModel", n_layer=2, n_embd=32, n_head=2, vocab_size=96, n_positions=16)
    return m, (torch.randint(0, 96, (1, 8)),)


def _hand() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return TiedHand().eval(), (torch.randint(0, 64, (2, 6)),)


def _llama_tied() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    m = hf_lm(
        "LlamaConfig",
        "LlamaForCausalLM",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=96,
        max_position_embeddings=32,
        tie_word_embeddings=True,
    )
    return m, (torch.randint(0, 96, (1, 8)),)


def _t5_encoder() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    from dualexport.loading import HFWrapper

    torch.manual_seed(0)
    cfg = transformers.T5Config(
        d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=96, use_cache=False
    )
    m = HFWrapper(transformers.T5EncoderModel(cfg).eval(), ("input_ids",), 1).eval()
    return m, (torch.randint(0, 96, (1, 8)),)


def _albert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    from dualexport.loading import HFWrapper

    torch.manual_seed(0)
    cfg = transformers.AlbertConfig(
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=96,
        max_position_embeddings=32,
    )
    m = HFWrapper(transformers.AlbertModel(cfg).eval(), ("input_ids",), 1).eval()
    return m, (torch.randint(0, 96, (1, 8)),)


#: name -> (builder, the tied names that must be one entry, quantize, slow)
CASES: dict[str, tuple[Callable[[], tuple[nn.Module, tuple]], tuple[str, ...], str | None, bool]] = {
    "hand": (_hand, ("emb.weight", "head.weight"), None, False),
    "gpt2": (_gpt2, ("model.transformer.wte.weight", "model.lm_head.weight"), None, True),
    "hand_int8": (_hand, (), "int8", True),
    "llama_tied": (_llama_tied, ("model.model.embed_tokens.weight", "model.lm_head.weight"), None, True),
    "t5_encoder": (_t5_encoder, ("model.shared.weight", "model.encoder.embed_tokens.weight"), None, True),
    "albert": (_albert, (), None, True),
}


def _params() -> list:
    return [pytest.param(c, id=c, marks=[pytest.mark.slow] if CASES[c][3] else []) for c in CASES]


@dataclasses.dataclass
class Exported:
    model: nn.Module
    args: tuple[torch.Tensor, ...]
    res: dx.ExportResult


_EXPORTS: dict[str, Exported] = {}


@pytest.fixture
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """One fresh export per model for the whole module (exports take seconds each)."""
    case = request.param
    if case not in _EXPORTS:
        build, _, quantize, _ = CASES[case]
        model, args = build()
        calibration = [args, tuple(torch.randint_like(a, 0, 64) for a in args)] if quantize else None
        out = tmp_path_factory.mktemp(f"shared_{case}") / "out"
        res = dx.export(model, args, out_dir=out, name="m", quantize=quantize, calibration=calibration)
        assert not res.errors, {t: str(e) for t, e in res.errors.items()}
        eager = res.program.run_eager(*args)
        eager = eager[0] if isinstance(eager, tuple) else eager
        assert float(eager.float().std()) > 1e-3, "vacuous: the model's outputs are flat"
        _EXPORTS[case] = Exported(model, args, res)
    return _EXPORTS[case]


def _copy_set(res: dx.ExportResult, dest: pathlib.Path) -> dx.ExportResult:
    """The same result, its files in another folder (so a test can damage them)."""
    shutil.copytree(res.out_dir, dest)
    return dataclasses.replace(res, out_dir=dest)


@pytest.mark.parametrize("exported", _params(), indirect=True)
def test_tied_names_are_one_entry_and_every_copy_is_listed(
    exported: Exported, request: pytest.FixtureRequest
) -> None:
    case = request.node.callspec.id
    tied = CASES[case][1]
    m = exported.res.manifest
    if tied:
        entry = m.entry(tied[0])
        assert set(tied) <= set(entry.names), entry.names
        stored = {
            t: [c for c in cs if c.status in ("exact", "transformed")] for t, cs in entry.copies.items()
        }
        if case in ("hand", "gpt2", "llama_tied"):
            # the embedding's gather and the head's matmul each keep the table
            assert len(stored["onnx"]) == 2, entry.copies["onnx"]
            assert len(stored["xnnpack"]) == 2, entry.copies["xnnpack"]
    check = exported.res.verify_weights()
    assert check.copies is not None
    for t in ("onnx", "xnnpack"):
        assert check.copies[t] == m.copy_counts(t).get("exact", 0) + m.copy_counts(t).get("transformed", 0)


@pytest.mark.parametrize("exported", _params(), indirect=True)
def test_tampering_with_each_copy_fails_naming_it(exported: Exported, tmp_path: pathlib.Path) -> None:
    """Every copy of every weight stored more than once, damaged alone, is caught."""
    res = exported.res
    targets = [
        (e, t, c)
        for e in res.manifest.entries
        for t, cs in e.copies.items()
        if sum(c.status in ("exact", "transformed") for c in cs) > 1 or e.aliases
        for c in cs
        if c.status in ("exact", "transformed") and c.kind != "delegate_payload"
    ]
    assert targets or not any(e.aliases for e in res.manifest.entries)
    for i, (e, target, c) in enumerate(targets[:12]):
        copy = _copy_set(res, tmp_path / f"c{i}")
        path, offset, size = copy_extent(copy, target, c.where, e.nbytes)
        flip_byte(path, offset + size // 2)
        with pytest.raises(dx.WeightMismatchError) as ei:
            copy.verify_weights()
        text = str(ei.value)
        assert f"weight {e.name!r}" in text and c.where in text, text


def _onnx_run(path: pathlib.Path, args: tuple[torch.Tensor, ...]) -> np.ndarray:
    import onnxruntime as ort

    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, {i.name: a.numpy() for i, a in zip(s.get_inputs(), args, strict=True)})[0]


def _pte_run(path: pathlib.Path, args: tuple[torch.Tensor, ...]) -> torch.Tensor:
    from executorch.runtime import Runtime

    return Runtime.get().load_program(str(path)).load_method("forward").execute(list(args))[0]


def _train_step(model: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    """One SGD step on the model's own output: every weight, tied ones included, changes."""
    model.train()
    torch.manual_seed(1)
    out = model(*args)
    out = out[0] if isinstance(out, tuple) else out
    (out.float() ** 2).mean().backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-0.5).add_(torch.randn_like(p), alpha=0.01)
                p.grad = None
    model.eval()


@pytest.mark.parametrize("exported", _params(), indirect=True)
def test_weights_only_change_writes_every_copy_or_lowers(
    exported: Exported, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    case = request.node.callspec.id
    _, _, quantize, _ = CASES[case]
    import copy as _copy

    model = _copy.deepcopy(exported.model)
    args = exported.args
    before = _copy_set(exported.res, tmp_path / "out")
    _train_step(model, args)
    calibration = [args, tuple(torch.randint_like(a, 0, 64) for a in args)] if quantize else None
    again = dx.export(
        model, args, out_dir=before.out_dir, name="m", quantize=quantize, calibration=calibration
    )
    assert not again.errors, {t: str(e) for t, e in again.errors.items()}
    for t, art in again.artifacts.items():
        outcome = art.outcome
        if isinstance(outcome, dx.Patched):
            changed = [e for e in before.manifest.entries if again.manifest.entry(e.name).sha256 != e.sha256]
            places = {c.where for e in changed for c in e.copies[t]}
            assert outcome.copies == len(places) and outcome.patched == len(changed), (t, outcome)
        else:
            assert isinstance(outcome, dx.Lowered) and outcome.because, (t, outcome)
            assert "patch" in outcome.because, outcome.because
        assert art.outcome.proof.values and all(v.max_abs >= 0 for v in art.outcome.proof.values)
    again.verify_weights()
    with torch.no_grad():
        eager = again.program.run_eager(*args)
    eager = eager[0] if isinstance(eager, tuple) else eager
    if quantize:
        assert dx.compare(again, edges=False).ok
        return
    got_onnx = _onnx_run(again.artifacts["onnx"].path, args)
    got_pte = _pte_run(again.artifacts["xnnpack"].path, args)
    torch.testing.assert_close(torch.from_numpy(got_onnx), eager, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_pte, eager, rtol=1e-3, atol=1e-3)
    stale = model.eval()
    with torch.no_grad():
        fresh = stale(*args)
    fresh = fresh[0] if isinstance(fresh, tuple) else fresh
    torch.testing.assert_close(eager, fresh)  # the files are the retrained model, not the old one


class Scaled(nn.Module):
    """A Linear and a distinctive scalar constant (1.625) no manifest entry holds."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) * 1.625


@pytest.mark.parametrize("change_weights", [False, True], ids=["reused", "patched"])
def test_a_previous_file_that_computes_something_else_is_lowered_again(
    tmp_path: pathlib.Path, change_weights: bool
) -> None:
    torch.manual_seed(0)
    model, args = Scaled().eval(), (torch.randn(3, 8),)
    first = dx.export(model, args, out_dir=tmp_path / "out", name="s")
    assert not first.errors
    blob = struct.pack("<f", 1.625)
    for art in first.artifacts.values():
        # a constant of the graph, not a weight: verify_weights cannot see it, only the proof
        path = next(f for f in art.files if f.read_bytes().count(blob) == 1)
        data = bytearray(path.read_bytes())
        at = data.find(blob)
        data[at : at + 4] = struct.pack("<f", 2.5)
        path.unlink()  # a new inode: the first result's hard links are not shared with it
        path.write_bytes(bytes(data))
    first.verify_weights()  # the weights are intact
    if change_weights:
        with torch.no_grad():
            model.fc.weight.mul_(1.25)
    again = dx.export(model, args, out_dir=tmp_path / "out", name="s")
    assert not again.errors
    for t, art in again.artifacts.items():
        assert isinstance(art.outcome, dx.Lowered), (t, art.outcome)
        assert art.outcome.because and "failed its proof" in art.outcome.because, art.outcome.because
    assert dx.compare(again).ok
