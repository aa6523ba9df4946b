"""WavLM's attention on the XNNPACK target: a gate summed in groups (``.view(.., 2, 4).sum(-1)``)
and ``F.multi_head_attention_forward`` with separate projection weights, whose biases it slices
back out of ``cat([b_q, b_k, b_v])``. XNNPACK has no sum and takes a linear only with a static
bias, so both split the delegate in every layer (tiny WavLM: 5 subgraphs, 92% delegated; 7 and
86% with a dynamic batch). exporters/xnnpack_rewrites.py (the sum as a ``linear`` of ones, in
the reductions group of the decomposition table) and
exporters/xnnpack_partitions.py (``SliceOfConcat``) write them in forms XNNPACK takes."""

from __future__ import annotations

import pathlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

import dualexport as dx
from dualexport.exporters import xnnpack_rewrites
from dualexport.exporters.delegation import STRUCTURAL_OPS
from dualexport.exporters.xnnpack_partitions import SliceOfConcat

SEQ = 12


class GatedBiasAttention(nn.Module):
    """Two layers of WavLM's gated relative-position attention, written as transformers does."""

    def __init__(self, dim: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.proj = nn.ModuleList(nn.ModuleList(nn.Linear(dim, dim) for _ in range(4)) for _ in range(layers))
        self.gate = nn.ModuleList(nn.Linear(dim // heads, 8) for _ in range(layers))
        self.rel = nn.Embedding(2 * SEQ - 1, heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.heads
        pos = torch.arange(n)
        bias = self.rel(pos[:, None] - pos[None, :] + n - 1).permute(2, 0, 1).unsqueeze(0)
        bias = bias.repeat(b, 1, 1, 1).view(b * h, n, n)
        for (q, k, v, out), gate in zip(self.proj, self.gate, strict=True):
            g = gate(x.view(b, n, h, -1).permute(0, 2, 1, 3)).view(b, h, n, 2, 4).sum(-1)
            g_a, g_b = torch.sigmoid(g).chunk(2, dim=-1)
            scale = (g_a * (g_b - 1.0) + 2.0).view(b * h, -1, 1)
            xt = x.transpose(0, 1)
            y, _ = F.multi_head_attention_forward(
                xt, xt, xt, d, h,
                in_proj_weight=None,
                in_proj_bias=torch.cat((q.bias, k.bias, v.bias)),
                bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0,
                out_proj_weight=out.weight, out_proj_bias=out.bias,
                training=False, attn_mask=scale * bias, need_weights=False,
                use_separate_proj_weight=True,
                q_proj_weight=q.weight, k_proj_weight=k.weight, v_proj_weight=v.weight,
            )  # fmt: skip
            x = x + y.transpose(0, 1)
        return x


def _export(tmp_path: pathlib.Path, batch_dynamic: bool) -> dx.ExportResult:
    torch.manual_seed(0)
    dynamic = {"x": {0: Dim("batch", min=1, max=8)}} if batch_dynamic else None
    return dx.export(
        GatedBiasAttention().eval(),
        (torch.randn(2, SEQ, 32),),
        out_dir=tmp_path,
        name="m",
        target="xnnpack",
        cache=False,
        dynamic_shapes=dynamic,
    )


@pytest.mark.parametrize("batch_dynamic", [False, True], ids=["static", "dynamic_batch"])
def test_gated_attention_stays_in_one_delegate(tmp_path: pathlib.Path, batch_dynamic: bool) -> None:
    res = _export(tmp_path, batch_dynamic)
    assert res.ok, dict(res.errors)
    report = dx.compare(res)
    assert report.ok, report
    delegation = res.artifacts["xnnpack"].delegation
    assert delegation is not None
    # the position bias's gather and batch repeat stay portable, before the layers: one delegate
    # for both layers, and one for the bias's permute between the two ops
    assert delegation.subgraphs <= 2, delegation.summary
    outside = set(delegation.non_delegated_ops()) - STRUCTURAL_OPS
    assert outside <= {"aten_embedding_default", "aten_repeat_default"}, delegation.summary


@pytest.mark.slow  # a control (what the pass fixes); the default run keeps the fix's own checks
def test_without_the_passes_each_layer_splits_the_delegate(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rest = tuple(p for p in xnnpack_rewrites.AFTER_DECOMPOSITION if not isinstance(p, SliceOfConcat))
    assert len(rest) == len(xnnpack_rewrites.AFTER_DECOMPOSITION) - 1
    monkeypatch.setattr(xnnpack_rewrites, "AFTER_DECOMPOSITION", rest)
    monkeypatch.delitem(xnnpack_rewrites.mean_as_global_pool, torch.ops.aten.sum.dim_IntList)
    res = _export(tmp_path, False)
    delegation = res.artifacts["xnnpack"].delegation
    assert delegation is not None
    assert delegation.subgraphs >= 3, delegation.summary
    outside = " ".join(delegation.non_delegated_ops())
    assert "sum" in outside, delegation.summary


def test_slices_of_a_concatenation_read_its_parts() -> None:
    """Exactly one part (first, middle, the last one to the end, negative dim) -> that part; a
    slice across two parts, or with a step, keeps its slice."""

    class Parts(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
            joined = torch.cat((a, b, c), dim=-1)
            return joined[:, :4], joined[:, 4:6], joined[:, 6:], joined[:, 2:5], joined[:, 0:4:2]

    args = (torch.randn(3, 4), torch.randn(3, 2), torch.randn(3, 5))
    ep = torch.export.export(Parts(), args).run_decompositions({})
    before = [n for n in ep.graph.nodes if n.target is torch.ops.aten.slice.Tensor]
    SliceOfConcat()(ep)
    after = [n for n in ep.graph.nodes if n.target is torch.ops.aten.slice.Tensor]
    assert len(before) >= 5 and len(after) == 2, ep.graph  # across parts, and the stepped one
    outs = ep.module()(*args)
    expected = Parts()(*args)
    assert all(torch.equal(o, e) for o, e in zip(outs, expected, strict=True))


def test_short_last_dim_sums_become_linears_with_their_values() -> None:
    """``sum(-1)`` over a static dim of at most SUM_AS_LINEAR_MAX, keepdim or not -> a linear of
    ones (and a view); a longer dim, another dim or an integer sum keep their ``sum``."""
    from dualexport.exporters.xnnpack_rewrites import SUM_AS_LINEAR_MAX, mean_as_global_pool

    class Sums(nn.Module):
        def forward(
            self, x: torch.Tensor, long: torch.Tensor, ints: torch.Tensor
        ) -> tuple[torch.Tensor, ...]:
            return (
                x.sum(-1),
                x.sum(-1, keepdim=True),
                x[..., :1].sum(-1),
                long.sum(-1),
                x.sum(1),
                ints.sum(-1),
            )

    args = (torch.randn(2, 3, 4), torch.randn(2, SUM_AS_LINEAR_MAX + 1), torch.arange(6).view(2, 3))
    ep = torch.export.export(Sums(), args).run_decompositions(dict(mean_as_global_pool))
    sums = [n for n in ep.graph.nodes if n.target is torch.ops.aten.sum.dim_IntList]
    linears = [n for n in ep.graph.nodes if n.target is torch.ops.aten.linear.default]
    assert len(sums) == 3 and len(linears) == 3, ep.graph
    for got, expected in zip(ep.module()(*args), Sums()(*args), strict=True):
        assert got.shape == expected.shape and torch.allclose(got, expected, atol=1e-6)
