"""Dynamic shapes in the forms ExecuTorch 1.4.1's XNNPACK partitioner takes, on the XNNPACK
program once decomposed (``decomposed["xnnpack"]``; the shared program is never edited).

Why: with a dynamic batch or sequence the partitioner refuses

* a ``view_copy`` whose shape holds a symbolic size (``[s0, 16, 4, 16]``): XNNPACK's
  ``static_reshape`` takes at most one dynamic dimension and it must be written ``-1``
  (executorch PR #7959; ``ViewCopyConfig``). Every attention layer reshapes its heads, so each
  refused view split the delegate (a ViT with a dynamic batch: 22 subgraphs).
  ``SymbolicViews`` writes a shape whose sizes are static but one as that one ``-1`` (the same
  view: the other sizes fix it); a shape with two dynamic sizes (batch and sequence both
  dynamic) has no such form in 1.4.1, and stays as it is.
* a ``slice_copy`` whose input or output is dynamic at all (``SliceCopyConfig``), even along a
  static dim: rotary embeddings' ``rotate_half`` under a dynamic sequence, a classifier's
  ``x[:, 0]`` under a dynamic batch. ``SlicesAsMatmul`` writes such a slice (or ``select``) of a
  float tensor along a static dim as a ``linear`` with a constant 0/1 selection matrix (the dim
  moved last and back with ``permute``, which XNNPACK takes): every output element is one input
  element times 1 plus zeros, the same value for finite inputs (a non-finite element elsewhere
  in the row would reach the result as NaN; eager leaves it out).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram

from ..shared_state.passes.base import ProgramPass
from ..shared_state.passes.graph_edit import VIEW_OPS, call, fake_mode_of, lift_constant, replace_all_uses

__all__ = ["SymbolicViews", "SlicesAsMatmul", "DYNAMIC_PASSES"]

aten = torch.ops.aten


def _static(shape: Any) -> bool:
    return all(isinstance(s, int) for s in shape)


def _one_inferred(out: torch.Size) -> list[int] | None:
    """A view's size argument for the output shape ``out``: its static sizes, and its one
    dynamic size as -1; None when two sizes are dynamic (or a static one is 0: ambiguous)."""
    new = [s if isinstance(s, int) else -1 for s in out]
    if new.count(-1) != 1 or any(s == 0 for s in new):
        return None
    return new


class SymbolicViews(ProgramPass):
    """Views whose size holds symbolic values, with the one dynamic size written -1."""

    serves = "xnnpack"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        changed = False
        for node in program.graph.nodes:
            if node.op != "call_function" or node.target not in VIEW_OPS or len(node.args) < 2:
                continue
            shape = list(node.args[1])
            if all(isinstance(s, int) for s in shape) and shape.count(-1) <= 1:
                continue
            out = node.meta.get("val")
            if not isinstance(out, torch.Tensor):
                continue
            new = _one_inferred(out.shape) if len(shape) == out.dim() else None
            if new is None or new == shape:
                continue
            node.args = (node.args[0], new, *node.args[2:])
            changed = True
        if changed:
            program.graph.eliminate_dead_code()
            program.graph_module.recompile()
        return program


def _selection(size: int, start: int, stop: int) -> torch.Tensor:
    """[stop - start, size]: row i picks element start + i."""
    eye = torch.zeros(stop - start, size)
    eye[torch.arange(stop - start), torch.arange(start, stop)] = 1.0
    return eye


class SlicesAsMatmul(ProgramPass):
    """A slice or select of a dynamic-shaped float tensor along a static dim, as a ``linear``
    with a constant selection matrix (XNNPACK refuses every dynamic slice)."""

    serves = "xnnpack"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        graph = program.graph
        fake_mode = fake_mode_of(program)
        changed = False
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in (aten.slice.Tensor, aten.select.int):
                continue
            x = node.args[0]
            xv, out = getattr(x, "meta", {}).get("val"), node.meta.get("val")
            if not isinstance(xv, torch.Tensor) or not isinstance(out, torch.Tensor):
                continue
            if xv.dtype != torch.float32 or _static(xv.shape) or xv.dim() < 2:
                continue
            dim = node.args[1] % xv.dim() if len(node.args) > 1 else 0
            size = xv.shape[dim]
            if not isinstance(size, int):
                continue
            if node.target is aten.select.int:
                index = node.args[2]
                if not isinstance(index, int):
                    continue
                start = index % size
                stop, step = start + 1, 1
                view = _one_inferred(out.shape)
                if view is None:
                    continue
            else:
                start, stop = (
                    (node.args[2] if len(node.args) > 2 else 0),
                    (node.args[3] if len(node.args) > 3 else size),
                )
                step = node.args[4] if len(node.args) > 4 else 1
                if not all(isinstance(v, int) for v in (start, stop, step)) or step != 1:
                    continue
                start, stop = (
                    max(0, min(start + size if start < 0 else start, size)),
                    max(0, min(stop + size if stop < 0 else stop, size)),
                )
                view = None
                if stop <= start or (start, stop) == (0, size):
                    continue
            last = xv.dim() - 1
            perm = [i for i in range(xv.dim()) if i != dim] + [dim]  # the dim moved last
            weight = lift_constant(
                program, _selection(size, start, stop), prefix="_xnnpack_selection", fake_mode=fake_mode
            )
            with graph.inserting_before(node):
                y = x if dim == last else call(graph, aten.permute.default, (x, perm), fake_mode=fake_mode)
                y = call(graph, aten.linear.default, (y, weight), fake_mode=fake_mode)
                if view is not None:  # select: the picked dim (last, size 1) dropped
                    y = call(graph, aten.view.default, (y, view), fake_mode=fake_mode)
                elif dim != last:
                    back = sorted(range(len(perm)), key=lambda i: perm[i])
                    y = call(graph, aten.permute.default, (y, back), fake_mode=fake_mode)
            replace_all_uses(program, node, y)
            graph.erase_node(node)
            changed = True
        if changed:
            graph.eliminate_dead_code()
            graph.lint()
            program.graph_module.recompile()
        return program


#: The XNNPACK program's dynamic-shape passes, in order (after decomposition).
DYNAMIC_PASSES: tuple[ProgramPass, ...] = (SlicesAsMatmul(), SymbolicViews())
