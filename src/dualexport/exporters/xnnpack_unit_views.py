"""Attention scores kept in their ``bmm`` layout between the two ``bmm`` of a hand-written
attention, on the XNNPACK program after its decomposition.

Why: an attention written with ``matmul`` (GPT-J, Gemma 2's soft-capped scores, CodeGen, ...)
decomposes into ``bmm`` on ``[H, L, S]`` with views around it: the scores are viewed to
``[1, H, L, S]`` for the scaling, soft cap, mask and softmax, then back to ``[H, L, S]`` for the
second ``bmm``. With a dynamic sequence both views have two symbolic sizes, which ExecuTorch
1.4.1's XNNPACK partitioner refuses (``ViewCopyConfig``: at most one dynamic size, written -1):
each layer's scores left the delegate twice (GPT-J, Gemma 2 with a dynamic sequence: 5
subgraphs for 2 layers).

The two views only add and drop a leading dim of size 1, and what runs between them is
elementwise or a softmax over a later dim: :class:`UnitDimViews` runs that region on the
``[H, L, S]`` tensor itself (the same ops, the same broadcasts, the same values) and drops both
views. Another operand of the region with the leading unit dim (the mask, ``[1, 1, L, S]``) is
read without it: a constant (a folded causal mask) as a new constant, slices and elementwise ops
as the same ops on their inputs without it, anything else through one ``squeeze`` made once per
operand (outside the delegate, like the mask's own ops). The shared program is never edited.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.export import ExportedProgram

from ..shared_state.passes.base import ProgramPass
from ..shared_state.passes.graph_edit import (
    VIEW_OPS,
    Inserter,
    call,
    constant_value,
    fake_mode_of,
    finish_edit,
    lift_constant,
    replace_all_uses,
    same_size,
    shape_of,
)

__all__ = ["UnitDimViews"]

aten = torch.ops.aten

#: ops applied element by element (with broadcasting) that a region may hold
_ELEMENTWISE = frozenset(
    {
        aten.add.Tensor,
        aten.sub.Tensor,
        aten.mul.Tensor,
        aten.div.Tensor,
        aten.add.Scalar,
        aten.sub.Scalar,
        aten.mul.Scalar,
        aten.div.Scalar,
        aten.tanh.default,
        aten.exp.default,
        aten.neg.default,
        aten.sigmoid.default,
        aten.where.self,
        aten.clone.default,
        aten.alias.default,
        aten._to_copy.default,
        aten.maximum.default,
        aten.minimum.default,
        aten.clamp.default,
    }
)
#: elementwise ops a mask operand may be made of (read without its unit dim through them)
_MASK_ELEMENTWISE = _ELEMENTWISE | {
    aten.eq.Tensor,
    aten.ne.Tensor,
    aten.le.Tensor,
    aten.lt.Tensor,
    aten.ge.Tensor,
    aten.gt.Tensor,
    aten.eq.Scalar,
    aten.ne.Scalar,
    aten.bitwise_and.Tensor,
    aten.bitwise_or.Tensor,
    aten.bitwise_not.default,
    aten.logical_not.default,
    aten.logical_and.default,
    aten.logical_or.default,
    aten.where.ScalarSelf,
    aten.where.ScalarOther,
    aten.where.Scalar,
}
_SOFTMAX = frozenset({aten._softmax.default, aten._log_softmax.default})
_ASSERT = aten._assert_tensor_metadata.default
#: the largest constant laid out again without its unit dim
_CONSTANT_BYTES = 16 << 20


def _symbolic(shape: tuple[Any, ...]) -> int:
    return sum(not isinstance(s, int) for s in shape)


def _view_shapes(node: torch.fx.Node) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """(input shape, output shape) of a view, None for another node."""
    if (
        node.op != "call_function"
        or node.target not in VIEW_OPS
        or not isinstance(node.args[0], torch.fx.Node)
    ):
        return None
    src, out = shape_of(node.args[0]), shape_of(node)
    return None if src is None or out is None else (src, out)


def _with_unit_dim(big: tuple[Any, ...], small: tuple[Any, ...]) -> bool:
    """Whether ``big`` is ``small`` behind a leading dim of size 1."""
    return len(big) == len(small) + 1 and same_size(big[0], 1) and same_size(big[1:], small)


def _adds_unit_dim(node: torch.fx.Node) -> bool:
    """A view of a tensor with two or more symbolic sizes to the same shape behind a new leading
    dim of size 1 (what XNNPACK cannot reshape)."""
    shapes = _view_shapes(node)
    return shapes is not None and _symbolic(shapes[0]) >= 2 and _with_unit_dim(shapes[1], shapes[0])


def _drops_unit_dim(node: torch.fx.Node) -> bool:
    """A view that drops a leading dim of size 1 and changes nothing else."""
    shapes = _view_shapes(node)
    return shapes is not None and _with_unit_dim(shapes[0], shapes[1])


class _Region:
    """The nodes between a view that adds the unit dim and the views that drop it."""

    def __init__(self, start: torch.fx.Node, rank: int) -> None:
        self.start, self.rank = start, rank
        self.nodes: list[torch.fx.Node] = []  # in graph order once sorted
        self.exits: list[torch.fx.Node] = []
        self.asserts: list[torch.fx.Node] = []
        self.operands: list[torch.fx.Node] = []  # other tensors read, of the region's rank

    @classmethod
    def of(cls, start: torch.fx.Node) -> _Region | None:
        rank = len(shape_of(start) or ())
        region = cls(start, rank)
        inside = {start}
        todo = [start]
        while todo:
            node = todo.pop()
            for user in node.users:
                if user in inside or user in region.exits or user in region.asserts:
                    continue
                if user.target is _ASSERT:
                    region.asserts.append(user)
                elif _drops_unit_dim(user) and user.args[0] is node:
                    region.exits.append(user)
                elif region._admits(user):
                    inside.add(user)
                    region.nodes.append(user)
                    todo.append(user)
                else:
                    return None
        if not region.exits:
            return None
        for node in region.nodes:  # every input is the region's, a number, or a readable operand
            for arg in node.all_input_nodes:
                if arg in inside:
                    continue
                shape = shape_of(arg)
                if shape is None:
                    return None
                if len(shape) == rank:
                    if not same_size(shape[0], 1):
                        return None
                    region.operands.append(arg)
        order = {n: i for i, n in enumerate(start.graph.nodes)}
        region.nodes.sort(key=order.__getitem__)
        return region

    def _admits(self, node: torch.fx.Node) -> bool:
        shape = shape_of(node)
        if (
            node.op != "call_function"
            or shape is None
            or len(shape) != self.rank
            or not same_size(shape[0], 1)
        ):
            return False
        if node.target in _SOFTMAX:
            dim = node.args[1]
            return isinstance(dim, int) and dim % self.rank != 0
        return node.target in _ELEMENTWISE


class UnitDimViews(ProgramPass):
    """Views that add a leading unit dim to a tensor with two symbolic sizes, elementwise ops and
    softmaxes, then views that drop it -> the ops on the tensor itself (see the module docstring)."""

    serves = "xnnpack"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        graph = program.graph
        fake_mode = fake_mode_of(program)
        dropped: dict[torch.fx.Node, torch.fx.Node] = {}
        changed = False
        for start in [n for n in graph.nodes if _adds_unit_dim(n)]:
            region = _Region.of(start)
            if region is not None:
                self._rewrite(program, region, fake_mode, dropped)
                changed = True
        return finish_edit(program) if changed else program

    def _rewrite(
        self,
        program: ExportedProgram,
        region: _Region,
        fake_mode: Any,
        dropped: dict[torch.fx.Node, torch.fx.Node],
    ) -> None:
        """The region's ops again on the tensor without its unit dim; the exit views' readers
        read them (the old region is dead code then)."""
        graph = program.graph
        values: dict[torch.fx.Node, Any] = {region.start: region.start.args[0]}
        for operand in region.operands:
            values[operand] = self._without_unit_dim(program, operand, fake_mode, dropped)
        for node in region.nodes:
            mapped: Any = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: values.get(a, a))
            args, kwargs = mapped
            if node.target in _SOFTMAX and args[1] >= 0:
                args = (args[0], args[1] - 1, *args[2:])
            with graph.inserting_before(node):
                new = call(graph, node.target, args, kwargs, fake_mode=fake_mode)
            new.meta.update({k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")})
            values[node] = new
        for exit_view in region.exits:
            replace_all_uses(program, exit_view, values[exit_view.all_input_nodes[0]])
        for check in region.asserts:
            graph.erase_node(check)

    def _without_unit_dim(
        self,
        program: ExportedProgram,
        node: torch.fx.Node,
        fake_mode: Any,
        memo: dict[torch.fx.Node, torch.fx.Node],
    ) -> torch.fx.Node:
        """``node`` (leading dim of size 1) without that dim, made where its inputs are."""
        if node in memo:
            return memo[node]
        graph = program.graph
        value = constant_value(program, node)
        rank = len(shape_of(node) or ())
        out: torch.fx.Node
        if value is not None and value.dim() == rank and value.nbytes <= _CONSTANT_BYTES:
            out = lift_constant(
                program, value[0].clone(), prefix="_xnnpack_unit", meta_from=node, fake_mode=fake_mode
            )
        elif node.op == "call_function" and self._reads_through(node, rank):
            mapped: Any = torch.fx.node.map_arg(
                (node.args, node.kwargs),
                lambda a: (
                    self._without_unit_dim(program, a, fake_mode, memo)
                    if len(shape_of(a) or ()) == rank
                    else a
                ),
            )
            args, kwargs = mapped
            if node.target is aten.slice.Tensor:
                args = (args[0], args[1] % rank - 1, *args[2:])
            elif node.target is aten.expand.default:
                args = (args[0], list(args[1])[1:], *args[2:])
            with graph.inserting_before(node):
                out = call(graph, node.target, args, kwargs, fake_mode=fake_mode)
        else:
            out = Inserter(graph, node, fake_mode)(aten.squeeze.dims, (node, [0]))
        memo[node] = out
        return out

    @staticmethod
    def _reads_through(node: torch.fx.Node, rank: int) -> bool:
        """Whether ``node`` computes its value without its unit dim from its inputs' without it:
        a slice of a later dim, an expand that keeps the unit dim, or elementwise ops whose
        operands of its rank all have the unit dim."""
        if node.target is operator.getitem:
            return False
        if node.target is aten.slice.Tensor:
            dim = node.args[1] if len(node.args) > 1 else 0
            return isinstance(dim, int) and dim % rank != 0
        if node.target is aten.expand.default:
            sizes = node.args[1]
            return isinstance(sizes, (list, tuple)) and len(sizes) == rank and same_size(sizes[0], 1)
        if node.target not in _MASK_ELEMENTWISE:
            return False
        for arg in node.all_input_nodes:
            shape = shape_of(arg)
            if shape is None or (len(shape) == rank and not same_size(shape[0], 1)):
                return False
        return True
