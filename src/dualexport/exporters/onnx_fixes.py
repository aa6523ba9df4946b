"""Work-arounds for torch.onnx 2.13's decomposition, on the ONNX target's own program (a copy of
the shared program's graph sharing its tensors; the shared program is never edited).

* An attention output merged back into ``[B, L, H * E]`` (transformers' ``out.transpose(1,
  2).reshape(B, L, -1)``) with the batch and the sequence dynamic: traced, SDPA's output has the
  memory order of torch's CPU flash kernel (``[B, L, H, E]``), so the ``reshape`` decomposes into
  a ``view``; torch.onnx's type-promotion pass then runs the graph again on fake tensors, its
  SDPA gives ``[B, H, L, E]`` memory, and the view is impossible: ``ValueError: Cannot view a
  tensor with shape [s0, s1, 4, 8] and strides (32*s1, 8, 8*s1, 1)``, and the ONNX target
  failed (elementwise ops on the way, such as the fully-masked-row factor, keep the traced
  memory order). An explicit contiguous copy of each dynamic-shaped SDPA output makes the traced
  strides the ones the re-run computes, so the reshape decomposes into a copy and a view; the
  copy is an ``Identity`` in the file.
* A mean over the last dim that the shared program writes as XNNPACK's global pooling
  (``llm/canonical.mean_as_global_pool``: ``view(mean(view(x, [-1, 1, 1, D]), [2, 3]), shape)``,
  every RMSNorm of a decoder from ``export_llm``) is written back as ``mean(x, [-1], keepdim)``
  here: the same values, and the only form ONNX Runtime's ``SimplifiedLayerNormFusion`` matches
  (``Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul``; the reshapes around the mean hid each
  RMSNorm from it).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from ..shared_state.passes.graph_edit import (
    COPY_OPS,
    VIEW_OPS,
    call,
    copy_program,
    fake_mode_of,
    replace_all_uses,
    same_size,
    shape_of,
)

__all__ = ["contiguous_attention_outputs", "pooled_means_as_last_dim_means"]

aten = torch.ops.aten
_SDPA = aten.scaled_dot_product_attention.default


def _dynamic_attention(program: ExportedProgram) -> list[str]:
    """Names of the SDPA calls whose output has a dynamic size."""
    names = []
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is not _SDPA:
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and not all(isinstance(s, int) for s in val.shape):
            names.append(node.name)
    return names


def contiguous_attention_outputs(program: ExportedProgram) -> ExportedProgram:
    """``program`` itself when no attention output has a dynamic size; else a copy in which each
    such output is read through an explicit contiguous copy (see the module docstring)."""
    names = _dynamic_attention(program)
    if not names:
        return program
    new = copy_program(program)
    fake_mode = fake_mode_of(new)
    by_name = {n.name: n for n in new.graph.nodes}
    for name in names:
        node = by_name[name]
        with new.graph.inserting_after(node):
            copy = call(
                new.graph,
                aten.clone.default,
                (node,),
                {"memory_format": torch.contiguous_format},
                fake_mode=fake_mode,
            )
        replace_all_uses(program, node, copy, delete_user_cb=lambda user, keep=copy: user is not keep)
    new.graph.lint()
    new.graph_module.recompile()
    return new


def _pooled_mean_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """For ``view(mean(view(x, [-1, 1, 1, D]), [2, 3], True), shape)`` whose result has ``x``'s
    shape with a last dim of 1, ``x`` (read through copies); else None."""
    if node.op != "call_function" or node.target not in VIEW_OPS:
        return None
    mean = node.args[0]
    if not isinstance(mean, torch.fx.Node) or mean.target is not aten.mean.dim or len(mean.users) != 1:
        return None
    if (
        mean.args[1] not in ([2, 3], (2, 3))
        or not (len(mean.args) > 2 and mean.args[2])
        or mean.kwargs.get("dtype")
    ):
        return None
    flat = mean.args[0]
    if not isinstance(flat, torch.fx.Node) or flat.target not in VIEW_OPS or len(flat.users) != 1:
        return None
    x = flat.args[0]
    while isinstance(x, torch.fx.Node) and x.target in COPY_OPS:
        x = x.args[0]
    xs, out, fs = shape_of(x), shape_of(node), shape_of(flat)
    if xs is None or out is None or fs is None or len(xs) != len(out) or len(fs) != 4:
        return None
    if not (
        same_size(out[-1], 1) and same_size(fs[1], 1) and same_size(fs[2], 1) and same_size(fs[3], xs[-1])
    ):
        return None
    if not all(same_size(a, b) for a, b in zip(xs[:-1], out[:-1], strict=True)):
        return None
    return x if isinstance(x, torch.fx.Node) else None


def pooled_means_as_last_dim_means(program: ExportedProgram) -> ExportedProgram:
    """``program`` itself when it has no pooled mean; else a copy with each written as
    ``mean(x, [-1], True)`` (see the module docstring)."""
    names = [n.name for n in program.graph.nodes if _pooled_mean_source(n) is not None]
    if not names:
        return program
    new = copy_program(program)
    fake_mode = fake_mode_of(new)
    by_name = {n.name: n for n in new.graph.nodes}
    for name in names:
        node = by_name[name]
        x = _pooled_mean_source(node)
        assert x is not None  # the copy has the same graph
        with new.graph.inserting_before(node):
            mean = call(new.graph, aten.mean.dim, (x, [-1], True), fake_mode=fake_mode)
        replace_all_uses(program, node, mean)
        dead: torch.fx.Node | None = node
        while isinstance(dead, torch.fx.Node) and dead is not x and not dead.users:  # the view chain
            up = dead.args[0]
            new.graph.erase_node(dead)
            dead = up if isinstance(up, torch.fx.Node) and up.op == "call_function" else None
    new.graph.lint()
    new.graph_module.recompile()
    return new
