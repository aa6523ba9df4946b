"""The fully-masked-row guard of a float attention mask, in ops XNNPACK takes, on the XNNPACK
program.

Why: ``shared_state/passes/attention.py`` keeps the meaning of a fully masked row (zeros, as eager
gives) for a float mask it cannot prove finite (one computed from parameters: BEiT's and Swin's
relative position bias, T5's position bias) by writing ``where(any(m != -inf, -1), m, 0)`` as the
additive mask and ``any(..).to(float)`` as a factor on the attention's output. XNNPACK has no
``ne``, ``any``, ``where`` or bool cast, and the mask is computed inside the model (from the
delegated bias arithmetic), so every such layer split the delegate (tiny BEiT: 3 subgraphs, Swin 4).

The same values from ops XNNPACK has, with ``lo = finfo.min``:

* the additive mask ``clamp(m, min=lo)``: a visible row is unchanged in its softmax (a ``-inf``
  key and a ``lo`` key both give ``exp(..) == 0`` beside a visible one, bit for bit); a fully
  masked row becomes finite, and the factor zeroes its output;
* the factor ``clamp(1 + max(m - clamp(m, min=lo), -1), 0, 1)``: ``m - clamp(m, min=lo)`` is ``0``
  where a key is visible and ``-inf`` where it is masked, so the row max is ``0`` (factor 1) or
  ``-inf`` (factor 0), exactly.

XNNPACK's max runs as a 2-D max pooling over a 4-D tensor whose pooled size is fixed in the file,
so the rewrite needs the keys' size static (rank 3 is viewed as 4-D); anything else keeps the guard.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.export import ExportedProgram

from ..shared_state.passes.base import ProgramPass
from ..shared_state.passes.graph_edit import (
    Inserter,
    constant_value,
    fake_mode_of,
    finish_edit,
    replace_all_uses,
)

__all__ = ["MaskedRowsAsMax", "guarded_mask", "GUARD_WHERES", "GUARD_CASTS"]

aten = torch.ops.aten
_CASTS = GUARD_CASTS = (aten._to_copy.default, aten.to.dtype)
_WHERES = GUARD_WHERES = (aten.where.self, aten.where.ScalarOther)
_ASSERT = aten._assert_tensor_metadata.default


def guarded_mask(
    program: ExportedProgram, visible: torch.fx.Node, *, static_keys: bool = True
) -> torch.fx.Node | None:
    """``m`` when ``visible`` is ``any(m != -inf, -1, keepdim=True)`` on a float ``m`` (whose keys'
    size is static, with ``static_keys``) and whose every other reader of ``visible`` is the
    guard's ``where`` (to 0) or a float cast."""
    if visible.target is not aten.any.dim or len(visible.args) < 3 or visible.args[2] is not True:
        return None
    finite = visible.args[0]
    if not isinstance(finite, torch.fx.Node) or finite.target is not aten.ne.Scalar:
        return None
    mask = finite.args[0]
    if finite.args[1] != float("-inf") or not isinstance(mask, torch.fx.Node):
        return None
    val = mask.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.is_floating_point() or val.dim() not in (3, 4):
        return None
    if visible.args[1] not in (-1, val.dim() - 1):
        return None
    if static_keys and not isinstance(val.shape[-1], int):
        return None
    if static_keys and val.dim() == 3 and sum(not isinstance(s, int) for s in val.shape) > 1:
        return None  # viewed as 4-D: one dynamic size at most (written -1)
    for user in visible.users:
        if user.target is _ASSERT or (user.target in _CASTS and user.meta["val"].dtype == val.dtype):
            continue
        if _zero_fill(program, user, visible, mask):
            continue
        return None
    return mask


def _zero_fill(
    program: ExportedProgram, node: torch.fx.Node, visible: torch.fx.Node, mask: torch.fx.Node
) -> bool:
    """Whether ``node`` is ``where(visible, mask, 0)`` (the 0 a scalar, or a constant once
    decomposition made it one)."""
    if node.target not in _WHERES or node.args[:2] != (visible, mask):
        return False
    other = node.args[2]
    if isinstance(other, (int, float)):
        return float(other) == 0.0
    value = constant_value(program, other)
    return value is not None and value.numel() == 1 and float(value) == 0.0


class MaskedRowsAsMax(ProgramPass):
    """``where(any(m != -inf), m, 0)`` -> ``clamp(m, min=lo)``; ``any(..).to(float)`` -> the row
    max of ``m - clamp(m, min=lo)`` plus one, clamped to [0, 1] (see the module docstring)."""

    serves = "xnnpack"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        fake_mode = fake_mode_of(program)
        changed = False
        for visible in list(program.graph.nodes):
            mask = guarded_mask(program, visible) if visible.op == "call_function" else None
            if mask is None:
                continue
            self._rewrite(program, visible, mask, fake_mode)
            changed = True
        return finish_edit(program) if changed else program

    @staticmethod
    def _rewrite(
        program: ExportedProgram, visible: torch.fx.Node, mask: torch.fx.Node, fake_mode: Any
    ) -> None:
        val = mask.meta["val"]
        lowest = torch.finfo(val.dtype).min
        add = Inserter(visible.graph, visible, fake_mode)
        clamped = add(aten.clamp.default, (mask, lowest))
        masked = add(aten.sub.Tensor, (mask, clamped))  # 0 where visible, -inf where masked
        shape = [s if isinstance(s, int) else -1 for s in val.shape]
        if val.dim() == 3:
            masked = add(aten.view.default, (masked, [1, *shape]))
        row_max = add(operator.getitem, (add(aten.max.dim, (masked, 3, True)), 0))
        if val.dim() == 3:
            row_max = add(aten.view.default, (row_max, [*shape[:-1], 1]))
        factor = add(aten.clamp.default, (add(aten.add.Tensor, (row_max, 1.0)), 0.0, 1.0))
        for user in list(visible.users):
            if user.target is not _ASSERT:
                replace_all_uses(program, user, clamped if user.target in _WHERES else factor)
