"""Attention written with ``bmm`` on merged batch and heads and a masked fill before the softmax
(DeBERTa-v2's form), delegated whole to XNNPACK, statically and with batch and sequence dynamic.

Before: a tiny DeBERTa-v2 gave 3 subgraphs static (the fill's ``where`` between the scores'
``bmm`` and the softmax, once per layer) and 13 with batch and sequence dynamic (20 views with
two symbolic sizes). Both files are compared with eager on a padded batch whose padded query rows
are fully masked: DeBERTa's fill is ``finfo.min``, so such a row is uniform in eager, not zero.
"""

from __future__ import annotations

import math
import pathlib

import pytest
import torch
from torch import nn
from torch.export import Dim

import dualexport as dx
from dualexport.exporters.base import ExportOptions
from dualexport.exporters.xnnpack import XnnpackExporter
from dualexport.pipeline.export import shared_passes
from dualexport.shared_state import SharedProgram

aten = torch.ops.aten


class BmmEncoder(nn.Module):
    """DeBERTa-v2's self-attention, op for op (``DisentangledSelfAttention`` without relative
    positions), ``layers`` layers, 4 heads of 8; ``fill`` is what masked scores are set to."""

    def __init__(self, layers: int = 2, d: int = 32, heads: int = 4, fill: float | None = None) -> None:
        super().__init__()
        self.heads, self.fill = heads, fill
        self.q = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.k = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.v = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.o = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.norm = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(x.size()[:-1] + (self.heads, -1))
        return x.permute(0, 2, 1, 3).contiguous().view(-1, x.size(1), x.size(-1))

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        ext = attention_mask.unsqueeze(1).unsqueeze(2)
        mask = ext * ext.squeeze(-2).unsqueeze(-1)  # padded queries see nothing: fully masked rows
        fill = torch.finfo(x.dtype).min if self.fill is None else self.fill
        for q, k, v, o, norm in zip(self.q, self.k, self.v, self.o, self.norm, strict=True):
            ql, kl, vl = self._split(q(x)), self._split(k(x)), self._split(v(x))
            scale = torch.sqrt(torch.tensor(ql.size(-1), dtype=torch.float) * 1)
            scores = torch.bmm(ql, kl.transpose(-1, -2) / scale.to(dtype=ql.dtype))
            scores = scores.view(-1, self.heads, scores.size(-2), scores.size(-1))
            scores = scores.masked_fill(~(mask.bool()), fill)
            probs = nn.functional.dropout(torch.softmax(scores, dim=-1), 0.1, self.training)
            ctx = torch.bmm(probs.view(-1, probs.size(-2), probs.size(-1)), vl)
            ctx = ctx.view(-1, self.heads, ctx.size(-2), ctx.size(-1)).permute(0, 2, 1, 3).contiguous()
            x = norm(x + o(ctx.view(ctx.size()[:-2] + (-1,))))
        return x


def _padded() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    x = torch.randn(3, 7, 32)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, :] = 0  # all padding: every query row fully masked (uniform in eager)
    return x, mask


_BATCH, _SEQ = Dim("batch", min=1, max=6), Dim("seq", min=2, max=16)
_SPEC = ({0: _BATCH, 1: _SEQ}, {0: _BATCH, 1: _SEQ})


