"""Operands that only repeat values, and dynamic slices of two constants combined, written so that
the op reading them does the work (on the shared program: both targets get them).

Why: with a dynamic batch and sequence, a model's mask and index prelude keeps ops that depend on
the symbolic sizes only, which folding cannot remove and XNNPACK cannot take (int64, ``&``,
``expand`` and ``slice`` with symbolic sizes), each one more op outside the delegate and one more
node in ONNX. T5's encoder builds its mask as
``where(expand(query_mask[:, :, :S] & padding[:, None, None, :]), bias, min)``, the query mask a
folded all-True table, and its relative-position buckets as ``a[:S, :S] + b[:S, :S]``, two folded
tables cut to the dynamic length.

* :class:`BroadcastOperands`: an operand of an elementwise op that is only a broadcast of ``x``
  (``expand(x)``, ``x & c`` or ``c & x`` with ``c`` all True) becomes ``x`` when the op's output
  shape stays the same (the op broadcasts by itself). Exact: every element reads the same value.
* :class:`SlicedConstants`: an elementwise op on the same slices of two constants of one shape
  becomes those slices of the op's result on the whole constants, folded: the same op on the
  same elements, exact for every dtype. Parameters are never folded (the weight proof's copies).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram

from .base import ProgramPass
from .fold import FOLD_MAX_BYTES
from .graph_edit import (
    COPY_OPS,
    call,
    constant_value,
    drop_dead_constants,
    fake_mode_of,
    finish_edit,
    lift_constant,
    replace_all_uses,
    same_size,
    shape_of,
)
from .lookups import SAME_VALUES

__all__ = ["BroadcastOperands", "SlicedConstants", "all_true", "repeated"]

aten = torch.ops.aten

_ANDS = (aten.__and__.Tensor, aten.bitwise_and.Tensor, aten.logical_and.default)
#: elementwise ops on tensors that broadcast them (every tensor operand positional)
_ELEMENTWISE = frozenset(
    {
        aten.where.self,
        aten.where.ScalarOther,
        aten.where.ScalarSelf,
        aten.add.Tensor,
        aten.sub.Tensor,
        aten.mul.Tensor,
        aten.div.Tensor,
        aten.maximum.default,
        aten.minimum.default,
        aten.eq.Tensor,
        aten.ne.Tensor,
        aten.lt.Tensor,
        aten.le.Tensor,
        aten.gt.Tensor,
        aten.ge.Tensor,
        aten.logical_or.default,
        aten.bitwise_or.Tensor,
        *_ANDS,
    }
)


def all_true(program: ExportedProgram, node: Any) -> bool:
    """Whether ``node`` is a boolean constant that is all True, or a slice, view or gather of one
    (a dynamic sequence keeps transformers' folded query-side mask ``[1, 1, max, 1]`` as a slice)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in SAME_VALUES:
        node = node.args[0]
    value = constant_value(program, node)
    return value is not None and value.dtype == torch.bool and bool(value.all())


def repeated(program: ExportedProgram, node: Any) -> torch.fx.Node | None:
    """``x`` when ``node`` only broadcasts ``x``'s values: ``expand(x)``, ``x & c``, ``c & x``."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    src: Any = None
    if node.target is aten.expand.default:
        src = node.args[0]
    elif node.target in _ANDS:
        a, b = node.args[:2]
        src = b if all_true(program, a) else a if all_true(program, b) else None
    val, out = getattr(src, "meta", {}).get("val"), node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(out, torch.Tensor) or val.dtype != out.dtype:
        return None
    return src if isinstance(src, torch.fx.Node) and val.dim() <= out.dim() else None


def _broadcast(shapes: list[tuple[Any, ...]]) -> list[Any] | None:
    """The broadcast of ``shapes``, or None when two sizes of one dim are not known equal."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(1, rank + 1):
        sizes = [s[-i] for s in shapes if len(s) >= i]
        big = [x for x in sizes if not same_size(x, 1)]
        if big and not all(same_size(big[0], x) for x in big[1:]):
            return None
        out.append(big[0] if big else 1)
    return out[::-1]


def _keeps_shape(node: torch.fx.Node, args: list[Any]) -> bool:
    shapes = [shape_of(a) if isinstance(a, torch.fx.Node) else () for a in args]
    if any(s is None for s in shapes):
        return False
    shape, want = _broadcast(shapes), shape_of(node)  # type: ignore[arg-type]
    return shape is not None and want is not None and same_size(tuple(shape), tuple(want))


class BroadcastOperands(ProgramPass):
    """``op(expand(x), y)`` and ``op(x & True, y)`` -> ``op(x, y)`` where ``op`` broadcasts alike."""

    serves = "shared"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        changed = False
        for node in program.graph.nodes:
            if node.op != "call_function" or node.target not in _ELEMENTWISE or node.kwargs:
                continue
            args = list(node.args)
            for i in range(len(args)):
                while (src := repeated(program, args[i])) is not None:
                    trial = [*args[:i], src, *args[i + 1 :]]
                    if not _keeps_shape(node, trial):
                        break
                    args = trial
            if args != list(node.args):
                node.args = tuple(args)
                changed = True
        return finish_edit(program) if changed else program


def _slices(program: ExportedProgram, node: Any) -> tuple[torch.fx.Node, tuple[Any, ...]] | None:
    """(constant, the slices cut from it in order) when ``node`` is slices (and copies) of a
    constant; None otherwise."""
    steps: list[Any] = []
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if node.target is aten.slice.Tensor and not node.kwargs:
            steps.append(tuple(node.args[1:]))
        elif node.target not in COPY_OPS:
            return None
        node = node.args[0]
    if not steps or constant_value(program, node) is None:
        return None
    return node, tuple(steps[::-1])


#: in-place ops on a fresh copy (T5's ``buckets += ..`` on a clone): their functional form
_IN_PLACE = {
    aten.add_.Tensor: aten.add.Tensor,
    aten.sub_.Tensor: aten.sub.Tensor,
    aten.mul_.Tensor: aten.mul.Tensor,
    aten.div_.Tensor: aten.div.Tensor,
}


def _functional(node: torch.fx.Node) -> Any:
    """``node``'s op when it is elementwise; for an in-place op, its functional form when it
    writes to a copy that nothing else reads (then only its result sees the write)."""
    if node.target in _ELEMENTWISE:
        return node.target
    if node.target not in _IN_PLACE:
        return None
    written = node.args[0]
    if not isinstance(written, torch.fx.Node) or written.target not in COPY_OPS or len(written.users) != 1:
        return None
    return _IN_PLACE[node.target]


class SlicedConstants(ProgramPass):
    """``op(a[slices], b[slices])`` of two constants -> ``op(a, b)[slices]``, ``op(a, b)`` folded."""

    serves = "shared"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        changed = False
        fake_mode = fake_mode_of(program)
        for node in list(program.graph.nodes):
            op = _functional(node) if node.op == "call_function" else None
            if op is None or len(node.args) < 2:
                continue
            first, second = (_slices(program, a) for a in node.args[:2])
            if first is None or second is None or first[1] != second[1]:
                continue
            a, b = constant_value(program, first[0]), constant_value(program, second[0])
            assert a is not None and b is not None
            if a.shape != b.shape or not isinstance(node.meta.get("val"), torch.Tensor):
                continue
            rest = (*node.args[2:], *node.kwargs.values())
            if any(isinstance(x, torch.fx.Node) for x in rest):
                continue  # a third operand computed in the graph (where(c, a, x)): not foldable
            with torch.no_grad():
                whole = op(a, b, *node.args[2:], **node.kwargs)
            if whole.numel() * whole.element_size() > FOLD_MAX_BYTES:
                continue
            out: torch.fx.Node = lift_constant(program, whole, meta_from=node, fake_mode=fake_mode)
            with program.graph.inserting_before(node):
                for step in first[1]:
                    out = call(program.graph, aten.slice.Tensor, (out, *step), fake_mode=fake_mode)
            replace_all_uses(program, node, out)
            if node.target in _IN_PLACE:  # a write to a copy nothing reads now (DCE keeps it)
                program.graph.erase_node(node)
            changed = True
        if changed:
            finish_edit(program)
            drop_dead_constants(program)
        return program
