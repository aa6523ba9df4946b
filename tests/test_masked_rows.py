"""Attention masks computed from parameters on the XNNPACK target: a relative position bias (BEiT,
Swin, T5) cannot be proved finite, so the shared program keeps eager's meaning of a fully masked
row with ``where(any(m != -inf), m, 0)`` and a row factor; exporters/xnnpack_masked_rows.py writes
that guard in ops XNNPACK takes (clamp, max), and a per-head mask shared by the batch (Swin's
windows) is added to the scores in place (exporters/xnnpack_attention.py). One delegate, eager's
values, a fully masked row included."""

from __future__ import annotations

import pathlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

import dualexport as dx
from dualexport.exporters import xnnpack_rewrites
from dualexport.exporters.xnnpack_masked_rows import MaskedRowsAsMax

WINDOW = 9  # tokens per window: a 3 x 3 patch grid


class BiasedAttention(nn.Module):
    """Two SDPA layers whose float mask is a learned relative position bias (a table indexed by a
    constant buffer, BEiT's/Swin's form), per head and shared by the batch, plus a constant mask
    (Swin's shifted windows; ``blocked_row`` fully masks one query row)."""

    def __init__(self, dim: int = 32, heads: int = 4, layers: int = 2, blocked_row: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.table = nn.ParameterList(nn.Parameter(torch.randn(2 * WINDOW - 1, heads)) for _ in range(layers))
        pos = torch.arange(WINDOW)
        self.register_buffer("index", (pos[:, None] - pos[None, :] + WINDOW - 1).reshape(-1))
        shift = torch.zeros(WINDOW, WINDOW)
        shift[:, -2:] = -100.0  # a shifted window's far keys, Swin's way
        visible = torch.ones(WINDOW, WINDOW)
        if blocked_row:
            visible[3] = 0.0
        self.register_buffer("shift", shift)
        self.register_buffer("visible", visible)  # log: 0 or -inf (weights must be finite)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        e = d // self.heads
        for qkv, out, table in zip(self.qkv, self.out, self.table, strict=True):
            q, k, v = (t.view(b, n, self.heads, e).transpose(1, 2) for t in qkv(x).split(d, dim=-1))
            bias = table[self.index].view(n, n, self.heads).permute(2, 0, 1)  # [H, L, S]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias + self.shift + self.visible.log())
            x = x + out(y.transpose(1, 2).reshape(b, n, d))
        return x


def _export(
    tmp_path: pathlib.Path, *, batch_dynamic: bool, blocked_row: bool = False, layers: int = 2
) -> tuple[dx.ExportResult, BiasedAttention, torch.Tensor]:
    torch.manual_seed(0)
    model = BiasedAttention(layers=layers, blocked_row=blocked_row).eval()
    x = torch.randn(3, WINDOW, 32)
    dynamic = {"x": {0: Dim("batch", min=1, max=8)}} if batch_dynamic else None
    res = dx.export(
        model, (x,), out_dir=tmp_path, name="m", target="xnnpack", cache=False, dynamic_shapes=dynamic
    )
    return res, model, x


@pytest.mark.parametrize("batch_dynamic", [False, True], ids=["static", "dynamic_batch"])
def test_a_learned_bias_mask_stays_in_one_delegate(tmp_path: pathlib.Path, batch_dynamic: bool) -> None:
    res, _, _ = _export(tmp_path, batch_dynamic=batch_dynamic)
    assert res.ok, dict(res.errors)  # proved against eager (at min, max-1 and max when dynamic)
    report = dx.compare(res)
    assert report.ok, report
    delegation = res.artifacts["xnnpack"].delegation
    assert delegation is not None
    assert delegation.subgraphs == 1, delegation.summary
    outside = delegation.non_delegated_ops()
    assert not [op for op in outside if "any" in op or "where" in op or "eq" in op], delegation.summary


def test_a_fully_masked_row_gives_eager_zeros(tmp_path: pathlib.Path) -> None:
    """Row 3 sees no key: eager's SDPA gives zeros there; the .pte (guard in XNNPACK's ops) too."""
    from executorch.runtime import Runtime

    res, model, x = _export(tmp_path, batch_dynamic=False, blocked_row=True, layers=1)
    assert res.ok, dict(res.errors)
    delegation = res.artifacts["xnnpack"].delegation
    assert delegation is not None and delegation.subgraphs == 1, delegation and delegation.summary
    with torch.no_grad():
        expected = model(x)
    # eager attended nothing on row 3: the layer added only its output projection's bias there
    assert torch.allclose(expected[:, 3], x[:, 3] + model.out[0].bias, atol=1e-6)
    program = Runtime.get().load_program(str(res.artifacts["xnnpack"].path))
    (got,) = program.load_method("forward").execute([x])
    assert torch.isfinite(got).all()
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4), (got - expected).abs().max()


