"""XNNPACK's attention: ``scaled_dot_product_attention`` as ``bmm``/``_softmax``/``bmm``, without
the fully-masked-row guard, wherever no row can be fully masked, and with its mask laid out for
the batched matmul once, not once per layer.

Why: torch decomposes SDPA into the math path with a "safe" softmax (``_safe_softmax``: a row
whose scores are all ``-inf`` gives zeros, not NaN), and the guard's ops (``eq``, ``logical_not``,
``any``, ``full_like``, ``where``), plus the conversion of a boolean mask to an additive one, stay
outside XNNPACK: every attention layer split the delegate (a tiny ViT: 5 subgraphs with SDPA, 1
with eager attention). Dropping the guard is exact only where no row is fully masked, so a call
is rewritten only when that is proved from the program:

* no mask (and not causal);
* ``is_causal`` with static sizes (torch's causal mask is top-left aligned: row ``i`` sees key
  0); the additive mask becomes one constant of this program;
* a constant mask whose every row has a visible key (checked on its values);
* a mask in the forms ``shared_state/passes/attention.py`` writes, visible rows by construction
  (its ``rows_visible`` is the proof: bounded float values, or ``where(any(m != -inf), m, 0)``).

Anything else keeps torch's decomposition, guard included. Grouped-query attention (``enable_gqa``
or transformers' ``repeat_kv``: ``unsqueeze``/``expand``/``reshape`` of the key and value heads)
runs as one ``bmm`` per key/value head over its group's queries, so no head is copied.

The rewrite runs on the XNNPACK program only (a copy of the shared program's graph, sharing its
tensors, then ``run_decompositions``): ONNX Runtime keeps SDPA whole. The calls become two private
ops, ``dualexport::xnnpack_attention`` and ``dualexport::xnnpack_bmm_mask``, that the XNNPACK
decomposition table expands; they never reach a file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.export import ExportedProgram

from ..shared_state.passes.attention import rows_visible
from ..shared_state.passes.base import ProgramPass
from ..shared_state.passes.graph_edit import (
    Inserter,
    argument,
    call,
    copy_program,
    fake_mode_of,
    lift_constant,
    replace_all_uses,
)

__all__ = ["XnnpackAttention", "ATTENTION_TABLE", "plan_attention", "mask_layout"]

aten = torch.ops.aten
_SDPA = aten.scaled_dot_product_attention.default
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
#: the largest mask layout stored as a constant when it is bigger than the mask it lays out
_LAID_CONSTANT_BYTES = 16 << 20


# ---------------------------------------------------------------------------------- the math
def _known(value: Any, expected: int) -> bool:
    return isinstance(value, int) and value == expected


def _repeat(x: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """``n`` copies of ``x`` concatenated along ``dim``: distinct views (XNNPACK counts a
    concatenation's distinct inputs), at most five per ``cat`` (XNNPACK's widest)."""
    parts = [x if i == 0 else aten.view.default(x, list(x.shape)) for i in range(n)]
    while len(parts) > 1:
        parts = [
            parts[i] if len(parts[i : i + 5]) == 1 else aten.cat.default(parts[i : i + 5], dim)
            for i in range(0, len(parts), 5)
        ]
    return parts[0]


def _bmm_mask_math(mask: torch.Tensor, heads_kv: int, group: int) -> torch.Tensor:
    """``mask`` (broadcastable to ``[B, H, L, S]``, H = heads_kv * group) laid out as the scores of
    the grouped ``bmm``, ``[B * heads_kv, group * L, S]``, keeping every broadcast dim it can.

    Copies are ``cat`` of views, not ``expand`` + ``reshape`` (whose contiguous copy XNNPACK would
    take alone between two ops it refuses when two sizes are dynamic)."""
    m = mask
    while m.dim() < 4:
        m = m.unsqueeze(0)
    mb, mh, lm, sm = m.shape
    if not _known(mh, 1):  # one mask per head: heads are (kv head, group member), in order
        return m.reshape(mb * heads_kv, group * lm, sm)
    if _known(mb, 1) or heads_kv == 1:
        base = m.reshape(mb, lm, sm)  # batch (or nothing) broadcast over the kv heads
    else:
        base = _repeat(m, heads_kv, 1).reshape(mb * heads_kv, lm, sm)
    if group > 1 and not _known(lm, 1):
        base = _repeat(base, group, 1)  # the group's queries are stacked along the rows
    return base


def _static_rows(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Static query and key lengths: the scores' batch is then their one dynamic size."""
    return isinstance(q.shape[2], int) and isinstance(k.shape[2], int)


