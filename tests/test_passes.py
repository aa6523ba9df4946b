"""The shared-program optimization passes, each proven by parity on the zoo.

Every case is exported with the passes as ordinary ``transforms``; then, as in ``test_zoo.py``, a
chain of stages: no target error, a structural check on the XNNPACK delegation (fewer subgraphs or
a higher delegated share than the same case without the passes, as catalogued in tests/zoo), the
weight check from disk (``verify_weights``), and ``dx.compare(...).ok`` on every input set.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import torch

import dualexport as dx
from dualexport.shared_state.passes import DEFAULT_PASSES, fold_constants, xnnpack_friendly
from zoo import ZOO, Case
from zoo.hf import HF_CASES

_BY_NAME = {c.name: c for c in ZOO + HF_CASES}


def _export(case: Case, out: pathlib.Path, transforms: Any = DEFAULT_PASSES, *, dynamic: bool = True) -> Any:
    torch.manual_seed(0)
    model = case.factory().eval()
    args, kwargs = case.inputs()
    dyn = case.dynamic_shapes() if (dynamic and case.dynamic_shapes) else None
    res = dx.export(
        model, args, kwargs or None, out_dir=out, name=case.name, dynamic_shapes=dyn, transforms=transforms
    )
    assert not res.errors, {t: str(e) for t, e in res.errors.items()}
    return res


def _proven(case: Case, res: Any, *, dynamic: bool = True) -> None:
    """Weights bit for bit from disk, and both runtimes match eager on every input set."""
    res.verify_weights()
    rtol, atol = case.tolerance or (None, None)
    inputs = case.all_input_sets() if dynamic else None
    report = dx.compare(res, inputs=inputs, rtol=rtol, atol=atol, steps=case.steps)
    assert report.ok, report.to_markdown()


# ------------------------------------------------------------------------ default (fast) run
def test_static_encoder_is_one_subgraph(tmp_path: pathlib.Path) -> None:
    """The issue's figure: on a TransformerEncoder every node but the delegate's output getitem
    goes to XNNPACK, in one subgraph (14 subgraphs, 56% without the passes)."""
    case = _BY_NAME["transformer_encoder"]
    res = _export(case, tmp_path, dynamic=False)
    d = res.artifacts["xnnpack"].delegation
    assert d.subgraphs == 1, d.to_markdown()
    assert d.delegated_share >= 0.9, d.to_markdown()
    assert set(d.non_delegated_ops()) <= {"getitem"}, d.non_delegated_ops()
    _proven(case, res, dynamic=False)
    # both targets got the same rewritten program: no layer_norm / sdpa left in the ONNX graph
    assert "LayerNormalization" not in res.artifacts["onnx"].ops
    assert [r.name for r in res.program.transforms] == ["fold_constants", "xnnpack_friendly"]


def test_dynamic_encoder_fewer_subgraphs(tmp_path: pathlib.Path) -> None:
    """With a dynamic sequence length the symbolic views stay outside, but layer_norm and the
    attention prologue go in: fewer subgraphs than the catalogue's count without passes."""
    case = _BY_NAME["transformer_encoder"]
    res = _export(case, tmp_path)
    d = res.artifacts["xnnpack"].delegation
    assert d.subgraphs < case.xnnpack_subgraphs, d.to_markdown()
    assert "aten_native_layer_norm_default" not in d.non_delegated_ops()
    _proven(case, res)


def test_layer_norm_delegated(tmp_path: pathlib.Path) -> None:
    """layer_norm rewritten into mean/sub/mul/rsqrt ops XNNPACK takes; the tied weight stays one
    entry found bit for bit in both files."""
    case = _BY_NAME["tied_embedding"]
    res = _export(case, tmp_path)
    d = res.artifacts["xnnpack"].delegation
    assert "aten_native_layer_norm_default" not in d.by_op
    assert d.by_op["aten_mean_dim"][1] == 0
    _proven(case, res)


