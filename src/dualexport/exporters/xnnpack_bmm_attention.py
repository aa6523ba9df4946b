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
    fake_mode_of,
    finish_edit,
    same_size,
    shape_of,
    structure,
)
from .xnnpack_attention import copy_program
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
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in COPY_OPS:
        node = node.args[0]
    s3, s4 = shape_of(merged), shape_of(node)
    if s3 is None or s4 is None or len(s3) != 3 or len(s4) != 4:
        return None
    if not (same_size(s3[0], s4[0] * s4[1]) and same_size(s3[1:], s4[2:])):
        return None
    return node


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
    scale: float
    #: the ``[B, H, L, Ev]`` output the SDPA call replaces
    out: torch.fx.Node


def _match(program: ExportedProgram, bmm: torch.fx.Node) -> _Match | None:
    """The attention whose scores ``bmm`` computes (see the module docstring), or None."""
    q3, kt = bmm.args[:2]
    q = _heads(q3)
    kt, k_factor = _factor(program, kt)
    if not isinstance(kt, torch.fx.Node) or kt.target is not aten.transpose.int:
        return None
    if sorted(d % 3 for d in kt.args[1:3]) != [1, 2]:  # type: ignore[operator]
        return None
    k = _heads(kt.args[0])
    if q is None or k is None:
        return None
    node, scale = bmm, k_factor
    user = _only_user(node)
    if user is not None and user.target in _SCALARS:
        x, c = _factor(program, user)
        if x is node and c != 1.0:
            node, scale = user, scale * c
            user = _only_user(node)
    qs, ks = shape_of(q), shape_of(k)
    if qs is None or ks is None:
        return None
    if user is None or user.target not in VIEW_OPS or not same_size(shape_of(user), qs[:3] + ks[2:3]):
        return None
    node, user, fill = user, _only_user(user), None
    if user is not None and user.target is aten.masked_fill.Scalar:
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
        user.target in COPY_OPS or (user.target is aten.dropout.default and not user.args[2])
    ):
        node, user = user, _only_user(user)
    if user is None or user.target not in VIEW_OPS:
        return None
    probs = user
    bmm2 = _only_user(probs)
    if bmm2 is None or bmm2.target is not aten.bmm.default or bmm2.args[0] is not probs:
        return None
    v = _heads(bmm2.args[1])
    out = _only_user(bmm2)
    if v is None or out is None or out.target not in VIEW_OPS:
        return None
    vs = shape_of(v)
    if vs is None or not same_size(shape_of(out), qs[:3] + vs[3:]):
        return None
    return _Match(q, k, v, fill, scale, out)


class BmmAttentionAsSdpa(ProgramPass):
    """``bmm`` attention on merged batch and heads -> SDPA, where ``XnnpackHeadAttention`` then
    takes it (a new program: the shared program is never edited)."""

    serves = "xnnpack"
    in_place = False

    def call(self, program: ExportedProgram) -> ExportedProgram:
        found = [n.name for n in program.graph.nodes if n.target is aten.bmm.default and _match(program, n)]
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
            mask, made, key = None, False, None
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
                m.out.replace_all_uses_with(sdpa)
                keep = heads.rewritable(new, sdpa)
                if not keep:
                    sdpa.replace_all_uses_with(m.out)
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