def _batch_shared(mask: torch.Tensor, b: Any, heads_kv: int) -> bool:
    """Whether ``mask`` is a per-head mask shared by the batch, laid out ``[Hkv, G * L, S]``
    (:func:`_bmm_mask_math` with a batch of one), for scores of a batch other than one: the
    scores are then viewed ``[B, Hkv, G * L, S]`` for the add (a mask shared by the heads has
    a first dim of 1 or ``B * Hkv``; with ``Hkv == 1`` the plain broadcast already holds)."""
    return mask.dim() == 3 and heads_kv > 1 and _known(mask.shape[0], heads_kv) and not _known(b, 1)


def _attention_math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """``softmax(q kᵀ * scale + mask) v`` with one ``bmm`` per (batch, key/value head): the
    queries of a head group are stacked along the rows (``[B * Hkv, G * L, E]``)."""
    b, h, lq, e = q.shape
    hk, s, ev = k.shape[1], k.shape[2], v.shape[3]
    g = h // hk
    q3 = q.reshape(b * hk, g * lq, e)
    kt = k.transpose(-1, -2).reshape(b * hk, e, s)
    scores = aten.bmm.default(q3, kt) * scale
    if mask is not None and _batch_shared(mask, b, hk):
        rows = scores.shape[1]
        scores = (scores.reshape(b, hk, rows, s) + mask).reshape(b * hk, rows, s)
    elif mask is not None:
        scores = scores + mask
    probs = aten._softmax.default(scores, -1, False)
    out = aten.bmm.default(probs, v.reshape(b * hk, s, ev))
    return out.reshape(b, h, lq, ev)


@torch.library.custom_op("dualexport::xnnpack_attention", mutates_args=())
def xnnpack_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Attention whose rows all have a visible key (see the module docstring)."""
    return _attention_math(q, k, v, mask, scale).clone()


@xnnpack_attention.register_fake
def _(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.custom_op("dualexport::xnnpack_bmm_mask", mutates_args=())
def xnnpack_bmm_mask(mask: torch.Tensor, heads_kv: int, group: int) -> torch.Tensor:
    """An attention mask laid out for :func:`xnnpack_attention`'s ``bmm`` scores."""
    return _bmm_mask_math(mask, heads_kv, group).clone()


@xnnpack_bmm_mask.register_fake
def _(mask: torch.Tensor, heads_kv: int, group: int) -> torch.Tensor:
    return mask.new_empty(_bmm_mask_math(mask, heads_kv, group).shape)


#: The XNNPACK decomposition-table entries that expand the two private ops.
ATTENTION_TABLE: dict[Any, Any] = {
    torch.ops.dualexport.xnnpack_attention.default: _attention_math,
    torch.ops.dualexport.xnnpack_bmm_mask.default: _bmm_mask_math,
}


