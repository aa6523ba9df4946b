"""Canonicalizations of the shared program: the same computation, written so that neither
target's library trips over it.

Each one works around a library bug met on ordinary models, preserves semantics exactly (so both
targets and eager agree), and runs on the shared program, so both artifacts get the same graph:

* ``ReshapeForView``: torch.onnx 2.13 fails inside ``run_decompositions`` on a ``view`` whose
  input is non-contiguous once decomposed (a decomposed ``scaled_dot_product_attention`` output
  transposed back, as in T5: "Cannot view a tensor with shape [1, 16, 4, 16] and strides (1024,
  16, 256, 1)"; pytorch#136543 and siblings; the maintainers' advice is reshape). ``reshape``
  decomposes to the same ``view`` wherever the strides allow it and to a copy where they do not.
* ``ContiguousAsCopy``: in the same models the ``contiguous()`` after the transposed attention
  output is dropped when torch.onnx re-traces the decomposed attention (whose output strides
  differ from the fake kernel's), and the reshape after it becomes a ``view`` that then fails on
  the real strides. Where the traced value was non-contiguous, ``contiguous()`` is written as
  the copy it performed (``clone(memory_format=contiguous_format)``), which no re-trace elides.
* ``ExplicitPoolArgs``: ExecuTorch 1.4.1's XNNPACK MaxPool2d config reads ``node.args[2]`` (the
  stride), which is absent when the model used the default stride (``F.max_pool2d(x, 2)``):
  IndexError in ``to_edge_transform_and_lower`` (executorch#21488). Every default argument of the
  pooling call is written out; an average pool without padding says ``count_include_pad=False``
  (the same average: there is no padding to count), the only form XNNPACK takes.
* ``SqueezeOnlyUnitDims``: torch.onnx 2.13 writes ``squeeze(dim)`` of a dim that is never 1 (a
  no-op in eager) as ONNX's ``Squeeze``, which ONNX Runtime refuses; the call names only the
  dims that can be 1.
* ``AssertOnlyScalars`` (``scalars.py``): a tensor value read into an int that only assertions
  read (OPT's dead position mask sized by a cache length) makes ExecuTorch's re-trace fail
  ("Pending unbacked symbols"); the read and its assertions are dropped.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch.export import ExportedProgram

from ...compat.torch import op_schema
from .base import ProgramPass
from .graph_edit import (
    VIEW_OPS,
    call,
    constant_value,
    drop_dead_constants,
    fake_mode_of,
    mutated_through,
    replace_all_uses,
)
from .scalars import AssertOnlyScalars

__all__ = [
    "ReshapeForView",
    "ContiguousAsCopy",
    "ExplicitPoolArgs",
    "IndexAsView",
    "SqueezeOnlyUnitDims",
    "CANONICALIZATIONS",
]

aten = torch.ops.aten


def _finish(program: ExportedProgram) -> None:
    program.graph_module.graph.lint()
    program.graph_module.recompile()


class ReshapeForView(ProgramPass):
    """``view`` -> ``reshape`` (same values; a copy only where the strides need one)."""

    serves = "shared"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        changed = False
        for node in program.graph.nodes:
            if node.op == "call_function" and node.target is aten.view.default and not mutated_through(node):
                node.target = aten.reshape.default
                changed = True
        if changed:
            _finish(program)
        return program


class ContiguousAsCopy(ProgramPass):
    """``contiguous()`` of a value traced non-contiguous -> the explicit copy it performed."""

    serves = "shared"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        changed = False
        for node in program.graph.nodes:
            if node.op != "call_function" or node.target is not aten.contiguous.default:
                continue
            src = node.args[0]
            val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
            fmt = node.kwargs.get("memory_format", torch.contiguous_format)
            if not isinstance(val, torch.Tensor) or fmt is not torch.contiguous_format:
                continue
            from torch.fx.experimental.symbolic_shapes import guard_or_true

            if guard_or_true(val.is_contiguous()):
                continue  # a no-op when traced: nothing to make explicit
            node.target = aten.clone.default
            node.kwargs = {"memory_format": torch.contiguous_format}
            changed = True
        if changed:
            _finish(program)
        return program


_POOLS = {aten.max_pool2d.default: 2, aten.max_pool2d_with_indices.default: 2, aten.avg_pool2d.default: 2}


def _pair(value: object, n: int) -> list[int]:
    if isinstance(value, int):
        return [value] * n
    items = list(value)  # type: ignore[call-overload]
    return items * n if len(items) == 1 else items


class ExplicitPoolArgs(ProgramPass):
    """Pooling calls with every default argument written out (stride = kernel when omitted)."""

    serves = "shared"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        changed = False
        for node in program.graph.nodes:
            n = _POOLS.get(node.target) if node.op == "call_function" else None
            if n is None:
                continue
            schema = op_schema(node.target)
            values = list(node.args) + [
                node.kwargs[a.name] if a.name in node.kwargs else a.default_value
                for a in schema.arguments[len(node.args) :]
            ]
            x, kernel, stride, padding = values[0], _pair(values[1], n), values[2], values[3]
            stride = _pair(stride, n) if stride else list(kernel)
            new = [x, kernel, stride, _pair(padding, n), *values[4:]]
            if node.target is not aten.avg_pool2d.default:
                new[4] = _pair(new[4], n)  # dilation
            else:
                if not any(new[3]):
                    new[5] = False  # count_include_pad means nothing without padding
                if new[6] is None:
                    new = new[:6]  # no divisor override
            new_args = tuple(new)
            if new_args != tuple(node.args) or node.kwargs:
                node.args, node.kwargs = new_args, {}
                changed = True
        if changed:
            _finish(program)
        return program


def _arange_position(program: ExportedProgram, index: object, size: object, rank: int) -> int | None:
    """Where ``index`` (an ``aten.index`` index tensor of rank ``rank``) holds ``arange(size)``:
    the one dim that is not 1, for a constant with those values or an ``arange`` node (plus 0)
    seen through ``unsqueeze``/``view``; None otherwise."""
    if not isinstance(index, torch.fx.Node):
        return None
    val = index.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() != rank or val.dtype not in (torch.int64, torch.int32):
        return None
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    wide = [d for d, s in enumerate(val.shape) if not statically_known_true(s == 1)]
    if len(wide) != 1 or not statically_known_true(val.shape[wide[0]] == size):
        return None
    value = constant_value(program, index)
    if value is not None:
        flat = value.reshape(-1)
        return wide[0] if torch.equal(flat, torch.arange(flat.numel(), dtype=flat.dtype)) else None
    node: Any = index
    while node.op == "call_function" and node.target in (aten.unsqueeze.default, *VIEW_OPS):
        node = node.args[0]
    if node.op == "call_function" and node.target is aten.add.Tensor and node.args[1] == 0:
        node = node.args[0]
    if node.op != "call_function" or node.target is not aten.arange.default or len(node.args) != 1:
        return None
    return wide[0]


def _range_slice(program: ExportedProgram, node: torch.fx.Node) -> tuple[int, int, int] | None:
    """``x[..., idx, ...]`` with one index tensor, a constant 1-D ``arange(a, b)``, and ``None``
    elsewhere: (dim, a, b), the ``slice`` it equals."""
    x, indices = cast(Any, node.args[:2])
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) != 1:
        return None
    d, index = given[0]
    value = constant_value(program, index)
    xv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if value is None or value.dim() != 1 or value.numel() == 0 or not isinstance(xv, torch.Tensor):
        return None
    if value.dtype not in (torch.int64, torch.int32) or not isinstance(xv.shape[d], int):
        return None
    start = int(value[0]) % xv.shape[d]
    if not torch.equal(value % xv.shape[d], torch.arange(start, start + value.numel(), dtype=value.dtype)):
        return None
    return d, start, start + value.numel()


class IndexAsView(ProgramPass):
    """A gather that is a view, written as one: ``x[i0, i1, ...]`` whose index tensors are
    ``arange(x.shape[d])`` each broadcast along its own dim, in order, is ``x`` with size-1 dims
    inserted (``unsqueeze``; transformers' padding-mask expansion, ``mask[batch_idx, None, None,
    kv_idx]``), and ``x[..., arange(a, b), ...]`` with a constant range is a ``slice`` (Falcon's
    fused query/key/value split). Neither XNNPACK nor ONNX Runtime then gathers."""

    serves = "shared"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        changed = False
        fake_mode = fake_mode_of(program)
        for node in list(program.graph.nodes):
            if node.op != "call_function" or node.target is not aten.index.Tensor or mutated_through(node):
                continue
            x, indices = node.args[0], node.args[1]
            xv, out = x.meta.get("val"), node.meta.get("val")
            if not isinstance(out, torch.Tensor) or not isinstance(xv, torch.Tensor):
                continue
            view = None
            cut = _range_slice(program, node)
            if cut is not None:
                with program.graph.inserting_before(node):
                    view = call(program.graph, aten.slice.Tensor, (x, *cut), fake_mode=fake_mode)
            elif len(indices) == xv.dim() and not any(i is None for i in indices):
                positions = [
                    _arange_position(program, i, xv.shape[d], out.dim()) for d, i in enumerate(indices)
                ]
                if any(p is None for p in positions) or positions != sorted(set(positions)):  # type: ignore[type-var]
                    continue
                view = x
                with program.graph.inserting_before(node):
                    for d in range(out.dim()):
                        if d not in positions:
                            view = call(program.graph, aten.unsqueeze.default, (view, d), fake_mode=fake_mode)
            if view is None:
                continue
            replace_all_uses(program, node, view)
            program.graph.erase_node(node)
            changed = True
        if changed:
            program.graph.eliminate_dead_code()
            drop_dead_constants(program)
            _finish(program)
        return program


_SQUEEZES = {aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims}


def _may_be_one(size: Any) -> bool:
    """Whether a size can be 1 anywhere in its range (an int: whether it is 1)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return not statically_known_true(size != 1)