@pytest.mark.slow  # a control (what the pass fixes); the default run keeps the fix's own checks
def test_without_the_pass_the_guard_splits_the_delegate(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the pass fixes: the guard's ``ne``/``any``/``where`` stay portable between delegates."""
    rest = tuple(p for p in xnnpack_rewrites.AFTER_DECOMPOSITION if not isinstance(p, MaskedRowsAsMax))
    assert len(rest) == len(xnnpack_rewrites.AFTER_DECOMPOSITION) - 1
    monkeypatch.setattr(xnnpack_rewrites, "AFTER_DECOMPOSITION", rest)
    res, _, _ = _export(tmp_path, batch_dynamic=False)
    delegation = res.artifacts["xnnpack"].delegation
    assert delegation is not None
    assert delegation.subgraphs >= 2, delegation.summary
    assert any("any" in op for op in delegation.non_delegated_ops()), delegation.summary


@pytest.mark.parametrize("rank", [3, 4])
def test_the_guard_in_xnnpack_ops_gives_the_same_values(rank: int) -> None:
    """The pass on the guard alone: the additive mask and the row factor computed from clamp and
    a row max equal the ``where``/``any`` forms where it matters: the factor exactly, the
    additive mask exactly on visible rows (``-inf`` -> ``finfo.min``) and finite on masked ones;
    a dynamic key length is left alone (XNNPACK's max pooling has a fixed size)."""

    class Guard(nn.Module):
        def forward(self, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            visible = (m != float("-inf")).any(-1, keepdim=True)
            return torch.where(visible, m, 0.0), visible.to(m.dtype)

    m = torch.randn([2, 3, 5, 7][4 - rank :])
    m[..., 1, :] = float("-inf")  # a fully masked row
    m[..., 2, :3] = float("-inf")  # a partly masked one
    ep = torch.export.export(Guard(), (m,)).run_decompositions({})
    MaskedRowsAsMax()(ep)
    left = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert not left & {"aten.any.dim", "aten.ne.Scalar", "aten.where.self"}, left
    additive, factor = ep.module()(m)
    expected_add, expected_factor = Guard()(m)
    assert torch.equal(factor, expected_factor)
    lowest = torch.finfo(m.dtype).min
    assert torch.equal(additive[..., 0, :], expected_add[..., 0, :])
    assert torch.equal(additive[..., 2, :], expected_add[..., 2, :].clamp(min=lowest))
    assert torch.isfinite(additive).all()

    dynamic = torch.export.export(Guard(), (m,), dynamic_shapes={"m": {rank - 1: Dim("keys", min=2, max=16)}})
    dynamic = dynamic.run_decompositions({})
    MaskedRowsAsMax()(dynamic)
    assert any(n.target is torch.ops.aten.any.dim for n in dynamic.graph.nodes)

    # a dynamic query length (the rows) is taken: the views to 4-D write it -1
    rows = torch.export.export(Guard(), (m,), dynamic_shapes={"m": {rank - 2: Dim("rows", min=3, max=16)}})
    rows = rows.run_decompositions({})
    MaskedRowsAsMax()(rows)
    assert not any(n.target is torch.ops.aten.any.dim for n in rows.graph.nodes)
    longer = torch.cat([m, m], dim=rank - 2)
    additive, factor = rows.module()(longer)
    assert torch.equal(factor, Guard()(longer)[1])
    assert torch.isfinite(additive).all()


class PaddedBiasEncoder(nn.Module):
    """T5's form served with a dynamic batch *and* sequence: a learned per-head bias ``[1, H, S, S]``
    where a key is real, ``-inf`` where it is padding, so an all-padding sequence has every query
    row fully masked (eager: zeros), and the key length is dynamic (no fixed-size max pooling)."""

    def __init__(self, dim: int = 32, heads: int = 4, layers: int = 2, max_seq: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.k = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.v = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.bias = nn.Parameter(torch.randn(1, heads, max_seq, max_seq))

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        keep = attention_mask.bool()[:, None, None, :]
        mask = torch.where(keep, self.bias[:, :, :s, :s], float("-inf"))
        for q, k, v, out in zip(self.q, self.k, self.v, self.out, strict=True):
            heads = [t(x).view(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v)]
            y = F.scaled_dot_product_attention(*heads, attn_mask=mask)
            x = x + out(y.transpose(1, 2).reshape(b, s, d))
        return x


def test_a_dynamic_key_length_guard_is_delegated_with_eager_zeros(tmp_path: pathlib.Path) -> None:
    """With the key length dynamic, the per-head form (``xnnpack_heads._row_guard``) writes the
    guard as clamp and a count of visible keys (a bmm against ones): no ``ne``/``any``/``where``
    of the guard and no select of its row factor outside XNNPACK; an all-padding sequence gives
    eager's zeros (each layer adds only its output bias), a partly padded one eager's values."""
    from executorch.runtime import Runtime

    torch.manual_seed(0)
    model = PaddedBiasEncoder().eval()
    x = torch.randn(3, 7, 32)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, :] = 0  # all padding: every row fully masked
    batch, seq = Dim("batch", min=1, max=6), Dim("seq", min=2, max=16)
    spec = ({0: batch, 1: seq}, {0: batch, 1: seq})
    res = dx.export(
        model, (x, mask), out_dir=tmp_path, name="m", target="xnnpack", cache=False, dynamic_shapes=spec
    )
    assert res.ok, dict(res.errors)  # proved against the shared program at min, max-1 and max
    d = res.artifacts["xnnpack"].delegation
    assert d is not None and d.subgraphs <= 2, d.to_markdown()
    outside = {op: n for op, (_, n) in d.by_op.items() if n}
    assert not [op for op in outside if "any" in op or "ne_scalar" in op], d.to_markdown()
    assert outside.get("aten_where_self", 0) <= 1, d.to_markdown()  # the model's own where
    # per head: the mask's selects, not the row factor's
    assert outside.get("aten_select_copy_int", 0) <= model.heads, d.to_markdown()
    with torch.no_grad():
        expected = model(x, mask)
    assert float(expected[0].std()) > 1e-2
    want_padded = x[2] + sum(o.bias for o in model.out)
    assert torch.allclose(expected[2], want_padded.expand_as(expected[2]), atol=1e-5)
    program = Runtime.get().load_program(str(res.artifacts["xnnpack"].path))
    (got,) = program.load_method("forward").execute([x, mask])
    assert torch.isfinite(got).all()
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4), (got - expected).abs().max()
    res.verify_weights()
