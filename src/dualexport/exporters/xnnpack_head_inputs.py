"""What XNNPACK's per-head attention (``xnnpack_heads.py``) reads: a query, key or value traced back
to the merged ``[B, L, n * E]`` tensor its heads were split from, through the forms that hide it.

* The head split itself: ``transpose(view(x, [B, L, H, E]), 1, 2)`` (transformers' form).
* A fused projection split in one view: ``unbind(view(qkv, [B, L, 3, H, E]), -3)[i]`` (ModernBERT,
  and any model projecting q, k and v with one Linear): head ``h`` of part ``i`` is the columns
  from ``i * H * E + h * E`` of ``qkv``, read where they are.
* Rotary position embeddings applied to the head split, ``x * cos + rotate_half(x) * sin`` with
  ``cos`` and ``sin`` ``[b, 1, L, E]`` (transformers' ``apply_rotary_pos_emb``: ModernBERT, ESM):
  applied to each head once it is read, with ``cos``/``sin`` as ``[b, L, E]``.

Why: with the batch and the sequence dynamic, either of the last two forms left the call in the
batched layout, whose views carry two symbolic sizes that ExecuTorch 1.4.1's XNNPACK refuses (a
tiny ModernBERT: 13 subgraphs, 80% of its compute delegated).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, cast

import torch

from ..shared_state.passes.graph_edit import COPY_OPS, VIEW_OPS, Inserter, same_size, shape_of

__all__ = ["Operand", "operand", "rotary_table"]

aten = torch.ops.aten
_CASTS = {aten.to.dtype, aten._to_copy.default}
_GETITEM = operator.getitem


@dataclass(frozen=True)
class Operand:
    """Heads ``h`` of a query, key or value: columns ``offset + h * dim`` onward of ``source``
    (``[B, L, n]``), rotated by ``rotary`` (its ``cos`` and ``sin`` nodes, ``[b, 1, L, dim]``)."""

    source: torch.fx.Node
    offset: int
    heads: int
    dim: int
    rotary: tuple[torch.fx.Node, torch.fx.Node] | None = None
    #: a constant factor the model multiplied the heads by (ESM scales its queries before rotary)
    scale: float = 1.0


def strip(node: Any) -> Any:
    """``node`` without the copies, same-dtype casts and identity views in front of it."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.args:
        src = node.args[0]
        if not isinstance(src, torch.fx.Node):
            break
        val, sval = node.meta.get("val"), src.meta.get("val")
        if not isinstance(val, torch.Tensor) or not isinstance(sval, torch.Tensor):
            break
        same = same_size(val.shape, sval.shape) and val.dtype == sval.dtype
        if not same or node.target not in COPY_OPS | _CASTS | VIEW_OPS:
            break
        node = src
    return node


