"""Index arithmetic that computes nothing, and table lookups whose index is one value everywhere,
written as what they are on the shared program (both targets get them).

Why: a text encoder's embeddings begin with integer index work that XNNPACK cannot take (it has
no int64 and no gather) and ONNX Runtime runs node by node. Two parts of it compute nothing that
depends on the input:

* ``IntegerIdentities``: ``x + 0``, ``x - 0``, ``x * 1`` and ``x // 1`` on an integer tensor
  (RoBERTa's position ids add ``past_key_values_length``, which is 0 in a forward without a
  cache). Exact for integers; floats are left alone (``-0.0 + 0`` is ``+0.0``).
* ``UniformLookup``: ``embedding(W, idx)`` where every element of ``idx`` is provably the same
  value ``k``: traced back through views, expands, slices and gathers to a constant (or buffer)
  whose elements are all ``k``. transformers' BERT-family embeddings look the token types up
  from a registered all-zero buffer (``token_type_ids[:, :seq].expand(batch, seq)``, or a
  ``gather`` of it by position ids), four portable ops (slice, gather, expand, lookup) every
  call. The lookup becomes ``embedding(W, full([1, .., 1], k))``, one row that the ops reading it
  broadcast; that is done only when every reader is an elementwise op whose other operand has the
  full shape, so each reader's result is the same tensor. ``W`` is read whole as before (the
  weight proof sees the same parameter). A gather of a uniform tensor equals it for any index in
  range; an index out of range, which eager refuses, is no longer looked at.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram

from .base import ProgramPass
from .graph_edit import (
    VIEW_OPS,
    call,
    constant_value,
    drop_dead_constants,
    fake_mode_of,
    finish_edit,
    lift_constant,
    mutated_through,
    replace_all_uses,
    same_size,
)

__all__ = ["IntegerIdentities", "UniformLookup", "SAME_VALUES"]

aten = torch.ops.aten

_INTEGER = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
#: op -> the scalar that leaves its first operand as it is
_IDENTITIES = {
    aten.add.Tensor: 0,
    aten.add.Scalar: 0,
    aten.sub.Tensor: 0,
    aten.sub.Scalar: 0,
    aten.mul.Tensor: 1,
    aten.mul.Scalar: 1,
    aten.floor_divide.default: 1,
}
#: ops whose every output element is one of their first input's elements
SAME_VALUES = frozenset(
    {
        *VIEW_OPS,
        aten.expand.default,
        aten.slice.Tensor,
        aten.select.int,
        aten.unsqueeze.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.permute.default,
        aten.clone.default,
        aten.alias.default,
        aten.gather.default,
        aten.index.Tensor,
        aten.index_select.default,
    }
)
#: elementwise readers that broadcast their operands
_BROADCASTING = frozenset({aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor})


def _val(node: Any) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _scalar(program: ExportedProgram, arg: Any) -> int | None:
    """An integer Python scalar, or a one-element integer constant, as an int."""
    if isinstance(arg, int) and not isinstance(arg, bool):
        return arg
    value = constant_value(program, arg)
    if value is not None and value.numel() == 1 and value.dtype in _INTEGER:
        return int(value.reshape(()).item())
    return None


class IntegerIdentities(ProgramPass):
    """``x + 0``, ``x - 0``, ``x * 1``, ``x // 1`` on an integer tensor -> ``x``."""

    serves = "shared"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        changed = False
        outputs = set(program.graph.output_node().all_input_nodes)
        for node in list(program.graph.nodes):
            if node.op != "call_function" or node.target not in _IDENTITIES or node in outputs:
                continue
            if mutated_through(node) or mutated_through(node.args[0]):
                continue  # the copy the op made is written to (T5's ``buckets += ..``), or its input is
            x, other = node.args[0], node.args[1]
            xv, out = _val(x), _val(node)
            if xv is None or out is None or xv.dtype not in _INTEGER or out.dtype != xv.dtype:
                continue
            if node.kwargs.get("alpha", 1) != 1 or _scalar(program, other) != _IDENTITIES[node.target]:
                continue
            if out.dim() != xv.dim() or not all(
                same_size(a, b) for a, b in zip(out.shape, xv.shape, strict=True)
            ):
                continue  # the other operand broadcast x to a larger shape
            replace_all_uses(program, node, x)
            program.graph.erase_node(node)
            changed = True
        if changed:
            finish_edit(program)
        return program


def _uniform(program: ExportedProgram, node: Any, depth: int = 0) -> int | None:
    """The value every element of ``node`` holds, when that follows from a constant (read
    through ops that only pick elements of their first input); None otherwise."""
    if not isinstance(node, torch.fx.Node) or depth > 16:
        return None
    value = constant_value(program, node)
    if value is not None:
        if value.numel() == 0 or value.dtype not in _INTEGER:
            return None
        first = value.reshape(-1)[0]
        return int(first) if bool((value == first).all()) else None
    if node.op == "call_function" and node.target in SAME_VALUES:
        return _uniform(program, node.args[0], depth + 1)
    return None


def _broadcast_readers(node: torch.fx.Node, out: torch.Tensor) -> bool:
    """Whether every reader of ``node`` is an elementwise op whose other operand has ``node``'s
    full shape (then a broadcast row in its place gives each reader the same result)."""
    if not node.users:
        return False
    for user in node.users:
        if user.op != "call_function" or user.target not in _BROADCASTING or len(user.args) != 2:
            return False
        if user.args[0] is node and user.args[1] is node:
            return False
        other = _val(user.args[1] if user.args[0] is node else user.args[0])
        if other is None or other.dim() != out.dim():
            return False
        if not all(same_size(a, b) for a, b in zip(other.shape, out.shape, strict=True)):
            return False
    return True


class UniformLookup(ProgramPass):
    """``embedding(W, idx)`` with every element of ``idx`` equal to ``k`` -> one looked-up row,
    broadcast by its readers."""

    serves = "shared"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        changed = False
        fake_mode = fake_mode_of(program)
        for node in list(program.graph.nodes):
            if node.op != "call_function" or node.target is not aten.embedding.default:
                continue
            index, out = node.args[1], _val(node)
            iv = _val(index)
            if out is None or iv is None or iv.dim() == 0 or not _broadcast_readers(node, out):
                continue
            if mutated_through(node):
                continue
            k = _uniform(program, index)
            if k is None:
                continue
            row = lift_constant(
                program, torch.full([1] * iv.dim(), k, dtype=iv.dtype), meta_from=node, fake_mode=fake_mode
            )
            with program.graph.inserting_before(node):
                new = call(
                    program.graph,
                    aten.embedding.default,
                    (node.args[0], row, *node.args[2:]),
                    node.kwargs,
                    fake_mode=fake_mode,
                )
            new.meta.update(
                {k2: v for k2, v in node.meta.items() if k2 in ("stack_trace", "nn_module_stack")}
            )
            replace_all_uses(program, node, new)
            program.graph.erase_node(node)
            changed = True
        if changed:
            finish_edit(program)
            drop_dead_constants(program)
        return program
