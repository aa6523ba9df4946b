"""Graph shapes that split XNNPACK's partitions although every op in them is delegable, fixed on
the XNNPACK program once decomposed (the shared program is never edited).

* A tied weight (GPT-2, Gemma, T5: the output head reads the token embedding's matrix). The
  partitioner puts a linear's weight placeholder in the linear's partition; the same placeholder
  also feeds the embedding's gather, which XNNPACK does not take, and whose output feeds the
  rest of the model. Merging the head's partition with the rest would then make a cycle through
  the gather, so the head stays a partition of its own (GPT-2: 2 subgraphs, Gemma 2: 3).
  ``UntieEmbeddings`` gives the gather its own placeholder: a lifted constant that views the
  same storage (no byte copied in memory; the .pte stored the matrix twice already: once in
  XNNPACK's data for the head, once in the constant buffer for the gather).
* ``x @ W.T`` written out (Falcon's linear layers): decomposed, it is ``mm(x, permute(W))``, and
  XNNPACK takes a matmul only with a static weight, so the transpose ran in one delegate and
  the ``mm`` outside it, twice per layer (Falcon: 12 subgraphs). ``LinearForTransposedWeight``
  writes it as the ``linear`` it is (``matmul``, ``mm`` or ``addmm`` of a transposed weight).
* A weight or bias that is a slice of a concatenation of parameters, the slice being exactly one
  of them: ``F.multi_head_attention_forward`` with separate projection weights (WavLM) slices
  ``cat([b_q, b_k, b_v])`` back into ``b_q``, ``b_k``, ``b_v``. XNNPACK takes a linear only with
  a static bias, so each projection was decomposed to ``expand`` + ``bmm`` and ran outside the
  delegate, splitting it per layer. ``SliceOfConcat`` reads the part directly (the same tensor).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram

from ..shared_state.passes.base import ProgramPass
from ..shared_state.passes.graph_edit import (
    NodeRewrite,
    fake_mode_of,
    finish_edit,
    lift_constant,
    replace_all_uses,
)

__all__ = ["UntieEmbeddings", "LinearForTransposedWeight", "SliceOfConcat", "VIEW_OF"]

aten = torch.ops.aten
_GATHERS = {aten.embedding.default, aten.index_select.default}


#: Attribute of an untied view naming the holder's tensor it views (``_kept_tensors`` reports
#: the holder's object: the view holds no bytes of its own).
VIEW_OF = "_dualexport_view_of"


def _twin(
    program: ExportedProgram, node: torch.fx.Node, tensor: torch.Tensor, fake_mode: Any
) -> torch.fx.Node:
    """A lifted constant that views ``tensor`` (same storage, a distinct object: a parameter's
    second placeholder would be merged back by ExecuTorch's retrace)."""
    view = tensor.detach()
    setattr(view, VIEW_OF, tensor)
    return lift_constant(program, view, prefix="_xnnpack_untied", meta_from=node, fake_mode=fake_mode)


class UntieEmbeddings(ProgramPass):
    """An embedding gather reads a tied weight through its own placeholder (the same tensor)."""

    serves = "xnnpack"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        sig = program.graph_signature
        names = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
        mutated = set(sig.buffers_to_mutate.values())
        fake_mode = fake_mode_of(program)
        changed = False
        for node in [n for n in program.graph.nodes if n.op == "placeholder" and n.name in names]:
            name = names[node.name]
            gathers = [u for u in node.users if u.target in _GATHERS and u.args and u.args[0] is node]
            if not gathers or len(gathers) == len(node.users) or name in mutated:
                continue  # not tied, or nothing else reads it
            tensor = program.state_dict.get(name, program.constants.get(name))
            if not isinstance(tensor, torch.Tensor):
                continue
            own = _twin(program, node, tensor, fake_mode)
            for g in gathers:
                g.args = (own, *g.args[1:])
            changed = True
        if changed:
            program.graph.lint()
            program.graph_module.recompile()
        return program


_TRANSPOSES = {aten.permute.default, aten.t.default, aten.transpose.int}


def _transposed_weight(program: ExportedProgram, node: object) -> torch.fx.Node | None:
    """``W`` when ``node`` is ``W`` transposed (2-D) and ``W`` a weight placeholder."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target not in _TRANSPOSES:
        return None
    args: Any = node.args
    src = args[0]
    if node.target is aten.permute.default and list(args[1]) != [1, 0]:
        return None
    if node.target is aten.transpose.int and sorted(d % 2 for d in args[1:3]) != [0, 1]:
        return None
    sig = program.graph_signature
    weights = {**sig.inputs_to_parameters, **sig.inputs_to_lifted_tensor_constants}
    if not isinstance(src, torch.fx.Node) or src.op != "placeholder" or src.name not in weights:
        return None
    val = src.meta.get("val")
    return src if isinstance(val, torch.Tensor) and val.dim() == 2 else None


class LinearForTransposedWeight(NodeRewrite):
    """``matmul(x, W.T)`` / ``mm(x, W.T)`` -> ``linear(x, W)``; ``addmm(b, x, W.T)`` ->
    ``linear(x, W, b)``."""

    serves = "xnnpack"

    def rewrite(self, program: ExportedProgram, node: torch.fx.Node) -> tuple[Any, tuple[Any, ...]] | None:
        if node.target in (aten.mm.default, aten.matmul.default):
            x, wt, bias = node.args[0], node.args[1], None
        elif node.target is aten.addmm.default and not node.kwargs:
            bias, x, wt = node.args[:3]
        else:
            return None
        weight = _transposed_weight(program, wt)
        xv = getattr(x, "meta", {}).get("val")
        if weight is None or not isinstance(xv, torch.Tensor) or xv.dtype != torch.float32:
            return None
        return aten.linear.default, ((x, weight) if bias is None else (x, weight, bias))


def _concatenated_part(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input of ``cat(xs, d)`` that ``node``, ``slice(cat(xs, d), d, start, end)`` with step
    1, reads exactly (None: a slice across parts, or not that form)."""
    if node.target is not aten.slice.Tensor or not isinstance(node.args[0], torch.fx.Node):
        return None
    source = node.args[0]
    if source.target is not aten.cat.default:
        return None
    parts = source.args[0]
    rank = source.meta["val"].dim()
    dim = (source.args[1] if len(source.args) > 1 else 0) % rank
    sdim, start, end, step = (list(node.args[1:]) + [0, None, None, 1][len(node.args) - 1 :])[:4]
    if not isinstance(sdim, int) or sdim % rank != dim or step != 1:
        return None
    total = source.meta["val"].shape[dim]
    offset = 0
    for part in parts if isinstance(parts, (list, tuple)) else ():
        if not isinstance(part, torch.fx.Node) or not isinstance(size := part.meta["val"].shape[dim], int):
            return None
        to_end = end is None or (isinstance(end, int) and isinstance(total, int) and end >= total)
        stop = offset + size
        if (start == offset or (start is None and offset == 0)) and (
            end == stop or (to_end and stop == total)
        ):
            return part
        offset = stop
    return None


class SliceOfConcat(ProgramPass):
    """``slice(cat(xs, d), d, a, b)`` covering exactly ``xs[i]`` -> ``xs[i]``."""

    serves = "xnnpack"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        changed = False
        for node in list(program.graph.nodes):
            part = _concatenated_part(node) if node.op == "call_function" else None
            if part is not None and str(part.meta["val"].shape) == str(node.meta["val"].shape):
                replace_all_uses(program, node, part)
                changed = True
        return finish_edit(program) if changed else program
