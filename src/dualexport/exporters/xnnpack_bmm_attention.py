"""Attention a model writes with ``bmm`` on ``[B * H, L, E]`` tensors, read as the SDPA call it
is, when the batch and the sequence are both dynamic, so that ``xnnpack_heads.py`` takes it.

Why: DeBERTa-v2 (and older eager code: OPT, BART) merges batch and heads before its two ``bmm``
calls: ``view(q_heads, [-1, L, E])``, ``bmm(q, k^T / s)``, ``view([B, H, L, S])`` for the mask
and softmax, ``view([-1, L, S])`` and ``bmm(p, v)``. With a dynamic batch and sequence each of
those views carries two symbolic sizes, which ExecuTorch 1.4.1's XNNPACK reshape refuses (strict
xfail ``test_xnnpack_forms::test_two_dynamic_sizes_in_one_view_are_a_library_limit``): a tiny
DeBERTa-v2 split into 13 subgraphs, 20 views outside. The per-head form of ``xnnpack_heads.py``
needs no such view, but starts from SDPA calls.

What is recognised (on a copy of the program; the shared program and the ONNX file are not
touched): ``bmm(Q, K^T)`` with a constant scalar factor on the keys or the scores, ``Q``/``K``/
``V`` views of ``[B, H, L, E]`` head splits; the scores viewed back to ``[B, H, L, S]``; then no
mask, or ``masked_fill(m, c)`` with ``c`` finite and at most -1e30 (DeBERTa's ``finfo.min``);
softmax over the keys; an eval-mode dropout; the probabilities viewed to ``[B * H, L, S]``, their
``bmm`` with ``V`` viewed back to ``[B, H, L, Ev]``. It becomes SDPA with the additive mask
``where(m, c, 0)``: the softmax sees ``s + c`` where eager saw ``c``, equal in float arithmetic
(``|s|`` below ``2 ** -24 * |c|``), so a row without a visible key stays uniform as in eager (not
the zeros SDPA gives a boolean mask's such row). The call is kept only where
``XnnpackHeadAttention`` then rewrites it; otherwise the program is left as it was.

transformers' eager attention (BERT, RemBERT, DistilBERT, ALBERT, ELECTRA with
``attn_implementation="eager"``) is the same computation on the 4-D heads, with no view:
``matmul(q, k.transpose(2, 3)) * s + m``, softmax, ``matmul(p, v)`` (queries and keys may each
carry a constant factor: Nystromformer's ``E ** -0.25``). ``m`` is an additive float mask; it is
kept only where ``rows_visible`` bounds it (``where(keep, 0, finfo.min)``, ``hidden * finfo.min``
from a bool): no row can be ``-inf``, so SDPA's guard is idle and the sums are eager's own. A tiny
eager BERT with batch and sequence dynamic: 13 subgraphs (73%) before, 1 (92%) after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram

from ..shared_state.passes.base import ProgramPass
from ..shared_state.passes.graph_edit import (
    COPY_OPS,
    VIEW_OPS,
    Inserter,
    call,
    constant_scalar,
    copy_program,
    fake_mode_of,
    finish_edit,
    replace_all_uses,
    same_size,
    shape_of,
    structure,
)
from .xnnpack_heads import XnnpackHeadAttention
from .xnnpack_patterns import HUGE_NEGATIVE

__all__ = ["BmmAttentionAsSdpa"]

aten = torch.ops.aten
_SDPA = aten.scaled_dot_product_attention.default
_SOFTMAX = (aten.softmax.int, aten._softmax.default)
_SCALARS = (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar)


def _heads(merged: Any) -> torch.fx.Node | None:
    """The ``[B, H, L, E]`` tensor a ``[B * H, L, E]`` operand is a view of (its last copy or
    permute: a head split ``xnnpack_head_inputs.operand`` reads), or None."""
    if not isinstance(merged, torch.fx.Node):
        return None
    node: Any = merged
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in VIEW_OPS:
        node = node.args[0]
    node = _through_copies(node)
    s3, s4 = shape_of(merged), shape_of(node)
    if s3 is None or s4 is None or len(s3) != 3 or len(s4) != 4:
        return None
    if not (same_size(s3[0], s4[0] * s4[1]) and same_size(s3[1:], s4[2:])):
        return None
    return node


def _through_copies(node: Any) -> Any:
    """``node`` past copies and expands to its own size (``torch.matmul`` on 4-D heads
    decomposes to ``view(clone(expand(x)))`` with an expand that changes nothing)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if node.target in COPY_OPS or (
            node.target is aten.expand.default
            and isinstance(node.args[0], torch.fx.Node)
            and same_size(shape_of(node), shape_of(node.args[0]))
        ):
            node = node.args[0]
            continue
        break
    return node


