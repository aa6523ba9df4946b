"""Rewrite ops XNNPACK refuses (or that split its partitions) into ops it takes, once, on the
shared program, so ONNX Runtime and ExecuTorch run the same arithmetic.

Why: every op the XNNPACK partitioner leaves out splits a delegated subgraph; lowering time grows
with the number of subgraphs and each boundary costs a portable-kernel call per inference. The
refused ops in transformer blocks are few and mechanical: ``native_layer_norm`` (no XNNPACK node),
the safe-softmax prologue of the decomposed ``scaled_dot_product_attention`` (``any``/``eq``/
``logical_not``/``where``/``full_like``), ``squeeze``/``select`` (no node), ``unsqueeze`` other
than on the last dim, and same-shape ``expand`` copies made by ``matmul``'s decomposition. Each
rewrite below keeps the result's shape, dtype and value (up to float rounding) and declines
(``NotImplemented``: the op stays as it was) whenever a condition for that is not met.

The rewrites run through ``ExportedProgram.run_decompositions`` with a table of only these ops, so
every other op (``linear``, ``conv`` ...) is preserved and symbolic shapes are traced correctly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

__all__ = [
    "decompose_layer_norm",
    "attention_as_bmm",
    "views_for_shape_ops",
    "xnnpack_friendly",
    "REWRITES",
]

aten = torch.ops.aten


def _static(shape: Sequence[Any]) -> bool:
    return all(isinstance(s, int) for s in shape)


def _known_equal(a: Sequence[Any], b: Sequence[Any]) -> bool:
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------ layer norm
def _layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    cudnn_enable: bool = True,
) -> Any:
    """LayerNorm over the last dim as XNNPACK ops: the mean is a global average pool of the
    input seen as ``[N, 1, 1, D]`` (XNNPACK's ``mean.dim`` takes 4-D, dims (2, 3), keepdim)."""
    if len(normalized_shape) != 1 or x.dtype != torch.float32 or not isinstance(x.shape[-1], int):
        return NotImplemented
    d = x.shape[-1]
    x4 = x.reshape(-1, 1, 1, d)
    mean = aten.mean.dim(x4, [2, 3], True)
    xc = x4 - mean
    var = aten.mean.dim(xc * xc, [2, 3], True)
    y = xc * aten.rsqrt.default(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y.reshape(x.shape)


# ------------------------------------------------------------------------------- attention
def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """Attention as ``bmm``/``mul``/``add``/``_softmax``/``bmm`` when no mask is given.

    With a mask, torch's math decomposition uses a "safe" softmax (a row masked out everywhere
    gives zeros, not NaN) whose prologue XNNPACK refuses; that semantics is kept by declining.
    """
    if (
        attn_mask is not None
        or dropout_p != 0.0
        or is_causal
        or enable_gqa
        or q.dim() != 4
        or q.dtype != torch.float32
    ):
        return NotImplemented
    if not (_known_equal(q.shape[:2], k.shape[:2]) and _known_equal(k.shape[:3], v.shape[:3])):
        return NotImplemented
    b, h, lq, e = q.shape
    s, ev = k.shape[2], v.shape[3]
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    q3 = q.reshape(-1, lq, e)
    kt3 = k.transpose(-1, -2).reshape(-1, e, s)
    scores = aten.bmm.default(q3, kt3) * scale
    attn = aten._softmax.default(scores, -1, False)
    out = aten.bmm.default(attn, v.reshape(-1, s, ev))
    return out.reshape(b, h, lq, ev)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> Any:
    """Batched matmul with equal batch dims as reshape + ``bmm``: no ``expand`` copy."""
    if a.dim() < 3 or a.dim() != b.dim() or not _known_equal(a.shape[:-2], b.shape[:-2]):
        return NotImplemented
    if a.dim() == 3:
        return aten.bmm.default(a, b)
    m, kk, n = a.shape[-2], a.shape[-1], b.shape[-1]
    out = aten.bmm.default(a.reshape(-1, m, kk), b.reshape(-1, kk, n))
    return out.reshape(*a.shape[:-2], m, n)


# ------------------------------------------------------------------------------ shape ops
def _as_view(op: Callable[..., torch.Tensor]) -> Callable[..., Any]:
    """``squeeze``/``unsqueeze``: a ``view`` to the same (static) shape, which XNNPACK takes."""

    def rewrite(x: torch.Tensor, *args: Any) -> Any:
        if not _static(x.shape):
            return NotImplemented
        shape = list(x.shape)
        if op is aten.unsqueeze.default:
            dim = args[0] % (len(shape) + 1)
            shape.insert(dim, 1)
        else:
            dims = args[0] if args else list(range(len(shape)))
            dims = [dims] if isinstance(dims, int) else list(dims)
            dims = {d % max(len(shape), 1) for d in dims}
            shape = [s for i, s in enumerate(shape) if not (i in dims and s == 1)]
        return aten.view.default(x, shape)

    rewrite.__name__ = f"{op.__name__}_as_view"
    return rewrite


def _select(x: torch.Tensor, dim: int, index: int) -> Any:
    """``select`` as a one-wide ``slice`` plus a ``view`` (static shapes only)."""
    if not _static(x.shape) or not isinstance(index, int):
        return NotImplemented
    dim = dim % x.dim()
    index = index % x.shape[dim]
    out_shape = [s for i, s in enumerate(x.shape) if i != dim]
    return aten.slice.Tensor(x, dim, index, index + 1).reshape(out_shape)


def _expand(x: torch.Tensor, size: Sequence[Any], *, implicit: bool = False) -> Any:
    """An ``expand`` to the tensor's own shape is the identity: a ``view``, not a copy."""
    if not _static(x.shape) or len(size) != x.dim():
        return NotImplemented
    target = [x.shape[i] if s == -1 else s for i, s in enumerate(size)]
    if target != list(x.shape):
        return NotImplemented
    return aten.view.default(x, list(x.shape))


#: op -> rewrite; grouped so a user can pick a subset.
decompose_layer_norm: dict[Any, Callable[..., Any]] = {aten.layer_norm.default: _layer_norm}
attention_as_bmm: dict[Any, Callable[..., Any]] = {
    aten.scaled_dot_product_attention.default: _sdpa,
    aten.matmul.default: _matmul,
}
views_for_shape_ops: dict[Any, Callable[..., Any]] = {
    aten.squeeze.dim: _as_view(aten.squeeze.dim),
    aten.squeeze.dims: _as_view(aten.squeeze.dims),
    aten.squeeze.default: _as_view(aten.squeeze.default),
    aten.unsqueeze.default: _as_view(aten.unsqueeze.default),
    aten.select.int: _select,
    aten.expand.default: _expand,
}
REWRITES: dict[str, dict[Any, Callable[..., Any]]] = {
    "layer_norm": decompose_layer_norm,
    "attention": attention_as_bmm,
    "shape_ops": views_for_shape_ops,
}


def xnnpack_friendly(program: ExportedProgram) -> ExportedProgram:
    """Apply every rewrite in :data:`REWRITES` (one ``run_decompositions`` pass)."""
    table: dict[Any, Callable[..., Any]] = {}
    for group in REWRITES.values():
        table.update(group)
    return program.run_decompositions(table)
