"""Functions a model writes out op by op for which XNNPACK has one kernel, written as that kernel's
op on the XNNPACK program once decomposed (the shared program is never edited).

* GELU by its definition, ``x * 0.5 * (1 + erf(x / sqrt(2)))`` (ESM's own ``gelu``, and older
  code that predates ``F.gelu``): ExecuTorch 1.4.1's XNNPACK partitioner has no ``erf``, so each
  feed-forward block left ``erf`` outside the delegate, split around it (a tiny ESM with rotary
  embeddings: 3 subgraphs). ``aten.gelu`` (exact, not the tanh approximation) is the same function;
  both targets are still compared with eager, and the values agree to float rounding.
* A masked fill of attention scores just before their softmax, ``where(m, c, s)`` with ``c`` a
  huge negative (``finfo.min``, ``-inf``: DeBERTa's ``masked_fill(~mask, finfo.min)``, eager
  attention in older code), written as ``s + where(m, c, 0)``. XNNPACK has no ``where``; the
  fill sat between the scores' ``bmm`` and the softmax, so every layer split the delegate (tiny
  DeBERTa-v2, static: 3 subgraphs). In the sum the ``where`` reads only the mask, so it runs
  before the delegate. The softmax is the same bit for bit: a visible score is ``s + 0``; a
  masked one is ``c`` or ``s + c``, both underflowing to 0 beside a visible score, and equal
  (``s + c == c`` in float arithmetic for ``|s|`` below ``2 ** -24 * |c|``) in a row with none.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.export import ExportedProgram

from ..shared_state.passes.base import ProgramPass
from ..shared_state.passes.graph_edit import (
    COPY_OPS,
    NodeRewrite,
    call,
    constant_scalar,
    fake_mode_of,
    lift_constant,
    replace_all_uses,
    structure,
)

__all__ = ["ErfGelu", "MaskedScoresAsSum", "HUGE_NEGATIVE"]

aten = torch.ops.aten
_MUL = (aten.mul.Tensor, aten.mul.Scalar)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _factors(node: Any, depth: int = 2) -> list[Any]:
    """The operands of a product of ``mul`` nodes (each read only by the product), flattened."""
    if depth and isinstance(node, torch.fx.Node) and node.target in _MUL and len(node.users) <= 1:
        return [f for a in node.args for f in _factors(a, depth - 1)]
    return [node]


def _erf_argument(node: Any) -> Any:
    """``x`` when ``node`` is ``1 + erf(x / sqrt(2))`` (or ``erf(x * (1 / sqrt(2)))``)."""
    if not isinstance(node, torch.fx.Node) or node.target not in (aten.add.Tensor, aten.add.Scalar):
        return None
    if len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1:
        return None
    a, b = node.args
    erf, one = (a, b) if _number(b) is not None else (b, a)
    if _number(one) != 1.0 or not isinstance(erf, torch.fx.Node) or erf.target is not aten.erf.default:
        return None
    inner = erf.args[0]
    if not isinstance(inner, torch.fx.Node) or len(inner.args) != 2:
        return None
    x, c = inner.args
    c = _number(c)
    if c is None:
        return None
    if inner.target in (aten.div.Tensor, aten.div.Scalar) and math.isclose(c, math.sqrt(2.0), rel_tol=1e-6):
        return x
    if inner.target in _MUL and math.isclose(c, math.sqrt(0.5), rel_tol=1e-6):
        return x
    return None


class ErfGelu(NodeRewrite):
    """``x * 0.5 * (1 + erf(x / sqrt(2)))``, in any order of its products -> ``gelu(x)``."""

    serves = "xnnpack"

    def rewrite(self, program: ExportedProgram, node: torch.fx.Node) -> tuple[Any, tuple[Any, ...]] | None:
        if node.target not in _MUL:
            return None
        factors = [f for a in node.args for f in _factors(a, 1)]
        numbers = [f for f in factors if _number(f) is not None]
        tensors = [f for f in factors if _number(f) is None]
        if [_number(n) for n in numbers] != [0.5] or len(tensors) != 2:
            return None
        for x, bracket in (tensors, tensors[::-1]):
            val = getattr(x, "meta", {}).get("val")
            if _erf_argument(bracket) is x and isinstance(val, torch.Tensor) and val.is_floating_point():
                return aten.gelu.default, (x,)
        return None


#: a fill value at most this (``finfo(float32).min`` is -3.4e38) is "masked out" for a softmax
HUGE_NEGATIVE = -1e30


def _softmax_only(node: torch.fx.Node) -> bool:
    """Whether every reader of ``node`` (through copies) is a softmax over its last dim."""
    rank = len(node.meta["val"].shape)
    for user in node.users:
        if user.target in COPY_OPS:
            if not _softmax_only(user):
                return False
        elif user.target is not aten._softmax.default or user.args[1] not in (-1, rank - 1) or user.args[2]:
            return False
    return bool(node.users)


class MaskedScoresAsSum(ProgramPass):
    """``where(m, c, s)`` (or ``where(m, s, c)``) read only by a softmax over the last dim, ``c``
    a constant at most -1e30, -> ``s + where(m, c, 0)`` (see the module docstring)."""

    serves = "xnnpack"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        graph = program.graph
        fake_mode = fake_mode_of(program)
        zeros: dict[torch.dtype, torch.fx.Node] = {}
        memo: dict[Any, Any] = {}
        masks: dict[Any, torch.fx.Node] = {}  # one additive mask per mask computation and fill
        changed = False
        for node in list(graph.nodes):
            if node.target is not aten.where.self or len(node.args) != 3:
                continue
            cond, a, b = node.args
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor) or not val.is_floating_point() or not _softmax_only(node):
                continue
            fa, fb = constant_scalar(program, a), constant_scalar(program, b)
            if fa is not None and fa <= HUGE_NEGATIVE and isinstance(b, torch.fx.Node) and fb is None:
                scores, fill, fill_first = b, a, True
            elif fb is not None and fb <= HUGE_NEGATIVE and isinstance(a, torch.fx.Node) and fa is None:
                scores, fill, fill_first = a, b, False
            else:
                continue
            if getattr(scores.meta.get("val"), "dtype", None) != val.dtype:
                continue
            if val.dtype not in zeros:
                zeros[val.dtype] = lift_constant(
                    program, torch.zeros((), dtype=val.dtype), fake_mode=fake_mode
                )
            zero = zeros[val.dtype]
            key = (structure(cond, memo), fa if fill_first else fb, fill_first, val.dtype)
            with graph.inserting_before(node):
                if key not in masks:
                    args = (cond, fill, zero) if fill_first else (cond, zero, fill)
                    masks[key] = call(graph, aten.where.self, args, fake_mode=fake_mode)
                total = call(graph, aten.add.Tensor, (scores, masks[key]), fake_mode=fake_mode)
            if total.meta["val"].shape != val.shape:
                graph.erase_node(total)
                continue
            total.meta.update({k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")})
            replace_all_uses(program, node, total)
            graph.erase_node(node)
            changed = True
        if changed:
            graph.eliminate_dead_code()
            graph.lint()
            program.graph_module.recompile()
        return program
