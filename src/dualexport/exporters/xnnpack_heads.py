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
masked (the guard-free softmax), its query, key and value are the head split of a 3-D tensor
(``transpose(view(x, [B, L, H, E]), 1, 2)``, transformers' form), and its output reaches the
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
from ..shared_state.passes.graph_edit import call, fake_mode_of
from .xnnpack_attention import copy_program, mask_layout, plan_attention

__all__ = ["XnnpackHeadAttention", "HEADS_TABLE"]

aten = torch.ops.aten
_SDPA = aten.scaled_dot_product_attention.default
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_COPIES = {aten.clone.default, aten.contiguous.default, aten.alias.default}
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


def _head(x: torch.Tensor, h: int, e: int) -> torch.Tensor:
    """Head ``h`` of ``x`` ``[B, L, H * e]``: ``x`` itself when it holds one head (multi-query
    keys and values), where a full-width slice would be a copy XNNPACK refuses (dynamic input)."""
    return x if x.shape[-1] == e else aten.slice.Tensor(x, -1, h * e, (h + 1) * e)


def _head_attention_math(
    xq: torch.Tensor,
    xk: torch.Tensor,
    xv: torch.Tensor,
    mask: torch.Tensor | None,
    factor: torch.Tensor | None,
    heads: int,
    heads_kv: int,
    scale: float,
) -> torch.Tensor:
    """``xq`` ``[B, L, H * E]``, ``xk`` ``[B, S, Hkv * E]``, ``xv`` ``[B, S, Hkv * Ev]``; ``mask``
    ``[mb, L, S]`` (every head's) or ``[mb, H, L, S]`` (one per head); ``factor``, a per-row
    factor of the outputs, likewise ``[mb, L, 1]`` or ``[mb, H, L, 1]``. Returns the heads' outputs
    merged, ``[B, L, H * Ev]``: query head ``h`` reads key/value head ``h // (H / Hkv)``."""
    e = xq.shape[-1] // heads
    ev = xv.shape[-1] // heads_kv
    group = heads // heads_kv
    outs = []
    for j in range(heads_kv):
        kt = _head(xk, j, e).transpose(1, 2)
        vj = _head(xv, j, ev)
        for i in range(group):
            h = j * group + i
            scores = aten.bmm.default(_head(xq, h, e), kt) * scale
            if mask is not None:
                scores = scores + (aten.select.int(mask, 1, h) if mask.dim() == 4 else mask)
            probs = aten._softmax.default(scores, -1, False)
            out = aten.bmm.default(probs, vj)
            if factor is not None:
                out = out * (aten.select.int(factor, 1, h) if factor.dim() == 4 else factor)
            outs.append(out)
    return _concat(outs, -1)


@torch.library.custom_op("dualexport::xnnpack_head_attention", mutates_args=())
def xnnpack_head_attention(
    xq: torch.Tensor,
    xk: torch.Tensor,
    xv: torch.Tensor,
    mask: torch.Tensor | None,
    factor: torch.Tensor | None,
    heads: int,
    heads_kv: int,
    scale: float,
) -> torch.Tensor:
    """Attention on unsplit heads whose rows all have a visible key (see the module docstring)."""
    return _head_attention_math(xq, xk, xv, mask, factor, heads, heads_kv, scale).clone()


@xnnpack_head_attention.register_fake
def _(
    xq: torch.Tensor,
    xk: torch.Tensor,
    xv: torch.Tensor,
    mask: torch.Tensor | None,
    factor: torch.Tensor | None,
    heads: int,
    heads_kv: int,
    scale: float,
) -> torch.Tensor:
    return xq.new_empty((*xq.shape[:-1], heads * (xv.shape[-1] // heads_kv)))


#: The XNNPACK decomposition-table entry that expands the private op.
HEADS_TABLE: dict[Any, Any] = {torch.ops.dualexport.xnnpack_head_attention.default: _head_attention_math}


# ---------------------------------------------------------------------------------- the plan
def _shape(node: Any) -> tuple[Any, ...] | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _same(a: Any, b: Any) -> bool:
    return str(a) == str(b)


def _swaps_1_2(node: torch.fx.Node) -> bool:
    """``transpose(x, 1, 2)`` of a 4-D tensor, in either spelling."""
    if node.op != "call_function":
        return False
    args: Any = node.args
    if node.target is aten.transpose.int:
        return sorted(d % 4 for d in args[1:3]) == [1, 2]
    if node.target is aten.permute.default:
        return [d % 4 for d in args[1]] == [0, 2, 1, 3]
    return False


def _unsplit(node: Any) -> torch.fx.Node | None:
    """``x`` ``[B, L, H * E]`` when ``node`` is its head split ``transpose(view(x, [B, L, H, E]), 1, 2)``."""
    if not isinstance(node, torch.fx.Node) or not _swaps_1_2(node):
        return None
    view = node.args[0]
    if not isinstance(view, torch.fx.Node) or view.target not in _VIEWS:
        return None
    x = view.args[0]
    split, whole = _shape(view), _shape(x)
    if split is None or whole is None or len(split) != 4 or len(whole) != 3:
        return None
    h, e = split[2], split[3]
    if not (isinstance(h, int) and isinstance(e, int)) or not _same(whole[2], h * e):
        return None
    if not (_same(whole[0], split[0]) and _same(whole[1], split[1])):
        return None
    return cast(torch.fx.Node, x)


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
    shape, heads = _shape(other), _shape(out)
    if shape is None or heads is None or len(shape) != 4 or not _same(shape[3], 1):
        return None
    if not (_same(shape[1], 1) or _same(shape[1], heads[1])):
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
        if user.target in _COPIES or (user.target in _VIEWS and _same(_shape(user), _shape(cur))):
            cur = user
            continue
        factor = _row_factor(user, cur)
        if factor is not None:
            if factors:
                return None  # one factor per call (the shared program writes one)
            factors.append(factor)
            cur = user
            continue
        if not _swaps_1_2(user):
            return None
        swapped = user
        while len(swapped.users) == 1 and next(iter(swapped.users)).target in _COPIES:
            swapped = next(iter(swapped.users))
            path.append(swapped)
        if len(swapped.users) != 1:
            return None
        merged = next(iter(swapped.users))
        split, whole = _shape(swapped), _shape(merged)
        if merged.target not in _VIEWS or split is None or whole is None or len(whole) != 3:
            return None
        if not (_same(whole[0], split[0]) and _same(whole[1], split[1])):
            return None
        if not (
            isinstance(split[2], int) and isinstance(split[3], int) and _same(whole[2], split[2] * split[3])
        ):
            return None
        return _Merge(merged, factors[0] if factors else None, (*path, merged))


def _two_dynamic(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the batched form's ``[B * H, L, E]`` views carry two symbolic sizes."""
    return not isinstance(q.shape[0], int) and not (
        isinstance(q.shape[2], int) and isinstance(k.shape[2], int)
    )


class XnnpackHeadAttention(ProgramPass):
    """SDPA calls with a dynamic batch and sequence, as per-head attention on ``[B, L, E]``
    tensors (a new program: the shared program is never edited)."""

    serves = "xnnpack"
    in_place = False

    def call(self, program: ExportedProgram) -> ExportedProgram:
        names = [
            n.name
            for n in program.graph.nodes
            if n.op == "call_function" and n.target is _SDPA and self._rewritable(program, n)
        ]
        if not names:
            return program
        new = copy_program(program)
        graph = new.graph
        fake_mode = fake_mode_of(new)
        by_name = {n.name: n for n in graph.nodes}
        layouts: dict[torch.fx.Node, torch.fx.Node] = {}

        def layout(node: torch.fx.Node) -> torch.fx.Node:
            """A mask or row factor shared by the heads, ``[mb, 1, L, S]``, as ``[mb, L, S]``, once."""
            if node not in layouts:
                layouts[node] = mask_layout(new, node, 1, 1, fake_mode)
            return layouts[node]

        for name in names:
            node = by_name[name]
            plan = plan_attention(new, node)
            merge = _merge(node)
            assert plan is not None and merge is not None  # as in _rewritable, on the same graph
            xq, xk, xv = (_unsplit(t) for t in (plan.q, plan.k, plan.v))
            assert xq is not None and xk is not None and xv is not None
            mask, factor = plan.mask, merge.factor
            if mask is not None and _same(_shape(mask)[1], 1):  # type: ignore[index]
                mask = layout(mask)
            if factor is not None and _same(_shape(factor)[1], 1):  # type: ignore[index]
                factor = layout(factor)
            heads = _shape(plan.q)[1]  # type: ignore[index]
            with graph.inserting_before(merge.merged):
                out = call(
                    graph,
                    torch.ops.dualexport.xnnpack_head_attention.default,
                    (xq, xk, xv, mask, factor, heads, plan.heads_kv, plan.scale),
                    fake_mode=fake_mode,
                )
            out.meta.update({k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")})
            merge.merged.replace_all_uses_with(out)
            for dead in reversed(merge.path):  # SDPA is tagged nondeterministic: DCE keeps it
                graph.erase_node(dead)
        graph.eliminate_dead_code()
        graph.lint()
        new.graph_module.recompile()
        return new

    @staticmethod
    def _rewritable(program: ExportedProgram, node: torch.fx.Node) -> bool:
        plan = plan_attention(program, node)
        if plan is None or plan.causal:
            return False
        q, k = plan.q.meta["val"], plan.k.meta["val"]
        if not _two_dynamic(q, k):
            return False
        if any(_unsplit(t) is None for t in (plan.q, plan.k, plan.v)):
            return False
        if plan.mask is not None:
            shape = _shape(plan.mask)
            if shape is None or len(shape) != 4 or not (_same(shape[1], 1) or _same(shape[1], q.shape[1])):
                return False
        return _merge(node) is not None
