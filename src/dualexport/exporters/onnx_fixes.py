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
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from ..shared_state.passes.graph_edit import call, fake_mode_of
from .xnnpack_attention import copy_program

__all__ = ["contiguous_attention_outputs"]

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
        node.replace_all_uses_with(copy, delete_user_cb=lambda user, keep=copy: user is not keep)
    new.graph.lint()
    new.graph_module.recompile()
    return new