@pytest.mark.parametrize(
    "dynamic",
    # static: the masked fill's sum alone (its graph is checked by default below, and the zoo's
    # masked_attention runs it end to end with parity)
    [pytest.param(False, marks=pytest.mark.slow), True],
    ids=["static", "batch-and-seq"],
)
def test_bmm_attention_is_one_delegate_with_parity(dynamic: bool, tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    model = BmmEncoder().eval()
    x, mask = _padded()
    res = dx.export(
        model, (x, mask), out_dir=tmp_path, name="m", cache=False, dynamic_shapes=_SPEC if dynamic else None
    )
    assert not res.errors, {t: str(e) for t, e in res.errors.items()}
    d = res.artifacts["xnnpack"].delegation
    assert d.subgraphs == 1, d.to_markdown()
    outside = {op for op, (_, n) in d.by_op.items() if n}
    assert not outside & {"aten_bmm_default", "aten_linear_default", "aten__softmax_default"}, d.to_markdown()
    # the mask's additive form is made once for both layers, before the first
    assert d.by_op.get("aten_where_self", (0, 0))[1] <= 1, d.to_markdown()
    if dynamic:  # no view of the [B * H, L, E] form is left: at most the mask's own
        assert d.by_op.get("aten_view_copy_default", (0, 0))[1] <= 1, d.to_markdown()
    res.verify_weights()
    report = dx.compare(res, generate=2, edges=False)
    assert report.ok, report.to_markdown()
    with torch.no_grad():
        want = model(x, mask)
    assert float(want[2].std()) > 1e-2 and float(want[0].std()) > 1e-2  # not flat
    if dynamic:
        assert res.artifacts["xnnpack"].outcome.proof.edges


def _xnnpack_program(model: nn.Module, dynamic: bool) -> torch.export.ExportedProgram:
    shared = SharedProgram.capture(model, _padded(), dynamic_shapes=_SPEC if dynamic else None)
    shared.apply_passes(shared_passes(ExportOptions()))
    return XnnpackExporter().decompose(shared.exported_program)


def _on_scores(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """``where`` nodes a softmax reads: a masked fill of the scores as the model wrote it."""
    return [
        n
        for n in program.graph.nodes
        if n.target is aten.where.self and any(u.target is aten._softmax.default for u in n.users)
    ]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "batch-and-seq"])
def test_a_fill_the_sum_would_change_is_left_as_written(dynamic: bool) -> None:
    """``s + c`` equals ``c`` in float arithmetic only for a huge ``c``: with -1e4 a fully masked
    row's softmax would read the scores, so the fill stays a ``where`` on the scores, and the
    ``bmm`` form is not read as SDPA either; ``finfo.min`` on the same graph is rewritten (so
    the check cannot pass vacuously)."""
    small = _xnnpack_program(BmmEncoder(fill=-1e4).eval(), dynamic)
    assert len(_on_scores(small)) == 2, small.graph
    huge = _xnnpack_program(BmmEncoder().eval(), dynamic)
    assert not _on_scores(huge), huge.graph
    bmm = aten.bmm.default
    if dynamic:  # read as SDPA and rewritten per head (8 bmm per layer: 4 heads x 2) or not at all
        assert [n.target for n in small.graph.nodes].count(bmm) == 4
        assert [n.target for n in huge.graph.nodes].count(bmm) == 16


def test_minus_inf_is_not_read_as_sdpa() -> None:
    """With a ``-inf`` fill eager gives a fully masked row NaN, SDPA zeros: that attention keeps
    its ``bmm`` form (the sum of the static rewrite is exact for it: ``s - inf`` is ``-inf``)."""
    program = _xnnpack_program(BmmEncoder(fill=float("-inf")).eval(), dynamic=True)
    assert [n.target for n in program.graph.nodes].count(aten.bmm.default) == 4


class MatmulEncoder(nn.Module):
    """Attention on ``[B, H, L, E]`` heads with ``torch.matmul`` (transformers' eager attention:
    BERT, RemBERT, DistilBERT...): ``matmul(q, k^T) * scale + mask``, softmax, ``matmul(p, v)``.
    ``split_scale``: queries and keys each divided by ``E ** 0.25`` first (Nystromformer);
    ``fill``: the additive mask's value for a hidden key."""

    def __init__(self, fill: float | None = None, split_scale: bool = False) -> None:
        super().__init__()
        self.fill, self.split_scale = fill, split_scale
        self.qkv = nn.ModuleList(nn.Linear(32, 96) for _ in range(2))
        self.o = nn.ModuleList(nn.Linear(32, 32) for _ in range(2))

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        fill = torch.finfo(x.dtype).min if self.fill is None else self.fill
        hidden = (~attention_mask.bool())[:, None, None, :].to(x.dtype)  # 1 where a key is hidden
        add = hidden * fill if math.isfinite(fill) else hidden.masked_fill(hidden.bool(), fill)
        for qkv, o in zip(self.qkv, self.o, strict=True):
            q, k, v = (t.view(b, s, 4, 8).transpose(1, 2) for t in qkv(x).split(32, dim=-1))
            if self.split_scale:
                q, k = q / 8**0.25, k / 8**0.25
                scores = torch.matmul(q, k.transpose(-1, -2))
            else:
                scores = torch.matmul(q, k.transpose(-1, -2)) * 8**-0.5
            probs = torch.softmax(scores + add, dim=-1)
            x = x + o(torch.matmul(probs, v).transpose(1, 2).contiguous().view(b, s, 32))
        return x


