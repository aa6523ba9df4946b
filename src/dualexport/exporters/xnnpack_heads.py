"""XNNPACK's attention when the batch *and* the sequence are dynamic: one ``bmm`` pair per head on
``[B, L, E]`` tensors, with no head-split reshape at all.

Why: a text encoder served with ``Dim("batch")`` and ``Dim("seq")`` splits its heads with
``view([B, L, H, E])`` and merges them with ``view([B, L, H * E])``; the batched form of
``xnnpack_attention.py`` reshapes to ``[B * H, L, E]``. Each of these views carries two symbolic
sizes, and ExecuTorch 1.4.1's XNNPACK reshape takes at most one (``ViewCopyConfig``; strict xfail
``test_xnnpack_forms::test_two_dynamic_sizes_in_one_view_are_a_library_limit``): every layer left
three to five views outside the delegate (tiny BERT, batch and sequence dynamic: 11 subgraphs).

Here the projection's output ``[B, L, H * E]`` is read head by head: head ``h`` is the slice
``[..., h * E:(h + 1) * E]`` along the static last dim (``SlicesAsMatmul`` makes it a ``linear``
with a 0/1 selection matrix, since XNNPACK refuses a dynamic slice), its scores are a 3-D ``bmm``
against its key head's transpose, and the heads' outputs are concatenated along the last dim,
which *is* the merged ``[B, L, H * E]`` the model reshaped to. Every op keeps the batch and the
sequence as separate dims, so no view needs two symbolic sizes. The weights are untouched (the
selection reads activations), so the weight proof sees the same copies; the price is one extra
small matmul per head and projection, paid only by programs with two dynamic sizes.

A call is rewritten only where ``xnnpack_attention.plan_attention`` proves that no row is fully
masked (the guard-free softmax), its query, key and value are heads of 3-D tensors
(``xnnpack_head_inputs.py``: transformers' head split, a fused q/k/v projection, rotary
embeddings applied to the split), and its output reaches the
head merge (``transpose(1, 2)`` then ``view([B, L, H * E])``) through identity views, copies and
a product with a per-row factor (the shared program's fully-masked-row factor, ``[B, 1 or H, L, 1]``).
Anything else keeps the batched form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.export import ExportedProgram

from ..shared_state.passes.base import ProgramPass
from ..shared_state.passes.graph_edit import (
    COPY_OPS,
    VIEW_OPS,
    Inserter,
    call,
    copy_program,
    fake_mode_of,
    finish_edit,
    lift_constant,
    replace_all_uses,
    same_size,
    shape_of,
)
from .xnnpack_attention import mask_layout, plan_attention
from .xnnpack_head_inputs import Operand, operand, rotary_table, strip, swaps_1_2
from .xnnpack_masked_rows import GUARD_CASTS, GUARD_WHERES, guarded_mask

__all__ = ["XnnpackHeadAttention", "HEADS_TABLE"]

aten = torch.ops.aten
_SDPA = aten.scaled_dot_product_attention.default
#: XNNPACK's concatenate takes at most this many inputs
_CAT_WIDTH = 5


# ---------------------------------------------------------------------------------- the math
def _concat(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``cat`` along ``dim`` in groups XNNPACK takes, in order."""
    while len(parts) > 1:
        parts = [
            parts[i]
            if len(parts[i : i + _CAT_WIDTH]) == 1
            else aten.cat.default(parts[i : i + _CAT_WIDTH], dim)
            for i in range(0, len(parts), _CAT_WIDTH)
        ]
    return parts[0]


def _head(x: torch.Tensor, h: int, e: int, at: int) -> torch.Tensor:
    """Head ``h`` of ``x`` ``[B, L, n]``, its columns from ``at + h * e``: ``x`` itself when it
    holds that one head (multi-query keys and values), where a full-width slice would be a copy
    XNNPACK refuses (dynamic input)."""
    start = at + h * e
    return x if start == 0 and x.shape[-1] == e else aten.slice.Tensor(x, -1, start, start + e)


