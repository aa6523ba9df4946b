"""Attention masks written once, with the meaning of a fully masked row explicit.

``scaled_dot_product_attention`` with a mask gives zeros for a query row whose keys are all
masked out (torch's math path and its CPU kernels use ``_safe_softmax``). ONNX Runtime, fed what
torch.onnx 2.13 writes for the same call, does not: a boolean mask gives the mean of the values
over every key (its translation replaces the softmax's NaN by the unmasked weights), an additive
``-inf`` mask gives NaN (checked here with ORT 1.31). A padded batch meets such rows (a left-padded
decoder's padded queries; an encoder sequence that is all padding), so the shared program spells
the meaning out, and every runtime then computes what eager computes:

* the mask becomes one additive mask, computed once per mask (not once per layer, as each
  attention call's own conversion was; a mask that every layer builds anew from the same inputs
  by the same ops, T5's ``where(mask, position_bias, min)``, counts once): a boolean mask ``m`` becomes ``(float(m) - 1) *
  finfo.max`` (0 where visible, ``finfo.min`` where masked; the cast is the one op XNNPACK
  cannot take, the rest it can), a float one keeps its values and a row that is ``-inf``
  everywhere becomes 0; a mask that is only a broadcast (``expand``, ``& all-True``) is used
  unbroadcast, as SDPA broadcasts it itself;
* a row factor ``r`` (1 where some key is visible, 0 where none is; ``amax`` of the cast mask
  over the keys), also computed once, scales each attention output: a fully masked row comes
  out as the zeros eager gives, whatever the runtime's softmax makes of it.

With ``finfo.min`` in place of ``-inf`` the softmax of a row with a visible key is unchanged bit
for bit (``exp(finfo.min - max)`` underflows to 0 as ``exp(-inf)`` does), and no runtime ever
sees a row without a visible key, which is what lets XNNPACK's rewrite drop the guard
(``exporters/xnnpack_attention.py``, with :func:`rows_visible` as the proof).

A mask that is a constant (folded by ``FoldConstants``, which runs before this pass) is decided
by its values: a boolean one becomes an additive constant (one ``Add`` per layer in ONNX instead of
torch.onnx's Where/IsNaN/Where), and ``r`` is added only when some row is really fully masked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
from torch.export import ExportedProgram

from .base import ProgramPass
from .broadcasts import repeated
from .fold import FOLD_MAX_BYTES
from .graph_edit import (
    Inserter,
    argument,
    call,
    constant_value,
    drop_dead_constants,
    fake_mode_of,
    lift_constant,
    replace_all_uses,
    structure,
)

__all__ = ["ExplicitMaskedRows", "rows_visible", "SDPA", "ROW_FACTOR_PREFIX"]

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default
#: Name prefix of the lifted constants this pass adds (additive masks, row factors).
ROW_FACTOR_PREFIX = "_attention_mask"


def _mask_key(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.dtype] | None:
    """(mask node, query dtype) of an SDPA call this pass rewrites, or None."""
    mask = argument(node, "attn_mask")
    q = node.args[0]
    if not isinstance(mask, torch.fx.Node) or not isinstance(q, torch.fx.Node):
        return None
    if argument(node, "is_causal", False) or argument(node, "dropout_p", 0.0):
        return None
    qv, mv = q.meta.get("val"), mask.meta.get("val")
    if not isinstance(qv, torch.Tensor) or not isinstance(mv, torch.Tensor) or not qv.is_floating_point():
        return None
    if mv.dtype != torch.bool and mv.dtype != qv.dtype:
        return None
    if mv.dim() < 1:
        return None
    return mask, qv.dtype


_VIEW_OPS = (aten.unsqueeze.default, aten.view.default, aten.reshape.default, aten._unsafe_view.default)


# ------------------------------------------------------------------------------- the proof
def _finite_scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bounds(program: ExportedProgram, node: Any, depth: int = 0) -> tuple[float, float] | None:
    """Bounds (in exact arithmetic) of every value ``node`` can take, from a few op rules: a
    bool or integer tensor cast to float, ``where`` between bounded values, a scalar tensor, and
    ``add``/``sub``/``mul`` of bounded values. None: not known to be bounded."""
    if _finite_scalar(node):
        return float(node), float(node)
    if not isinstance(node, torch.fx.Node) or depth > 16:
        return None
    value = constant_value(program, node)
    if value is not None:
        if value.numel() == 0 or value.is_complex():
            return None
        lo, hi = float(value.min()), float(value.max())
        return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None
    if node.op != "call_function":
        return None
    target, args = node.target, cast(Any, node.args)
    if target in (aten._to_copy.default, aten.to.dtype) and isinstance(args[0], torch.fx.Node):
        src = args[0].meta.get("val")
        if isinstance(src, torch.Tensor) and src.dtype == torch.bool:
            return 0.0, 1.0
        if isinstance(src, torch.Tensor) and src.is_floating_point():
            return _bounds(program, args[0], depth + 1)
        return None
    if target in _VIEW_OPS or target in (
        aten.expand.default,
        aten.permute.default,
        aten.clone.default,
        aten.slice.Tensor,
    ):
        return _bounds(program, args[0], depth + 1)
    if target is aten.where.Scalar and _finite_scalar(args[1]) and _finite_scalar(args[2]):
        return min(args[1], args[2]), max(args[1], args[2])
    if target is aten.scalar_tensor.default and _finite_scalar(args[0]):
        return float(args[0]), float(args[0])
    if target in (aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf) and len(args) == 3:
        # transformers' eager mask: where(m, 0, finfo.min)
        a, b = _bounds(program, args[1], depth + 1), _bounds(program, args[2], depth + 1)
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    if target in (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor) and len(args) == 2:
        if node.kwargs.get("alpha", 1) != 1:
            return None
        a, b = _bounds(program, args[0], depth + 1), _bounds(program, args[1], depth + 1)
        if a is None or b is None:
            return None
        if target is aten.add.Tensor:
            return a[0] + b[0], a[1] + b[1]
        if target is aten.sub.Tensor:
            return a[0] - b[1], a[1] - b[0]
        products = [x * y for x in a for y in b]
        return min(products), max(products)
    return None


def rows_visible(program: ExportedProgram, mask: Any) -> bool:
    """True when no query row of ``mask`` (an SDPA ``attn_mask``) can be fully masked: every row
    of every value it can take has a visible key (True, or not ``-inf``).

    Proved, not assumed: no mask; a constant, by its values; a float mask whose values are
    bounded within the float range (no ``-inf`` at all), e.g. this pass's ``(m - 1) * finfo.max``;
    or this pass's ``where(any(m != -inf, -1, keepdim), m, 0)`` (a row without a visible key
    is set to 0)."""
    if mask is None:
        return True
    if not isinstance(mask, torch.fx.Node):
        return False
    value = constant_value(program, mask)
    if value is not None:
        with torch.no_grad():
            seen = value if value.dtype == torch.bool else value != float("-inf")
            return bool(seen.any(-1).all()) if value.dim() else bool(seen)
    val = mask.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.is_floating_point():
        return False
    bounds = _bounds(program, mask)
    if bounds is not None:
        top = torch.finfo(val.dtype).max
        return -top <= bounds[0] and bounds[1] <= top
    mask, _ = _inserted_dims(mask)  # size-1 dims inserted before the last change no row
    val = mask.meta.get("val")
    if mask.op == "call_function" and mask.target is aten.where.ScalarOther and isinstance(val, torch.Tensor):
        visible, values, other = cast(Any, mask.args[:3])
        return bool(
            _finite_scalar(other)
            and isinstance(visible, torch.fx.Node)
            and visible.target is aten.any.dim
            and visible.args[1] in (-1, val.dim() - 1)
            and isinstance(visible.args[0], torch.fx.Node)
            and visible.args[0].target is aten.ne.Scalar
            and visible.args[0].args[0] is values
            and visible.args[0].args[1] == float("-inf")
        )
    return False


# ------------------------------------------------------------------------------- the rewrite
def _constant_forms(value: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(additive mask, row factor or None when no row is fully masked) of a constant mask."""
    with torch.no_grad():
        if value.dtype == torch.bool:
            visible = value.any(-1, keepdim=True)
            additive = torch.zeros(value.shape, dtype=dtype).masked_fill(~value & visible, float("-inf"))
        else:
            visible = (value != float("-inf")).any(-1, keepdim=True)
            additive = value.masked_fill(~visible, 0.0).to(dtype)
        factor = None if bool(visible.all()) else visible.to(dtype)
    return additive.contiguous(), factor