def swaps_1_2(node: Any) -> bool:
    """``transpose(x, 1, 2)`` of a 4-D tensor, in either spelling."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    args: Any = node.args
    if node.target is aten.transpose.int:
        return sorted(d % 4 for d in args[1:3]) == [1, 2]
    if node.target is aten.permute.default:
        return [d % 4 for d in args[1]] == [0, 2, 1, 3]
    return False


def _split(node: Any) -> Operand | None:
    """The head split ``transpose(view(x, [B, L, H, E]), 1, 2)``, or ``transpose`` of part ``i``
    of ``view(x, [B, L, P, H, E])`` (``unbind(-3)[i]`` or ``select(2, i)``)."""
    if not swaps_1_2(node):
        return None
    part = node.args[0]
    index = 0
    if isinstance(part, torch.fx.Node) and part.target is aten.select.int:
        if part.args[1] not in (2, -3) or not isinstance(part.args[2], int):
            return None
        index, view = part.args[2], part.args[0]
    elif isinstance(part, torch.fx.Node) and part.target is _GETITEM:
        unbind = part.args[0]
        if not isinstance(unbind, torch.fx.Node) or unbind.target is not aten.unbind.int:
            return None
        if (unbind.args[1] if len(unbind.args) > 1 else 0) not in (2, -3):
            return None
        index, view = cast(int, part.args[1]), unbind.args[0]
    else:
        view = part
    if not isinstance(view, torch.fx.Node) or view.target not in VIEW_OPS:
        return None
    x = view.args[0]
    split, whole = shape_of(view), shape_of(x)
    if split is None or whole is None or len(whole) != 3 or len(split) not in (4, 5):
        return None
    if len(split) == 4 and view is not part:
        return None
    h, e = split[-2], split[-1]
    parts = split[2] if len(split) == 5 else 1
    if not all(isinstance(s, int) for s in (h, e, parts)) or not same_size(whole[2], parts * h * e):
        return None
    if not (same_size(whole[0], split[0]) and same_size(whole[1], split[1])):
        return None
    return Operand(cast(torch.fx.Node, x), index * h * e, h, e)


def _rotated_half(node: Any, e: int) -> Any:
    """``x`` when ``node`` is ``rotate_half(x)``: ``cat([-x[..., e/2:], x[..., :e/2]], -1)``."""
    node = strip(node)
    if not isinstance(node, torch.fx.Node) or node.target is not aten.cat.default or e % 2:
        return None
    parts, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
    if not isinstance(parts, (list, tuple)) or len(parts) != 2 or dim not in (-1, 3):
        return None
    neg, low = strip(parts[0]), strip(parts[1])
    if not isinstance(neg, torch.fx.Node) or neg.target is not aten.neg.default:
        return None
    high = strip(neg.args[0])
    half = e // 2
    sources = []
    for sl, (start, end) in ((high, (half, e)), (low, (0, half))):
        if not isinstance(sl, torch.fx.Node) or sl.target is not aten.slice.Tensor:
            return None
        args: list[Any] = list(sl.args) + [0, None, None, 1][len(sl.args) - 1 :]
        d, s0, s1, step = args[1:5]
        stops = (s1 is None or (isinstance(s1, int) and s1 >= e)) if end == e else s1 == end
        if d not in (-1, 3) or (s0 or 0) != start or step != 1 or not stops:
            return None
        sources.append(strip(sl.args[0]))
    return sources[0] if sources[0] is sources[1] else None


def _table(node: Any, like: tuple[Any, ...]) -> bool:
    """``cos``/``sin`` of a rotary: ``[1 or B, 1, L, E]`` for heads of shape ``like``."""
    shape = shape_of(node)
    return (
        shape is not None
        and len(shape) == 4
        and (same_size(shape[0], 1) or same_size(shape[0], like[0]))
        and same_size(shape[1], 1)
        and same_size(shape[2], like[2])
        and same_size(shape[3], like[3])
    )


def _rotary(node: Any) -> tuple[Any, Any, Any] | None:
    """``(x, cos, sin)`` when ``node`` is ``x * cos + rotate_half(x) * sin``."""
    node = strip(node)
    if not isinstance(node, torch.fx.Node) or node.target is not aten.add.Tensor or len(node.args) != 2:
        return None
    like = shape_of(node)
    if like is None or len(like) != 4 or not isinstance(like[3], int):
        return None
    products = [strip(a) for a in node.args]
    if not all(isinstance(p, torch.fx.Node) and p.target is aten.mul.Tensor for p in products):
        return None
    for first, second in (products, products[::-1]):
        terms: list[tuple[Any, Any] | None] = []
        for p in (first, second):
            a, b = p.args
            table, other = (a, b) if _table(a, like) else (b, a)
            terms.append((strip(other), table) if _table(table, like) else None)
        if terms[0] is None or terms[1] is None:
            continue
        (x, cos), (rot, sin) = terms[0], terms[1]
        if _rotated_half(rot, like[3]) is x:
            return x, cos, sin
    return None


def _scaled(node: Any) -> tuple[Any, float]:
    """``(x, c)`` when ``node`` is ``x * c`` or ``x / c`` with a constant number ``c``, else ``(node, 1)``."""
    node = strip(node)
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or len(node.args) != 2:
        return node, 1.0
    a, b = node.args
    if node.target in (aten.mul.Tensor, aten.mul.Scalar):
        if isinstance(b, (int, float)) and not isinstance(b, bool):
            return strip(a), float(b)
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return strip(b), float(a)
    if node.target in (aten.div.Tensor, aten.div.Scalar) and isinstance(b, (int, float)) and b:
        return strip(a), 1.0 / float(b)
    return node, 1.0


def operand(node: Any) -> Operand | None:
    """``node`` (a query, key or value ``[B, H, L, E]``) as heads of a merged tensor, or None."""
    node, outer = _scaled(node)
    found = _split(node)
    if found is not None:
        return Operand(found.source, found.offset, found.heads, found.dim, scale=outer)
    rotary = _rotary(node)
    if rotary is None:
        return None
    x, cos, sin = rotary
    x, inner = _scaled(x)  # rotary is linear: c * x rotated is c times x rotated
    found = _split(x)
    if found is None:
        return None
    return Operand(found.source, found.offset, found.heads, found.dim, (cos, sin), outer * inner)


def rotary_table(graph: torch.fx.Graph, node: torch.fx.Node, fake_mode: Any) -> torch.fx.Node:
    """A rotary ``cos`` or ``sin`` ``[b, 1, L, E]`` as ``[b, L, E]``: the tensor before its
    ``unsqueeze(1)``, else its ``squeeze(1)`` (a folded table's slice: with ``b`` = 1 a view with
    one dynamic size, which XNNPACK takes; it reads only a constant and the sequence length, so
    it runs before the first layer either way, and no table is copied)."""
    table = strip(node)
    if table.op == "call_function" and table.target is aten.unsqueeze.default and table.args[1] in (1, -3):
        return cast(torch.fx.Node, table.args[0])
    return Inserter(graph, node, fake_mode)(aten.squeeze.dim, (node, 1))