def _transposed_keys(kt: Any) -> torch.fx.Node | None:
    """The ``[B, H, S, E]`` key heads whose transpose the second ``bmm`` operand is: a 3-D
    ``transpose`` of merged heads (``bmm(q, k.transpose(1, 2))``), or the merged view of a 4-D
    transpose of the heads, else None."""
    if isinstance(kt, torch.fx.Node) and kt.target is aten.transpose.int:
        if sorted(d % 3 for d in kt.args[1:3]) != [1, 2]:  # type: ignore[operator]
            return None
        return _heads(kt.args[0])
    return _keys_4d(_heads(kt))


def _factor(program: ExportedProgram, node: Any) -> tuple[Any, float]:
    """``(x, c)`` for ``x * c`` or ``x / c`` with ``c`` a constant scalar, else ``(node, 1.0)``."""
    if isinstance(node, torch.fx.Node) and node.target in _SCALARS and len(node.args) == 2:
        x, c = node.args
        value = constant_scalar(program, c)
        if value is not None and math.isfinite(value) and value != 0.0 and isinstance(x, torch.fx.Node):
            return x, (1.0 / value if node.target in (aten.div.Tensor, aten.div.Scalar) else value)
    return node, 1.0


def _only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 and users[0].op == "call_function" else None


@dataclass(frozen=True)
class _Match:
    q: torch.fx.Node
    k: torch.fx.Node
    v: torch.fx.Node
    #: ``(m, c)``: the masked fill, or None
    fill: tuple[torch.fx.Node, float] | None
    #: an additive float mask added to the scaled scores, or None
    added: torch.fx.Node | None
    scale: float
    #: the ``[B, H, L, Ev]`` output the SDPA call replaces
    out: torch.fx.Node


_PRODUCTS = (aten.bmm.default, aten.matmul.default)


def _rank(node: Any) -> int | None:
    shape = shape_of(node)
    return None if shape is None else len(shape)


def _keys_4d(kt: Any) -> torch.fx.Node | None:
    """The ``[B, H, S, E]`` keys whose last two dims ``kt`` swaps, else None."""
    if not isinstance(kt, torch.fx.Node) or kt.op != "call_function":
        return None
    if kt.target is aten.transpose.int and sorted(d % 4 for d in kt.args[1:3]) == [2, 3]:  # type: ignore[operator]
        k = kt.args[0]
    elif kt.target is aten.permute.default and list(kt.args[1]) == [0, 1, 3, 2]:  # type: ignore[arg-type]
        k = kt.args[0]
    else:
        return None
    return k if isinstance(k, torch.fx.Node) and _rank(k) == 4 else None


def _match(program: ExportedProgram, bmm: torch.fx.Node) -> _Match | None:
    """The attention whose scores ``bmm`` computes (see the module docstring), or None: a
    ``bmm`` (or 3-D ``matmul``) on merged batch and heads, or a 4-D ``matmul`` on the heads
    (eager BERT's ``torch.matmul(q, k.transpose(2, 3))``, which needs no view)."""
    if bmm.target not in _PRODUCTS:
        return None
    four_d = _rank(bmm) == 4
    q3, kt = bmm.args[:2]
    q3, q_factor = _factor(program, q3)  # Nystromformer scales queries and keys by d ** -0.25
    kt, k_factor = _factor(program, kt)
    if four_d:
        q = q3 if isinstance(q3, torch.fx.Node) and _rank(q3) == 4 else None
        k = _keys_4d(kt)
        if k is not None:
            k, inner = _factor(program, k)
            k_factor *= inner
            k = k if _rank(k) == 4 else None
    else:
        q, k = _heads(q3), _transposed_keys(kt)
    if q is None or k is None:
        return None
    node, scale = bmm, q_factor * k_factor
    user = _only_user(node)
    qs, ks = shape_of(q), shape_of(k)
    if qs is None or ks is None:
        return None
    if not four_d:
        if user is not None and user.target in _SCALARS:
            x, c = _factor(program, user)
            if x is node and c != 1.0:
                node, scale = user, scale * c
                user = _only_user(node)
        if user is None or user.target not in VIEW_OPS or not same_size(shape_of(user), qs[:3] + ks[2:3]):
            return None
        node, user = user, _only_user(user)
    probs = _probabilities(program, node, user)
    if probs is None:
        return None
    node, user, fill, added, factor = probs
    scale *= factor
    if four_d:
        product = user
    else:
        if user is None or user.target not in VIEW_OPS:
            return None
        node, product = user, _only_user(user)
    if product is None or product.target not in _PRODUCTS or product.args[0] is not node:
        return None
    if four_d:
        v, out = product.args[1], product
        v = v if isinstance(v, torch.fx.Node) and _rank(v) == 4 else None
    else:
        v, out = _heads(product.args[1]), _only_user(product)
        if out is None or out.target not in VIEW_OPS:
            return None
    vs = shape_of(v)
    if v is None or vs is None or not same_size(shape_of(out), qs[:3] + vs[3:]):
        return None
    return _Match(q, k, v, fill, added, scale, out)