class ExplicitMaskedRows(ProgramPass):
    """SDPA masks as one additive mask per mask node, and fully masked rows as explicit zeros."""

    serves = "shared"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        graph = program.graph
        groups: dict[tuple[torch.fx.Node, torch.dtype], list[torch.fx.Node]] = {}
        memo: dict[Any, Any] = {}
        first: dict[Any, torch.fx.Node] = {}  # one node per mask computation: the earliest
        changed = False
        for node in graph.nodes:
            if node.op != "call_function" or node.target is not SDPA:
                continue
            key = _mask_key(node)
            if key is None:
                continue
            mask, dtype = key
            source = _broadcast_source(program, mask)
            source = first.setdefault(structure(source, memo), source)
            if source is not mask:
                _set_mask(node, source)
                changed = True
            if source.meta["val"].dtype != torch.bool and rows_visible(program, source):
                continue  # already additive with a visible key in every row (e.g. a rerun)
            groups.setdefault((source, dtype), []).append(node)
        fake_mode = fake_mode_of(program)
        for (mask, dtype), users in groups.items():
            forms = self._forms(program, mask, dtype, fake_mode)
            if forms is None:
                continue
            additive, factor = forms
            for sdpa in users:
                _set_mask(sdpa, additive)
                if factor is not None:
                    with graph.inserting_after(sdpa):
                        scaled = call(graph, aten.mul.Tensor, (sdpa, factor), fake_mode=fake_mode)
                    replace_all_uses(program, sdpa, scaled, delete_user_cb=_not(scaled))
            changed = True
        if changed:
            graph.eliminate_dead_code()
            drop_dead_constants(program)
            graph.lint()
            program.graph_module.recompile()
        return program

    def _forms(
        self, program: ExportedProgram, mask: torch.fx.Node, dtype: torch.dtype, fake_mode: Any
    ) -> tuple[torch.fx.Node, torch.fx.Node | None] | None:
        """The additive mask and the row factor (None: no row can be fully masked) of ``mask``."""
        graph = program.graph
        value = constant_value(program, mask)
        if value is not None:
            if value.numel() * torch.finfo(dtype).bits // 8 > FOLD_MAX_BYTES:
                return None
            additive_value, factor_value = _constant_forms(value, dtype)
            add_node = lift_constant(
                program, additive_value, prefix=ROW_FACTOR_PREFIX, meta_from=mask, fake_mode=fake_mode
            )
            factor_node = (
                lift_constant(
                    program, factor_value, prefix=ROW_FACTOR_PREFIX, meta_from=mask, fake_mode=fake_mode
                )
                if factor_value is not None
                else None
            )
            return add_node, factor_node
        add = Inserter(graph, mask, fake_mode)
        if mask.meta["val"].dtype == torch.bool:
            # 0 where visible, finfo.min where masked: (m - 1) * finfo.max, in the mask's own
            # broadcast shape; the row factor is the max over the keys (1 if any is visible)
            flags = _cast_before_views(add, mask, dtype)
            additive = add(aten.mul.Tensor, (add(aten.sub.Tensor, (flags, 1.0)), torch.finfo(dtype).max))
            factor = add(aten.amax.default, (flags, [-1], True))
        else:
            # on the mask before the size-1 dims its views insert (``m[:, None, None, :]``), so
            # that these ops, which XNNPACK cannot take, come before the views, which it can
            source, unsqueezes = _inserted_dims(mask)
            finite = add(aten.ne.Scalar, (source, float("-inf")))
            visible = add(aten.any.dim, (finite, -1, True))
            additive = add(aten.where.ScalarOther, (visible, source, 0.0))
            factor = add(aten._to_copy.default, (visible,), {"dtype": dtype})
            for dim in unsqueezes:
                additive = add(aten.unsqueeze.default, (additive, dim))
                factor = add(aten.unsqueeze.default, (factor, dim))
        return additive, factor