def _products(program: torch.export.ExportedProgram) -> int:
    return sum(n.target in (aten.bmm.default, aten.matmul.default) for n in program.graph.nodes)


@pytest.mark.parametrize("split_scale", [False, True], ids=["scaled-scores", "scaled-q-and-k"])
def test_eager_matmul_attention_with_batch_and_seq_is_one_delegate(
    split_scale: bool, tmp_path: pathlib.Path
) -> None:
    """Before: the 4-D ``matmul`` form decomposed to ``view([B * H, L, E])`` per operand, two
    symbolic sizes each: a tiny eager BERT with batch and sequence dynamic gave 13 subgraphs
    (73%). Read as SDPA (the additive ``finfo.min`` mask is bounded: no row can be ``-inf``)
    and split per head, it is one delegate; both files agree with eager on a padded batch with
    a sequence that is all padding."""
    torch.manual_seed(0)
    model = MatmulEncoder(split_scale=split_scale).eval()
    x, mask = _padded()
    res = dx.export(model, (x, mask), out_dir=tmp_path, name="m", cache=False, dynamic_shapes=_SPEC)
    assert not res.errors, {t: str(e) for t, e in res.errors.items()}
    d = res.artifacts["xnnpack"].delegation
    assert d.subgraphs == 1, d.to_markdown()
    assert d.by_op.get("aten_view_copy_default", (0, 0))[1] <= 1, d.to_markdown()  # the mask's own
    assert not {"aten_bmm_default", "aten__softmax_default"} & {op for op, (_, n) in d.by_op.items() if n}
    report = dx.compare(res, generate=2, edges=False)
    assert report.ok, report.to_markdown()
    with torch.no_grad():
        assert float(model(x, mask)[2].std()) > 1e-2  # the all-padding sequence is not flat


def test_an_unbounded_additive_mask_keeps_the_matmul_form() -> None:
    """A ``-inf`` additive mask can hide a whole row (eager: NaN, SDPA: zeros): not read as SDPA;
    the same graph with ``finfo.min`` is (so the check cannot pass vacuously)."""
    minus_inf = _xnnpack_program(MatmulEncoder(fill=float("-inf")).eval(), dynamic=True)
    bounded = _xnnpack_program(MatmulEncoder().eval(), dynamic=True)
    assert _products(minus_inf) == 4  # two per layer, as written
    assert _products(bounded) == 16  # per head: 4 heads x 2 per layer


@pytest.mark.slow
def test_transformers_bert_with_eager_attention_and_dynamic_batch_and_seq(tmp_path: pathlib.Path) -> None:
    """The case as users build it: ``BertModel`` with ``attn_implementation="eager"``."""
    import transformers

    from dualexport.loading import HFWrapper

    cfg = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = HFWrapper(transformers.BertModel(cfg).eval(), ("input_ids", "attention_mask"), 1).eval()
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    res = dx.export(
        model, (ids, mask), out_dir=tmp_path, name="m", cache=False, dynamic_shapes={"inputs": _SPEC}
    )
    assert not res.errors, {t: str(e) for t, e in res.errors.items()}
    d = res.artifacts["xnnpack"].delegation
    assert d.subgraphs == 1, d.to_markdown()
    assert dx.compare(res).ok