def _rotate(x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
    """Rotary position embedding of one head ``[B, L, E]``: ``x * cos + rotate_half(x) * sin``."""
    if cos is None or sin is None:
        return x
    half = x.shape[-1] // 2
    rotated = aten.cat.default(
        [aten.neg.default(aten.slice.Tensor(x, -1, half)), aten.slice.Tensor(x, -1, 0, half)], -1
    )
    return x * cos + rotated * sin


def _head_attention_math(
    xq: torch.Tensor,
    xk: torch.Tensor,
    xv: torch.Tensor,
    masks: list[torch.Tensor],
    factors: list[torch.Tensor],
    heads: int,
    heads_kv: int,
    scale: float,
    dims: list[int],
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
) -> torch.Tensor:
    """Heads of ``xq`` ``[B, L, n]``, ``xk`` and ``xv`` ``[B, S, n]``, ``dims`` = ``[E, Ev, q_at,
    k_at, v_at]``: head ``h`` of the queries is columns ``q_at + h * E`` onward (likewise keys and
    values, ``Ev`` wide); ``masks``: none, one ``[mb, L, S]`` for every head, or one per head
    (selected once per mask, not once per layer); ``factors``, per-row factors of the outputs,
    likewise (``[mb, L, 1]``);
    ``cos``/``sin`` ``[b, L, E]``, a rotary embedding of the queries and keys (self-attention: one
    table for both). Returns the heads' outputs merged, ``[B, L, H * Ev]``: query head ``h`` reads
    key/value head ``h // (H / Hkv)``."""
    e, ev, q_at, k_at, v_at = dims
    group = heads // heads_kv
    outs = []
    for j in range(heads_kv):
        kt = _rotate(_head(xk, j, e, k_at), cos, sin).transpose(1, 2)
        vj = _head(xv, j, ev, v_at)
        for i in range(group):
            h = j * group + i
            scores = aten.bmm.default(_rotate(_head(xq, h, e, q_at), cos, sin), kt) * scale
            if masks:
                scores = scores + masks[h if len(masks) > 1 else 0]
            probs = aten._softmax.default(scores, -1, False)
            out = aten.bmm.default(probs, vj)
            if factors:
                out = out * factors[h if len(factors) > 1 else 0]
            outs.append(out)
    return _concat(outs, -1)


@torch.library.custom_op("dualexport::xnnpack_head_attention", mutates_args=())
def xnnpack_head_attention(
    xq: torch.Tensor,
    xk: torch.Tensor,
    xv: torch.Tensor,
    masks: list[torch.Tensor],
    factors: list[torch.Tensor],
    heads: int,
    heads_kv: int,
    scale: float,
    dims: list[int],
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention on unsplit heads whose rows all have a visible key (see the module docstring)."""
    return _head_attention_math(xq, xk, xv, masks, factors, heads, heads_kv, scale, dims, cos, sin).clone()


@xnnpack_head_attention.register_fake
def _(
    xq: torch.Tensor,
    xk: torch.Tensor,
    xv: torch.Tensor,
    masks: list[torch.Tensor],
    factors: list[torch.Tensor],
    heads: int,
    heads_kv: int,
    scale: float,
    dims: list[int],
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
) -> torch.Tensor:
    return xq.new_empty((*xq.shape[:-1], heads * dims[1]))


#: The XNNPACK decomposition-table entry that expands the private op.
HEADS_TABLE: dict[Any, Any] = {torch.ops.dualexport.xnnpack_head_attention.default: _head_attention_math}


# ---------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class _Merge:
    """How an attention output reaches its head merge: the merged node and the row factor on the way."""

    merged: torch.fx.Node
    factor: torch.fx.Node | None
    #: the call and the nodes from it to ``merged``, in order
    path: tuple[torch.fx.Node, ...]


def _row_factor(node: torch.fx.Node, out: torch.fx.Node) -> torch.fx.Node | None:
    """The other operand of ``out * f`` when ``f`` is ``[B or 1, 1 or H, L or 1, 1]``: a per-row
    factor (the shared program's fully-masked-row factor), applied to each head's output."""
    if node.target is not aten.mul.Tensor or len(node.args) != 2:
        return None
    other = node.args[1] if node.args[0] is out else node.args[0]
    shape, heads = shape_of(other), shape_of(out)
    if shape is None or heads is None or len(shape) != 4 or not same_size(shape[3], 1):
        return None
    if not (same_size(shape[1], 1) or same_size(shape[1], heads[1])):
        return None
    return cast(torch.fx.Node, other)


def _merge(sdpa: torch.fx.Node) -> _Merge | None:
    cur, path = sdpa, [sdpa]
    factors: list[torch.fx.Node] = []
    while True:
        users = list(cur.users)
        if len(users) != 1:
            return None
        (user,) = users
        if user.op != "call_function":
            return None
        path.append(user)
        if user.target in COPY_OPS or (user.target in VIEW_OPS and same_size(shape_of(user), shape_of(cur))):
            cur = user
            continue
        factor = _row_factor(user, cur)
        if factor is not None:
            if factors:
                return None  # one factor per call (the shared program writes one)
            factors.append(factor)
            cur = user
            continue
        if not swaps_1_2(user):
            return None
        swapped = user
        while len(swapped.users) == 1 and next(iter(swapped.users)).target in COPY_OPS:
            swapped = next(iter(swapped.users))
            path.append(swapped)
        if len(swapped.users) != 1:
            return None
        merged = next(iter(swapped.users))
        split, whole = shape_of(swapped), shape_of(merged)
        if merged.target not in VIEW_OPS or split is None or whole is None or len(whole) != 3:
            return None
        if not (same_size(whole[0], split[0]) and same_size(whole[1], split[1])):
            return None
        if not (
            isinstance(split[2], int)
            and isinstance(split[3], int)
            and same_size(whole[2], split[2] * split[3])
        ):
            return None
        return _Merge(merged, factors[0] if factors else None, (*path, merged))


def _two_dynamic(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the batched form's ``[B * H, L, E]`` views carry two symbolic sizes."""
    return not isinstance(q.shape[0], int) and not (
        isinstance(q.shape[2], int) and isinstance(k.shape[2], int)
    )


def _operands(program: ExportedProgram, node: torch.fx.Node) -> tuple[Operand, Operand, Operand] | None:
    """The query, key and value of an SDPA call as heads of merged tensors, when the per-head form
    can read them: the heads counts and widths the call's, one rotary table for the queries and
    keys (or none), none for the values."""
    plan = plan_attention(program, node)
    if plan is None:
        return None
    found = [operand(t) for t in (plan.q, plan.k, plan.v)]
    oq, ok, ov = found
    if oq is None or ok is None or ov is None:
        return None
    if oq.heads != shape_of(plan.q)[1] or ok.heads != plan.heads_kv or ov.heads != plan.heads_kv:  # type: ignore[index]
        return None
    if oq.dim != ok.dim or ov.rotary is not None or ov.scale != 1.0:
        return None
    if oq.rotary is None or ok.rotary is None:
        return (oq, ok, ov) if oq.rotary is ok.rotary else None
    if any(strip(a) is not strip(b) for a, b in zip(oq.rotary, ok.rotary, strict=True)):
        return None
    return oq, ok, ov


def _guarded(
    program: ExportedProgram, mask: torch.fx.Node, factor: torch.fx.Node | None
) -> torch.fx.Node | None:
    """``m`` when the call's mask is the shared program's guard ``where(visible, m, 0)`` and its
    row factor ``visible`` as a float, ``visible = any(m != -inf, -1, keepdim)`` (a float mask it
    could not prove finite, e.g. T5's position bias): the per-head form then computes both from
    ``m`` in ops XNNPACK takes with a dynamic key length (:func:`_row_guard`)."""
    if factor is None or mask.target not in GUARD_WHERES or factor.target not in GUARD_CASTS:
        return None
    visible = mask.args[0]
    if not isinstance(visible, torch.fx.Node) or factor.args[0] is not visible:
        return None
    m = guarded_mask(program, visible, static_keys=False)
    return m if m is not None and mask.args[1] is m else None


def _row_guard(
    program: ExportedProgram, add: Inserter, heads: list[torch.fx.Node], keys: torch.fx.Node
) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """Per head ``m_h`` ``[B, L, S]``: the additive mask ``clamp(m_h, min=lo)`` and the row factor
    ``clamp(e_h @ ones, 0, 1)``, with ``e_h = clamp(m_h - clamp(m_h, min=lo), min=-1) + 1`` (1 where
    a key is visible, 0 where it is ``-inf``) and ``ones`` ``[B, S, 1]`` a linear of the keys
    with a zero weight and a bias of 1. A visible row's softmax is unchanged bit for bit (a ``lo``
    key gives ``exp(..) == 0`` as a ``-inf`` one does); the count of visible keys is an exact
    integer, so the factor is exactly 1 or 0. Max pooling (``MaskedRowsAsMax``) would need the
    key length static; ``ne``/``any``/``where``/bool casts and a per-head ``select`` of the factor
    stay outside XNNPACK: these ops all take dynamic sizes (keys with an inf give NaN scores
    anyway)."""
    dtype = keys.meta["val"].dtype
    lowest = torch.finfo(dtype).min
    width = shape_of(keys)[-1]  # type: ignore[index]
    zeros = lift_constant(program, torch.zeros(1, width, dtype=dtype), prefix="_xnnpack_row_count")
    one = lift_constant(program, torch.ones(1, dtype=dtype), prefix="_xnnpack_row_count")
    ones = add(aten.linear.default, (keys, zeros, one))
    masks, factors = [], []
    for m_h in heads:
        clamped = add(aten.clamp.default, (m_h, lowest))
        hidden = add(aten.clamp.default, (add(aten.sub.Tensor, (m_h, clamped)), -1.0))
        seen = add(aten.add.Tensor, (hidden, 1.0))
        count = add(aten.bmm.default, (seen, ones))
        masks.append(clamped)
        factors.append(add(aten.clamp.default, (count, 0.0, 1.0)))
    return masks, factors


class XnnpackHeadAttention(ProgramPass):
    """SDPA calls with a dynamic batch and sequence, as per-head attention on ``[B, L, E]``
    tensors (a new program: the shared program is never edited)."""

    serves = "xnnpack"
    in_place = False

    def call(self, program: ExportedProgram) -> ExportedProgram:
        names = [
            n.name
            for n in program.graph.nodes
            if n.op == "call_function" and n.target is _SDPA and self.rewritable(program, n)
        ]
        if not names:
            return program
        new = copy_program(program)
        graph = new.graph
        fake_mode = fake_mode_of(new)
        by_name = {n.name: n for n in graph.nodes}
        layouts: dict[torch.fx.Node, list[torch.fx.Node]] = {}

        def per_head(node: torch.fx.Node) -> list[torch.fx.Node]:
            """A mask or row factor ``[mb, 1 or H, L, S]`` as ``[mb, L, S]`` tensors, one shared
            by the heads or one per head, made once per mask (not once per layer)."""
            if node not in layouts:
                if same_size(shape_of(node)[1], 1):  # type: ignore[index]
                    layouts[node] = [mask_layout(new, node, 1, 1, fake_mode)]
                else:
                    add = Inserter(graph, node, fake_mode)
                    layouts[node] = [add(aten.select.int, (node, 1, h)) for h in range(shape_of(node)[1])]  # type: ignore[index]
            return layouts[node]

        tables: dict[torch.fx.Node, torch.fx.Node] = {}
        guards: dict[torch.fx.Node, tuple[list[torch.fx.Node], list[torch.fx.Node]]] = {}

        def table(node: torch.fx.Node) -> torch.fx.Node:
            """A rotary ``cos`` or ``sin`` ``[b, 1, L, E]`` as ``[b, L, E]``, once."""
            if node not in tables:
                tables[node] = rotary_table(graph, node, fake_mode)
            return tables[node]

        for name in names:
            node = by_name[name]
            plan = plan_attention(new, node)
            merge = _merge(node)
            operands = _operands(new, node)
            assert plan is not None and merge is not None and operands is not None  # as in rewritable
            oq, ok, ov = operands
            guarded = _guarded(new, plan.mask, merge.factor) if plan.mask is not None else None
            if guarded is not None and same_size(shape_of(guarded)[0], shape_of(ok.source)[0]):  # type: ignore[index]
                if guarded not in guards:  # once per mask, before its first call
                    add = Inserter(graph, merge.merged.prev, fake_mode)
                    guards[guarded] = _row_guard(new, add, per_head(guarded), ok.source)
                masks, factors = guards[guarded]
            else:
                masks = per_head(plan.mask) if plan.mask is not None else []
                factors = per_head(merge.factor) if merge.factor is not None else []
            cos, sin = (table(t) for t in oq.rotary) if oq.rotary else (None, None)
            dims = [oq.dim, ov.dim, oq.offset, ok.offset, ov.offset]
            scale = plan.scale * oq.scale * ok.scale  # factors of the scores: they commute
            with graph.inserting_before(merge.merged):
                out = call(
                    graph,
                    torch.ops.dualexport.xnnpack_head_attention.default,
                    (
                        oq.source,
                        ok.source,
                        ov.source,
                        masks,
                        factors,
                        oq.heads,
                        plan.heads_kv,
                        scale,
                        dims,
                        cos,
                        sin,
                    ),
                    fake_mode=fake_mode,
                )
            out.meta.update({k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")})
            replace_all_uses(program, merge.merged, out)
            for dead in reversed(merge.path):  # SDPA is tagged nondeterministic: DCE keeps it
                graph.erase_node(dead)
        return finish_edit(new)

    @staticmethod
    def rewritable(program: ExportedProgram, node: torch.fx.Node) -> bool:
        """Whether this pass rewrites SDPA call ``node`` (``xnnpack_bmm_attention.py`` asks)."""
        plan = plan_attention(program, node)
        if plan is None or plan.causal:
            return False
        q, k = plan.q.meta["val"], plan.k.meta["val"]
        if not _two_dynamic(q, k):
            return False
        if _operands(program, node) is None:
            return False
        if plan.mask is not None:
            shape = shape_of(plan.mask)
            if (
                shape is None
                or len(shape) != 4
                or not (same_size(shape[1], 1) or same_size(shape[1], q.shape[1]))
            ):
                return False
        return _merge(node) is not None