def _probabilities(program: ExportedProgram, node: torch.fx.Node, user: Any) -> Any:
    """From the ``[B, H, L, S]`` scores ``node`` (read by ``user``): a constant scale, an
    additive float mask or a masked fill, the softmax over the keys, eval-mode dropouts and
    copies. ``(last node, its user, fill, added mask, scale)``, or None."""
    fill, added, scale = None, None, 1.0
    if user is not None and user.target in _SCALARS:  # the scale on the [B, H, L, S] scores
        x, c = _factor(program, user)
        if x is node and c != 1.0:
            node, scale, user = user, c, _only_user(user)
    if user is not None and user.target is aten.add.Tensor and node in user.args[:2]:
        other = user.args[1] if user.args[0] is node else user.args[0]
        mv = other.meta.get("val") if isinstance(other, torch.fx.Node) else None
        if not isinstance(mv, torch.Tensor) or not mv.is_floating_point() or mv.dim() > 4:
            return None
        added, node, user = other, user, _only_user(user)  # an additive mask (eager BERT's)
    elif user is not None and user.target is aten.masked_fill.Scalar:
        mask, value = user.args[1], user.args[2]
        if (
            not isinstance(mask, torch.fx.Node)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            return None
        if value > HUGE_NEGATIVE or user.args[0] is not node:
            return None
        fill, node, user = (mask, float(value)), user, _only_user(user)
    if user is None or user.target not in _SOFTMAX or user.args[1] not in (-1, 3):
        return None
    if user.target is aten._softmax.default and user.args[2]:
        return None
    node, user = user, _only_user(user)
    while user is not None and (
        user.target in COPY_OPS
        or (user.target is aten.dropout.default and not user.args[2])
        or (user.target is aten.expand.default and same_size(shape_of(user), shape_of(node)))
    ):
        node, user = user, _only_user(user)
    return node, user, fill, added, scale


class BmmAttentionAsSdpa(ProgramPass):
    """``bmm`` attention on merged batch and heads -> SDPA, where ``XnnpackHeadAttention`` then
    takes it (a new program: the shared program is never edited)."""

    serves = "xnnpack"
    in_place = False

    def call(self, program: ExportedProgram) -> ExportedProgram:
        found = [n.name for n in program.graph.nodes if n.target in _PRODUCTS and _match(program, n)]
        if not found:
            return program
        new = copy_program(program)
        graph = new.graph
        fake_mode = fake_mode_of(new)
        by_name = {n.name: n for n in graph.nodes}
        heads = XnnpackHeadAttention()
        memo: dict[Any, Any] = {}
        masks: dict[Any, torch.fx.Node] = {}  # one additive mask per mask computation and fill
        first: dict[Any, torch.fx.Node] = {}
        changed = False
        for name in found:
            m = _match(new, by_name[name])
            if m is None:
                continue
            mask, made, key = m.added, False, None
            if m.fill is not None:
                source = first.setdefault(structure(m.fill[0], memo), m.fill[0])
                key = (source, m.fill[1])
                if key not in masks:
                    add = Inserter(graph, source, fake_mode)
                    masks[key], made = add(aten.where.Scalar, (source, m.fill[1], 0.0)), True
                mask = masks[key]
            with graph.inserting_before(m.out):
                sdpa = call(
                    graph, _SDPA, (m.q, m.k, m.v), {"attn_mask": mask, "scale": m.scale}, fake_mode=fake_mode
                )
            sdpa.meta.update({k: v for k, v in m.out.meta.items() if k in ("stack_trace", "nn_module_stack")})
            if mask is not None and mask.meta["val"].dtype != m.q.meta["val"].dtype:
                keep = False
            else:
                replace_all_uses(program, m.out, sdpa)
                keep = heads.rewritable(new, sdpa)
                if not keep:
                    replace_all_uses(program, sdpa, m.out)
            if not keep:
                graph.erase_node(sdpa)
                if made and mask is not None:
                    del masks[key]
                    graph.erase_node(mask)
                continue
            changed = True
        if not changed:
            return program
        return finish_edit(new)