def test_fold_constants_lifts_one_constant() -> None:
    """An input-independent chain over a non-mutated buffer becomes one lifted constant; the
    parameter it meets is not folded, and the program still validates and computes the same."""

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.register_buffer("pos", torch.arange(8).reshape(1, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            bias = (self.pos[:, :4].float() * 0.5).unsqueeze(0).expand(2, 1, 4)
            return self.fc(x) + bias

    m = M().eval()
    x = torch.randn(2, 1, 4)
    ep = torch.export.export(m, (x,))
    params = dict(ep.state_dict)
    out = fold_constants(ep)
    assert out is ep
    ops = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert ops == {"aten.linear.default", "aten.add.Tensor"}, ops
    folded = [k for k in ep.constants if k.startswith("_folded_constant")]
    assert len(folded) == 1 and ep.constants[folded[0]].shape == (2, 1, 4)
    assert all(ep.state_dict[k] is v for k, v in params.items())
    ep.validate()
    torch.testing.assert_close(ep.module()(x), m(x))


def test_rewrites_decline_what_they_cannot_keep() -> None:
    """A masked SDPA keeps torch's safe-softmax semantics (not rewritten); dynamic squeezes stay."""

    class M(torch.nn.Module):
        def forward(self, q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)

    q = torch.randn(1, 2, 4, 8)
    ep = xnnpack_friendly(torch.export.export(M(), (q, torch.zeros(4, 4, dtype=torch.bool))))
    assert any("scaled_dot_product_attention" in str(n.target) for n in ep.graph.nodes)


# ------------------------------------------------------------------------------ slow: the zoo
#: int8 cases are left to the zoo runner (tests/zoo/runner.py), which quantizes them and checks
#: within one quantization step: exported here without quantize= they would only repeat their
#: float twins (mlp, cnn_batchnorm), and they declare no subgraph count to compare with.
_ZOO_LIVE = [c for c in ZOO if not c.xfail and not c.int8_calibration]
#: Cases where the passes must strictly reduce the subgraph count (the rest must not raise it).
_FEWER = {"transformer_encoder", "gru", "masked_attention", "kv_cache"}
#: tied_embedding: layer_norm now joins the delegate, but the embedding that shares the head's
#: weight stays outside between them, so the count rises 1 -> 2 while the share rises.
_MORE_OK = {"tied_embedding"}


@pytest.mark.slow
@pytest.mark.parametrize("case", _ZOO_LIVE, ids=[c.name for c in _ZOO_LIVE])
def test_zoo_case_with_passes(case: Case, tmp_path: pathlib.Path) -> None:
    res = _export(case, tmp_path)
    d = res.artifacts["xnnpack"].delegation
    if case.name in _FEWER:
        assert d.subgraphs < case.xnnpack_subgraphs, d.to_markdown()
    elif case.name not in _MORE_OK:
        assert d.subgraphs <= case.xnnpack_subgraphs, d.to_markdown()
    _proven(case, res)


_HF_LIVE = [c for c in HF_CASES if not c.xfail]


@pytest.mark.slow
@pytest.mark.parametrize("case", _HF_LIVE, ids=[c.name for c in _HF_LIVE])
def test_hf_case_with_passes(case: Case, tmp_path: pathlib.Path) -> None:
    """Real architectures: strictly fewer subgraphs than catalogued without the passes (ResNet,
    already one subgraph, stays one), parity and weights."""
    res = _export(case, tmp_path)
    d = res.artifacts["xnnpack"].delegation
    if case.xnnpack_subgraphs == 1:
        assert d.subgraphs == 1
    else:
        assert d.subgraphs < case.xnnpack_subgraphs, d.to_markdown()
    _proven(case, res)


@pytest.mark.slow
def test_static_bert_share(tmp_path: pathlib.Path) -> None:
    """The issue's BERT figure: >= 90% of nodes delegated, at most 3 subgraphs (10 and 54%
    without the passes), parity and weights."""
    case = _BY_NAME["hf_bert"]
    res = _export(case, tmp_path, dynamic=False)
    d = res.artifacts["xnnpack"].delegation
    assert d.subgraphs <= 3 and d.delegated_share >= 0.9, d.to_markdown()
    _proven(case, res, dynamic=False)


def test_optimize_option_applies_the_default_passes(tmp_path: pathlib.Path) -> None:
    """``dx.export(optimize=True)`` runs DEFAULT_PASSES once on the shared program, first."""
    from models import MLP

    res = dx.export(MLP(), (torch.randn(2, 16),), out_dir=tmp_path, name="m", optimize=True)
    assert not res.errors
    names = [t.name for t in res.program.transforms]
    assert len(names) == len(DEFAULT_PASSES)
    assert res.program.decomposed["onnx"].state_dict is res.program.state_dict
    assert dx.compare(res).ok
    res.verify_weights()
