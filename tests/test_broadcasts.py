"""shared_state/passes/broadcasts.py on programs with a dynamic batch and sequence: operands that
only broadcast a value are read unbroadcast, the same slices of two constants combined are one
folded constant sliced; values equal the eager model's at several sizes, and what is not such an
operand (a needed expand, a parameter, different slices) is left as it is."""

from __future__ import annotations

import torch
from torch import nn
from torch.export import Dim

from dualexport.shared_state.passes import BroadcastOperands, SlicedConstants

aten = torch.ops.aten
MAX = 16


class MaskPrelude(nn.Module):
    """T5's encoder prelude: ``where(expand(all_true[:, :, :S] & pad[:, None, None, :]), bias,
    min)`` and buckets ``a[:S, :S] + b[:S, :S]`` written in place on a copy, plus the two things
    the passes must leave: a parameter's slice added to a constant's, and an ``expand`` that
    gives a ``where`` of scalars its shape."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("query", torch.ones(1, 1, MAX, 1, dtype=torch.bool))
        self.register_buffer("a", torch.arange(MAX * MAX).view(MAX, MAX) % 7)
        self.register_buffer("b", torch.arange(MAX * MAX).view(MAX, MAX) % 5)
        self.table = nn.Parameter(torch.randn(12, 3))
        self.learned = nn.Parameter(torch.randn(MAX, MAX))

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, s = pad.shape
        keep = (self.query[:, :, :s] & pad.bool()[:, None, None, :]).expand(b, -1, s, s)
        buckets = self.a[:s, :s].clone()
        buckets += self.b[:s, :s]
        bias = self.table[buckets].permute(2, 0, 1)[None]  # [1, 3, S, S]
        mask = torch.where(keep, bias, torch.finfo(torch.float32).min)
        shaped = torch.where(pad.bool()[:, None, :].expand(b, s, s), 1.0, 0.0)  # needs its expand
        mixed = self.learned[:s, :s] + self.a[:s, :s]  # a parameter: never folded
        return mask, shaped * x[..., :1], mixed


def _program(model: nn.Module) -> torch.export.ExportedProgram:
    x, pad = torch.randn(2, 5, 4), torch.ones(2, 5, dtype=torch.long)
    batch, seq = Dim("batch", min=1, max=6), Dim("seq", min=2, max=MAX - 1)
    spec = ({0: batch, 1: seq}, {0: batch, 1: seq})
    return torch.export.export(model, (x, pad), dynamic_shapes=spec)


def _ops(program: torch.export.ExportedProgram) -> list[object]:
    return [n.target for n in program.graph.nodes if n.op == "call_function"]


def test_broadcasts_and_sliced_constants_are_dropped_with_the_same_values() -> None:
    torch.manual_seed(0)
    model = MaskPrelude().eval()
    program = _program(model)
    before = _ops(program)
    SlicedConstants()(program)
    BroadcastOperands()(program)
    after = _ops(program)
    # the all-True `&` and the mask's expand are gone; the shaped where keeps its expand
    assert before.count(aten.__and__.Tensor) == 1 and aten.__and__.Tensor not in after, after
    assert after.count(aten.expand.default) == 1, after
    # the in-place bucket sum is a folded constant's slices; the parameter's add stays
    assert aten.add_.Tensor in before and aten.add_.Tensor not in after, after
    assert after.count(aten.add.Tensor) == 1, after
    assert len(program.constants) == 1 and next(iter(program.constants.values())).shape == (MAX, MAX)
    for b, s in [(1, 2), (3, 7), (6, MAX - 1)]:
        x, pad = torch.randn(b, s, 4), torch.randint(0, 2, (b, s))
        with torch.no_grad():
            want, got = model(x, pad), program.module()(x, pad)
        for w, g in zip(want, got, strict=True):
            assert w.shape == g.shape and torch.equal(w, g), (b, s)


def test_different_slices_are_not_combined() -> None:
    class Offset(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("a", torch.arange(MAX * 2).view(2, MAX))
            self.register_buffer("b", torch.arange(MAX * 2).view(2, MAX) * 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = x.shape[0]
            return self.a[:, :s] + self.b[:, 1 : s + 1]

    x = torch.randn(5)
    program = torch.export.export(Offset(), (x,), dynamic_shapes=({0: Dim("s", min=2, max=MAX - 1)},))
    SlicedConstants()(program)
    assert aten.add.Tensor in _ops(program)
    assert torch.equal(program.module()(torch.randn(9)), Offset()(torch.randn(9)))


def test_a_third_operand_from_the_graph_is_not_folded() -> None:
    """``where(c[:s], a[:s], x)``: the first two operands are slices of constants but the third
    is computed, so nothing can be folded (and nothing crashes trying)."""

    class Select(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("c", torch.arange(MAX) % 2 == 0)
            self.register_buffer("a", torch.arange(MAX, dtype=torch.float32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = x.shape[0]
            return torch.where(self.c[:s], self.a[:s], x)

    program = torch.export.export(
        Select(), (torch.randn(5),), dynamic_shapes=({0: Dim("s", min=2, max=MAX - 1)},)
    )
    SlicedConstants()(program)
    assert aten.where.self in _ops(program)
    x = torch.randn(9)
    assert torch.equal(program.module()(x), Select()(x))