# ---------------------------------------------------------------------------------- the plan
def _repeated_heads(node: Any) -> tuple[torch.fx.Node, int] | None:
    """transformers' ``repeat_kv``: ``reshape(expand(unsqueeze(x, 2), [B, Hkv, G, S, E]),
    [B, Hkv * G, S, E])`` -> (x, G)."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target not in _VIEWS:
        return None
    expand: Any = node.args[0]
    if not isinstance(expand, torch.fx.Node) or expand.target is not aten.expand.default:
        return None
    unsq: Any = expand.args[0]
    if not isinstance(unsq, torch.fx.Node) or unsq.target is not aten.unsqueeze.default or unsq.args[1] != 2:
        return None
    src: Any = unsq.args[0]
    if not isinstance(src, torch.fx.Node):
        return None
    sv, ev = src.meta.get("val"), expand.meta.get("val")
    if not isinstance(sv, torch.Tensor) or not isinstance(ev, torch.Tensor) or sv.dim() != 4 or ev.dim() != 5:
        return None
    g = ev.shape[2]
    if not isinstance(g, int) or g < 1 or not isinstance(sv.shape[1], int):
        return None
    return src, g


@dataclass(frozen=True)
class _Plan:
    """How one SDPA call is rewritten."""

    node: torch.fx.Node
    q: torch.fx.Node
    k: torch.fx.Node
    v: torch.fx.Node
    heads_kv: int
    group: int
    mask: torch.fx.Node | None
    causal: bool
    scale: float


def plan_attention(program: ExportedProgram, node: torch.fx.Node) -> _Plan | None:
    q, k, v = (cast(Any, a) for a in node.args[:3])
    if argument(node, "dropout_p", 0.0):
        return None
    vals: list[Any] = [x.meta.get("val") if isinstance(x, torch.fx.Node) else None for x in (q, k, v)]
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and t.dtype == torch.float32 for t in vals):
        return None
    qv, kv, _ = vals
    h = qv.shape[1]
    if not isinstance(h, int):
        return None
    repeated_k, repeated_v = _repeated_heads(k), _repeated_heads(v)
    if repeated_k and repeated_v and repeated_k[1] == repeated_v[1] and kv.shape[1] == h:
        k, v = repeated_k[0], repeated_v[0]
    hk = k.meta["val"].shape[1]
    if not isinstance(hk, int) or hk < 1 or h % hk:
        return None
    if hk not in (h, 1) and k is node.args[1] and not argument(node, "enable_gqa", False):
        return None  # torch refuses it too; one key/value head broadcasts (Falcon's multi-query)
    if not all(str(t.meta["val"].shape[0]) == str(qv.shape[0]) for t in (k, v)):
        return None  # a batch broadcast of the keys: not the grouped layout
    g = h // hk
    mask = argument(node, "attn_mask")
    causal = bool(argument(node, "is_causal", False))
    if causal and (mask is not None or not all(isinstance(x, int) for x in (qv.shape[2], kv.shape[2]))):
        return None
    if not rows_visible(program, mask):
        return None
    if mask is not None:
        mv = mask.meta["val"]
        mb, mh, lm, _ = [1] * (4 - mv.dim()) + list(mv.shape)
        if not (_known(mh, 1) or _known(mh, h)):
            return None
        if _known(mh, h) and h > 1:  # a per-head mask
            if _known(mb, 1) and not _known(qv.shape[0], 1) and hk > 1 and not _static_rows(qv, kv):
                return None  # shared by the batch: added to the scores viewed [B, Hkv, G * L, S]
            if g > 1 and _known(lm, 1) and not _known(qv.shape[2], 1):
                return None
    scale = argument(node, "scale")
    if scale is None:
        e = qv.shape[3]
        if not isinstance(e, int):
            return None
        scale = 1.0 / math.sqrt(e)
    return _Plan(node=node, q=q, k=k, v=v, heads_kv=hk, group=g, mask=mask, causal=causal, scale=float(scale))


# ------------------------------------------------------------------------------- the rewrite
_CASTS = (aten._to_copy.default, aten.to.dtype)
_SCALAR_OPS = (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor)


def _elementwise_with_scalars(node: torch.fx.Node) -> bool:
    """A cast, ``where`` between two scalars, or arithmetic with a scalar: ops that commute
    with the mask's layout (a broadcast and a reshape)."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    if node.target in _CASTS:
        return True
    if node.target is aten.where.Scalar:
        return True
    return node.target in _SCALAR_OPS and len(node.args) == 2 and isinstance(node.args[1], (int, float))


def _sliced_constant(
    program: ExportedProgram, node: torch.fx.Node
) -> tuple[torch.Tensor, list[tuple[int, Any]]] | None:
    """``(value, [(dim, end), ...])`` when ``node`` reads a 4-D lifted constant through prefix
    slices of its last two dims (outermost last), copies and identity views: ``FoldSymbolic``'s
    form of a shape-only mask, e.g. a causal mask under a dynamic sequence."""
    slices: list[tuple[int, Any]] = []
    cur: Any = node
    while isinstance(cur, torch.fx.Node) and cur.op == "call_function":
        src = cur.args[0] if cur.args else None
        if not isinstance(src, torch.fx.Node):
            return None
        if cur.target in (aten.clone.default, aten.alias.default) or (
            cur.target in _VIEWS and str(cur.meta["val"].shape) == str(src.meta["val"].shape)
        ):
            cur = src
            continue
        if cur.target is not aten.slice.Tensor:
            return None
        dim, start, end, step = cast(
            "list[Any]", (list(cur.args[1:]) + [0, None, None, 1][len(cur.args) - 1 :])[:4]
        )
        if not isinstance(dim, int) or dim % 4 not in (2, 3) or start not in (0, None) or step != 1:
            return None
        slices.append((dim % 4, end))
        cur = src
    if not isinstance(cur, torch.fx.Node) or cur.op != "placeholder":
        return None
    name = program.graph_signature.inputs_to_lifted_tensor_constants.get(cur.name)
    value = program.constants.get(name) if name is not None else None
    if not isinstance(value, torch.Tensor) or value.dim() != 4:
        return None
    return value, slices[::-1]


