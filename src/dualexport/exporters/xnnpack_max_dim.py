"""XNNPACK's max over one dim of a 4-D tensor, taken where it computes right and dropped where a
softmax makes it redundant, on the XNNPACK program.

Why: ExecuTorch 1.4.1's XNNPACK partitioner takes ``max.dim`` on any 4-D float input whose
indices nothing reads (``MaxDimConfig``), and ``to_edge`` turns it into ``amax``; the node visitor
then accepts only ``dim == 2 or dim == 3`` as written, so ``x.max(dim=-1, keepdim=True).values``
(GPT-OSS's attention sinks: the scores' row maximum before their softmax) failed the whole lowering
("amax.default only supports dim == 2 or dim == 3"). ``dim % 4`` is the same reduction.

Taken, the max runs in XNNPACK's channels-last layout, and a ``softmax`` over the last dim that
reads the shifted scores in the same delegate is then computed over the wrong dim (a 4-D
``softmax(x - x.max(-1, keepdim=True).values, -1)`` on ExecuTorch 1.4.1: SNR -2 dB; the prove
step refuses the file). That shift is the hand-written "stable softmax": a softmax subtracts its
row maximum itself and is unchanged by any shift of a row, so ``softmax(x - max(x))`` is written
as ``softmax(x)`` (equal up to float rounding) and the max is gone.

The shared program is never edited: both run on the XNNPACK program after its decomposition.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.export import ExportedProgram

from ..shared_state.passes.base import ProgramPass
from ..shared_state.passes.graph_edit import NodeRewrite, finish_edit

__all__ = ["MaxDimFromFront", "ShiftedSoftmax"]

aten = torch.ops.aten


class MaxDimFromFront(NodeRewrite):
    """``max.dim(x, d)`` with ``d < 0`` on a 4-D input -> ``max.dim(x, d % 4)``."""

    serves = "xnnpack"

    def rewrite(self, program: ExportedProgram, node: torch.fx.Node) -> tuple[Any, tuple[Any, ...]] | None:
        if node.target is not aten.max.dim or len(node.args) < 2 or node.kwargs:
            return None
        x, dim, *rest = node.args
        val = getattr(x, "meta", {}).get("val")
        if not isinstance(dim, int) or dim >= 0 or not isinstance(val, torch.Tensor) or val.dim() != 4:
            return None
        return aten.max.dim, (x, dim % 4, *rest)


def _row_max_of(node: Any, x: torch.fx.Node, dim: int) -> bool:
    """Whether ``node`` is ``max.dim(x, dim, keepdim=True).values``, read by nothing else."""
    if not isinstance(node, torch.fx.Node) or node.target is not operator.getitem or node.args[1] != 0:
        return False
    reduce = node.args[0]
    if not isinstance(reduce, torch.fx.Node) or reduce.target is not aten.max.dim or reduce.args[0] is not x:
        return False
    rank, axis = len(x.meta["val"].shape), reduce.args[1]
    keep = reduce.args[2] if len(reduce.args) > 2 else reduce.kwargs.get("keepdim", False)
    return bool(keep) and isinstance(axis, int) and axis % rank == dim and len(node.users) == 1


class ShiftedSoftmax(ProgramPass):
    """``softmax(x - max(x, d, keepdim=True).values, d)`` -> ``softmax(x, d)`` (the shift read by
    nothing else; see the module docstring)."""

    serves = "xnnpack"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        graph = program.graph
        changed = False
        for node in list(graph.nodes):
            if node.target is not aten._softmax.default:
                continue
            shifted, dim = node.args[0], node.args[1]
            if not isinstance(shifted, torch.fx.Node) or shifted.target is not aten.sub.Tensor:
                continue
            if len(shifted.users) != 1 or len(shifted.args) != 2 or shifted.kwargs:
                continue
            x, m = shifted.args
            if not isinstance(x, torch.fx.Node) or not _row_max_of(m, x, int(dim) % len(x.meta["val"].shape)):
                continue
            if x.meta["val"].shape != shifted.meta["val"].shape:
                continue
            node.replace_input_with(shifted, x)
            changed = True
        return finish_edit(program) if changed else program
