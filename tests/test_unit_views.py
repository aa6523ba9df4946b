"""A hand-written ``matmul`` attention under a dynamic sequence on the XNNPACK target
(exporters/xnnpack_unit_views.py): the scores' views to ``[1, H, L, S]`` and back (two symbolic
sizes: XNNPACK refuses them) are dropped and the scaling, soft cap, mask and softmax run on the
``bmm`` layout: one delegate instead of one split per view (GPT-J, Gemma 2: 5 subgraphs for 2
layers), with the values eager computes."""

from __future__ import annotations

import math
import pathlib

import pytest
import torch
from torch import nn
from torch.export import Dim

import dualexport as dx
from dualexport.exporters import xnnpack_rewrites
from dualexport.exporters.xnnpack_unit_views import UnitDimViews


class MatmulAttention(nn.Module):
    """GPT-J's / Gemma 2's eager attention, one head group per layer: ``matmul`` scores, a scale,
    an optional soft cap (``tanh``), a causal mask sliced from a buffer, softmax, ``matmul``."""

    def __init__(self, dim: int = 32, heads: int = 4, layers: int = 2, softcap: float | None = 5.0) -> None:
        super().__init__()
        self.heads, self.softcap = heads, softcap
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.register_buffer("causal", torch.ones(1, 1, 64, 64, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        e = d // self.heads
        for qkv, out in zip(self.qkv, self.out, strict=True):
            q, k, v = (t.view(b, n, self.heads, e).transpose(1, 2) for t in qkv(x).split(d, dim=-1))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(e)
            if self.softcap is not None:
                scores = torch.tanh(scores / self.softcap) * self.softcap
            scores = torch.where(self.causal[:, :, :n, :n], scores, torch.finfo(scores.dtype).min)
            probs = torch.softmax(scores, dim=-1)
            x = x + out(torch.matmul(probs, v).transpose(1, 2).reshape(b, n, d))
        return x


def _export(tmp_path: pathlib.Path, softcap: float | None) -> dx.ExportResult:
    torch.manual_seed(0)
    model = MatmulAttention(softcap=softcap).eval()
    x = torch.randn(1, 12, 32)
    return dx.export(
        model,
        (x,),
        out_dir=tmp_path,
        name="m",
        target="xnnpack",
        cache=False,
        dynamic_shapes={"x": {1: Dim("seq", min=2, max=48)}},
    )


@pytest.mark.parametrize("softcap", [5.0, None], ids=["soft_capped", "plain_scores"])
def test_scores_stay_in_one_delegate_and_compute_what_eager_does(
    tmp_path: pathlib.Path, softcap: float | None
) -> None:
    res = _export(tmp_path, softcap)
    assert res.ok, dict(res.errors)  # the prove step ran at the range's edges
    report = dx.compare(res)
    assert report.ok, report
    delegation = res.artifacts["xnnpack"].delegation
    assert delegation is not None
    assert delegation.subgraphs == 1, delegation.summary
    assert "aten_view_copy_default" not in delegation.non_delegated_ops(), delegation.summary


def test_without_the_pass_each_view_splits_the_delegate(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the pass fixes: with it left out, the views stay portable between the delegates."""
    rest = tuple(p for p in xnnpack_rewrites.AFTER_DECOMPOSITION if not isinstance(p, UnitDimViews))
    assert len(rest) == len(xnnpack_rewrites.AFTER_DECOMPOSITION) - 1
    monkeypatch.setattr(xnnpack_rewrites, "AFTER_DECOMPOSITION", rest)
    res = _export(tmp_path, 5.0)
    delegation = res.artifacts["xnnpack"].delegation
    assert delegation is not None
    assert delegation.subgraphs >= 4, delegation.summary  # two views per layer, 2 layers
    assert "aten_view_copy_default" in delegation.non_delegated_ops()


def test_a_region_with_another_op_is_left_alone() -> None:
    """A reduction over the unit dim's neighbour (not elementwise) keeps the views: the pass only
    drops a dim nothing between the views can see."""

    class SumOverHeads(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            s = torch.bmm(a, b).view(1, a.shape[0], a.shape[1], b.shape[2])
            return s.sum(dim=1, keepdim=True).view(1, a.shape[1], b.shape[2]) + 1

    seq = Dim("seq", min=2, max=16)
    ep = torch.export.export(
        SumOverHeads(),
        (torch.randn(4, 6, 8), torch.randn(4, 8, 6)),
        dynamic_shapes={"a": {1: seq}, "b": {2: seq}},
    ).run_decompositions({})
    before = [n.name for n in ep.graph.nodes if n.target is torch.ops.aten.view.default]
    UnitDimViews()(ep)
    after = [n.name for n in ep.graph.nodes if n.target is torch.ops.aten.view.default]
    assert before and after == before


def test_bloom_with_a_dynamic_sequence_loads_and_stays_in_one_delegate(tmp_path: pathlib.Path) -> None:
    """BLOOM's ``scores.view(B, H, L, -1)`` gives the key length as ``(s**2)//s``: equal to ``s``,
    but not the same expression. The unit-dim views were then kept (4 of them outside XNNPACK, 5
    subgraphs), and ExecuTorch refused to load the .pte (error 0x21 planning a tensor of that
    size). ``graph_edit.same_size`` asks the shape environment: 1 subgraph, loaded, proven."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import BloomConfig, BloomModel

    torch.manual_seed(0)
    config = BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=100)
    model = BloomModel(config).eval()
    ids = torch.randint(0, 100, (1, 9))
    res = dx.export(
        model,
        (ids,),
        out_dir=tmp_path,
        name="bloom",
        target="xnnpack",
        cache=False,
        dynamic_shapes={"input_ids": {1: Dim("seq", min=2, max=32)}},
    )
    assert res.ok, dict(res.errors)  # loaded and proven at the range's edges
    delegation = res.artifacts["xnnpack"].delegation
    assert delegation is not None
    assert delegation.subgraphs == 1, delegation.summary
    assert "aten_view_copy_default" not in delegation.non_delegated_ops(), delegation.summary