def _laid_constant(
    program: ExportedProgram, source: torch.fx.Node, heads_kv: int, group: int
) -> tuple[torch.Tensor, list[tuple[int, Any]]] | None:
    """The layout of a mask that is slices of a constant, computed once, and the slices to read
    it with; None when the mask is not one, when a group's stacked rows would be sliced, or when
    the layout (a copy per head) would outgrow the mask and :data:`_LAID_CONSTANT_BYTES`."""
    folded = _sliced_constant(program, source)
    if folded is None or (group > 1 and any(dim == 2 for dim, _ in folded[1])):
        return None
    value = _bmm_mask_math(folded[0], heads_kv, group).contiguous().clone()
    if value.nbytes > max(folded[0].nbytes, _LAID_CONSTANT_BYTES):
        return None
    return value, folded[1]


def mask_layout(
    program: ExportedProgram, mask: torch.fx.Node, heads_kv: int, group: int, fake_mode: Any
) -> torch.fx.Node:
    """``mask`` in the grouped ``bmm`` layout, once. With two dynamic sizes (a sequence's mask is
    ``[.., S, S]``) the layout's reshape is one XNNPACK cannot take: it is then applied before the
    casts and scalar arithmetic that made the additive mask, and those after it, so that it sits
    with the other ops XNNPACK cannot take (the boolean mask's), before the delegate, instead of
    between two delegated parts. A mask that is slices of a constant (a folded causal mask) is
    laid out once, as a new constant, and sliced: no reshape runs at all."""
    graph = program.graph
    chain = []
    source: Any = mask
    dynamic = sum(not isinstance(s, int) for s in mask.meta["val"].shape)
    while dynamic > 1 and _elementwise_with_scalars(source):
        chain.append(source)
        source = source.args[0]
    add = Inserter(graph, mask, fake_mode)
    laid = _laid_constant(program, source, heads_kv, group) if dynamic > 1 else None
    if laid is not None:
        value, slices = laid
        out = lift_constant(program, value, prefix="_xnnpack_mask_layout", fake_mode=fake_mode)
        for dim, end in slices:  # the layout keeps the rows and keys as its last two dims
            out = add(aten.slice.Tensor, (out, dim - 1, 0, end))
    else:
        out = add(torch.ops.dualexport.xnnpack_bmm_mask.default, (source, heads_kv, group))
    for op in reversed(chain):
        out = add(op.target, (out, *op.args[1:]), op.kwargs)
    return out


def _causal_mask(lq: int, s: int) -> torch.Tensor:
    keep = torch.ones(lq, s, dtype=torch.bool).tril()
    return torch.zeros(lq, s).masked_fill(~keep, float("-inf"))


class XnnpackAttention(ProgramPass):
    """SDPA calls whose rows provably all have a visible key, as XNNPACK's guard-free attention
    (a new program: the shared program is never edited)."""

    serves = "xnnpack"
    in_place = False

    def call(self, program: ExportedProgram) -> ExportedProgram:
        names = [
            n.name
            for n in program.graph.nodes
            if n.op == "call_function" and n.target is _SDPA and plan_attention(program, n)
        ]
        if not names:
            return program
        new = copy_program(program)
        graph = new.graph
        fake_mode = fake_mode_of(new)
        by_name = {n.name: n for n in graph.nodes}
        layouts: dict[tuple[Any, int, int], torch.fx.Node] = {}
        for name in names:
            plan = plan_attention(new, by_name[name])
            if plan is None:
                continue
            mask3 = None
            if plan.causal:
                lq, s = plan.q.meta["val"].shape[2], plan.k.meta["val"].shape[2]
                key: Any = ("causal", lq, s)
                source = layouts.get((key, plan.heads_kv, plan.group))
                if source is None:
                    const = lift_constant(
                        new, _causal_mask(lq, s), prefix="_xnnpack_causal_mask", fake_mode=fake_mode
                    )
                    add = Inserter(graph, const, fake_mode)
                    source = add(
                        torch.ops.dualexport.xnnpack_bmm_mask.default, (const, plan.heads_kv, plan.group)
                    )
                    layouts[(key, plan.heads_kv, plan.group)] = source
                mask3 = source
            elif plan.mask is not None:
                key = (plan.mask, plan.heads_kv, plan.group)
                mask3 = layouts.get(key)
                if mask3 is None:
                    mask3 = mask_layout(new, plan.mask, plan.heads_kv, plan.group, fake_mode)
                    layouts[key] = mask3
            node = plan.node
            with graph.inserting_before(node):
                att = call(
                    graph,
                    torch.ops.dualexport.xnnpack_attention.default,
                    (plan.q, plan.k, plan.v, mask3, plan.scale),
                    fake_mode=fake_mode,
                )
            att.meta.update({k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")})
            replace_all_uses(program, node, att)
            graph.erase_node(node)
        graph.eliminate_dead_code()
        graph.lint()
        new.graph_module.recompile()
        return new
