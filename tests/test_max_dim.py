"""A row maximum over the last dim of 4-D scores on the XNNPACK target (exporters/xnnpack_max_dim.py):
``x.max(dim=-1, keepdim=True).values`` is lowered (ExecuTorch 1.4.1's node visitor took only dims
written 2 or 3), and the hand-written stable softmax with attention sinks (GPT-OSS) computes what
eager computes (taken into the delegate, the max's channels-last layout turned the softmax over the
wrong dim)."""

from __future__ import annotations

import pathlib

import pytest
import torch
from torch import nn

import dualexport as dx
from dualexport.errors import DualExportError


class Sinks(nn.Module):
    """GPT-OSS's eager attention: scores, a learned sink column per head, the row max shifted out
    by hand, softmax, the sink dropped."""

    def __init__(self, heads: int = 4) -> None:
        super().__init__()
        self.sinks = nn.Parameter(torch.randn(heads))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
        sinks = self.sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[-2], -1)
        logits = torch.cat([scores, sinks], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = torch.softmax(logits, dim=-1)[..., :-1]
        return torch.matmul(probs, v)


class RowMax(nn.Module):
    """The max itself as an output, counted from the end (no softmax to absorb it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.max(dim=-1, keepdim=True).values


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 4, 8, 16, generator=g) * 3 for _ in range(3))


@pytest.mark.parametrize("model", [Sinks, RowMax], ids=["sinks_softmax", "row_max"])
def test_row_max_from_the_end_lowers_and_computes_what_eager_does(
    model: type, tmp_path: pathlib.Path
) -> None:
    torch.manual_seed(0)
    m = model().eval()
    args = _inputs()[: 3 if model is Sinks else 1]
    res = dx.export(m, args, out_dir=tmp_path, name="m", target="xnnpack")
    assert res.ok, dict(res.errors)  # the prove step ran: the file computes the shared program
    report = dx.compare(res)
    assert report.ok, report
    delegation = res.artifacts["xnnpack"].delegation
    assert delegation is not None
    # every op of the computation in the delegate (max, softmax, matmuls)
    outside = {op for op, (_, n) in delegation.by_op.items() if n and op not in ("getitem",)}
    assert not outside & {"aten_max_dim", "aten__softmax_default", "aten_bmm_default", "aten_sub_tensor"}, (
        outside
    )


@pytest.mark.xfail(
    strict=True,
    raises=DualExportError,
    reason="ExecuTorch 1.4.1's XNNPACK partitioner takes max.dim on a 4-D input, whose node visitor "
    "then refuses a dim written -1 ('amax.default only supports dim == 2 or dim == 3')",
)
def test_plain_executorch_refuses_a_row_max_from_the_end(tmp_path: pathlib.Path) -> None:
    res = dx.export(
        RowMax().eval(), _inputs()[:1], out_dir=tmp_path, name="m", target="xnnpack", optimize=False
    )
    if not res.ok:
        error = next(iter(res.errors.values()))
        assert "only supports dim == 2 or dim == 3" in str(error), error  # this limit, not another
        raise error
