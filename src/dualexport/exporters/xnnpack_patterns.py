"""Functions a model writes out op by op for which XNNPACK has one kernel, written as that kernel's
op on the XNNPACK program once decomposed (the shared program is never edited).

* GELU by its definition, ``x * 0.5 * (1 + erf(x / sqrt(2)))`` (ESM's own ``gelu``, and older
  code that predates ``F.gelu``): ExecuTorch 1.4.1's XNNPACK partitioner has no ``erf``, so each
  feed-forward block left ``erf`` outside the delegate, split around it (a tiny ESM with rotary
  embeddings: 3 subgraphs). ``aten.gelu`` (exact, not the tanh approximation) is the same function;
  both targets are still compared with eager, and the values agree to float rounding.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.export import ExportedProgram

from ..shared_state.passes.graph_edit import NodeRewrite

__all__ = ["ErfGelu"]

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