_CASTS = (aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten._to_copy.default)


def _inserted_dims(mask: torch.fx.Node) -> tuple[torch.fx.Node, list[int]]:
    """``mask`` as ``unsqueeze``s (none at the last dim) of a source: (source, dims in order)."""
    dims: list[int] = []
    src: Any = mask
    while (
        src.op == "call_function"
        and src.target is aten.unsqueeze.default
        and isinstance(src.args[0], torch.fx.Node)
    ):
        rank = src.meta["val"].dim()
        dim = src.args[1] % rank
        if dim == rank - 1:
            break
        dims.append(dim)
        src = src.args[0]
    return src, dims[::-1]


def _same_dtype_cast(node: torch.fx.Node) -> bool:
    """A cast that changes nothing (bool to bool): transformers' masks carry a few."""
    if node.target not in _CASTS:
        return False
    first: Any = node.args[0]
    src, out = first.meta.get("val"), node.meta.get("val")
    return isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor) and src.dtype == out.dtype


def _cast_before_views(add: Inserter, mask: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
    """``mask`` cast to ``dtype``, the cast placed before the views that made ``mask`` (casts
    commute with views): the views then act on floats, which XNNPACK takes, and the one op it
    cannot take (the cast) sits at the start."""
    chain = []
    src = mask
    while src.op == "call_function" and isinstance(src.args[0], torch.fx.Node):
        if src.target in _VIEW_OPS:
            chain.append(src)
        elif not _same_dtype_cast(src):
            break
        src = src.args[0]
    out = add(aten._to_copy.default, (src,), {"dtype": dtype})
    for view in reversed(chain):
        out = add(view.target, (out, *view.args[1:]), view.kwargs)
    return out


def _broadcast_source(program: ExportedProgram, mask: torch.fx.Node) -> torch.fx.Node:
    """The value ``mask`` broadcasts, when it is only a broadcast of one (SDPA broadcasts its mask
    itself): ``expand(x)``, or ``x & c`` / ``c & x`` with ``c`` all True (:func:`~.broadcasts.repeated`)."""
    while (src := repeated(program, mask)) is not None:
        mask = src
    return mask


def _not(kept: torch.fx.Node) -> Callable[[torch.fx.Node], bool]:
    return lambda user: user is not kept


def _set_mask(node: torch.fx.Node, mask: torch.fx.Node) -> None:
    if "attn_mask" in node.kwargs:
        node.kwargs = {**node.kwargs, "attn_mask": mask}
    else:
        args = list(node.args)
        args[3] = mask
        node.args = tuple(args)