class SqueezeOnlyUnitDims(ProgramPass):
    """``squeeze`` names only the dims that can be 1: one whose size is never 1 (``x[:, 1:]`` of a
    sequence of at least 3, or a static 7) leaves the tensor as it is in eager, but torch.onnx 2.13
    writes it into ONNX's ``Squeeze``, which requires a 1 there: ONNX Runtime refuses to load the
    file ("Dimension of input 1 must be 1 instead of 7") or fails at run time. Such dims are
    dropped from the call, and a call left with none is its input."""

    serves = "shared"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        changed = False
        outputs = set(program.graph.output_node().all_input_nodes)
        for node in list(program.graph.nodes):
            if node.op != "call_function" or node.target not in _SQUEEZES or mutated_through(node):
                continue
            src = node.args[0]
            val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
            if not isinstance(val, torch.Tensor) or val.dim() == 0:
                continue
            if node.target is aten.squeeze.default:
                dims = list(range(val.dim()))
            else:
                arg = node.args[1]
                dims = sorted({d % val.dim() for d in (arg if isinstance(arg, (list, tuple)) else [arg])})
            keep = [d for d in dims if _may_be_one(val.shape[d])]
            if keep == dims:
                continue
            if keep:
                node.target, node.args = aten.squeeze.dims, (src, keep)
            elif node in outputs:  # the signature names it (and an output must not alias an input)
                node.target, node.args = aten.clone.default, (src,)
            else:
                replace_all_uses(program, node, src)
                program.graph.erase_node(node)
            changed = True
        if changed:
            _finish(program)
        return program


#: Run on every shared program by default (ExportOptions.canonicalize), in this order.
CANONICALIZATIONS: tuple[ProgramPass, ...] = (
    ReshapeForView(),
    ContiguousAsCopy(),
    ExplicitPoolArgs(),
    AssertOnlyScalars(),
    SqueezeOnlyUnitDims(),
)
