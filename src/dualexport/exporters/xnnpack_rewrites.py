"""Rewrite ops XNNPACK refuses (or that split its partitions) into ops it takes: the XNNPACK
target's own pass pipeline, run while its decomposed program is made (``decomposed["xnnpack"]``),
never on the shared program, so ONNX keeps the ops ONNX Runtime fuses best (LayerNormalization
and attention stay whole there; the layer_norm rewrite cost ORT 1.4x on tiny BERT).

Why: every op the XNNPACK partitioner leaves out splits a delegated subgraph; lowering time grows
with the number of subgraphs and each boundary costs a portable-kernel call per inference. The
refused ops in transformer blocks are few and mechanical: ``native_layer_norm`` (no XNNPACK node),
the safe-softmax prologue of the decomposed ``scaled_dot_product_attention`` (``any``/``eq``/
``logical_not``/``where``/``full_like``), ``squeeze``/``select`` (no node), ``unsqueeze`` other
than on the last dim, and same-shape ``expand`` copies made by ``matmul``'s decomposition. Each
rewrite below keeps the result's shape, dtype and value (up to float rounding) and declines
(``NotImplemented``: the op stays as it was) whenever a condition for that is not met.

The rewrites are entries of the XNNPACK decomposition table (``XnnpackExporter.decompose``): one
``run_decompositions`` call makes the decomposed program, and symbolic shapes are traced correctly.

"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from ..compat.torch import set_weight_dicts
from ..shared_state.passes.base import ProgramPass
from ..shared_state.passes.fold import fold_constants
from .xnnpack_attention import ATTENTION_TABLE, XnnpackAttention
from .xnnpack_bmm_attention import BmmAttentionAsSdpa
from .xnnpack_dynamic import DYNAMIC_PASSES
from .xnnpack_heads import HEADS_TABLE, XnnpackHeadAttention
from .xnnpack_masked_rows import MaskedRowsAsMax
from .xnnpack_max_dim import MaxDimFromFront, ShiftedSoftmax
from .xnnpack_partitions import LinearForTransposedWeight, SliceOfConcat, UntieEmbeddings
from .xnnpack_patterns import ErfGelu, MaskedScoresAsSum
from .xnnpack_unit_views import UnitDimViews

__all__ = [
    "decompose_layer_norm",
    "attention_as_bmm",
    "views_for_shape_ops",
    "xnnpack_friendly",
    "rewrite_table",
    "XnnpackRewrites",
    "FoldDecomposed",
    "run_pipeline",
    "pipeline_names",
    "REWRITES",
    "SUM_AS_LINEAR_MAX",
    "mean_as_global_pool",
]

aten = torch.ops.aten


def _static(shape: Sequence[Any]) -> bool:
    return all(isinstance(s, int) for s in shape)


def _viewable(shape: Sequence[Any]) -> bool:
    """At most one dynamic size: a view to ``shape`` can be written with one -1, the only
    dynamic form XNNPACK's reshape takes (``xnnpack_dynamic.SymbolicViews`` writes it)."""
    return sum(not isinstance(s, int) for s in shape) <= 1


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
    """LayerNorm over the last dim as XNNPACK ops. Both means are a fully connected layer with
    one output (a ``[1, D]`` row of ``1/D``): no reshape around them, so the rewrite holds with
    any number of dynamic leading dims (XNNPACK's reshape takes one), and no layout change
    (``mean.dim``, XNNPACK's global average pool, takes NHWC 4-D and costs two transposes per
    mean inside the delegate)."""
    if len(normalized_shape) != 1 or x.dtype != torch.float32 or not isinstance(x.shape[-1], int):
        return NotImplemented
    d = x.shape[-1]
    row = torch.full((1, d), 1.0 / d, dtype=x.dtype)
    xc = x - aten.linear.default(x, row)
    var = aten.linear.default(xc * xc, row)
    y = xc * aten.rsqrt.default(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def _group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    cudnn_enabled: bool = True,
) -> Any:
    """GroupNorm as XNNPACK ops: each group's values seen as ``[N * G, 1, 1, M]`` and normalized
    by two global average pools (M spans spatial dims: a pool, not ``_layer_norm``'s row of
    ``1/D``, whose weight would grow with the input), then the per-channel affine
    (wav2vec2-style speech encoders normalize their first convolution so; XNNPACK has no group
    norm node and the op split the delegate)."""
    if x.dtype != torch.float32 or x.dim() < 2 or not _static(x.shape[1:]) or not _viewable(x.shape):
        return NotImplemented
    c = x.shape[1]
    if c % num_groups:
        return NotImplemented
    m = (c // num_groups) * math.prod(x.shape[2:])
    x4 = x.reshape(-1, 1, 1, m)
    mean = aten.mean.dim(x4, [2, 3], True)
    xc = x4 - mean
    var = aten.mean.dim(xc * xc, [2, 3], True)
    y = (xc * aten.rsqrt.default(var + eps)).reshape(x.shape)
    affine = [c] + [1] * (x.dim() - 2)
    if weight is not None:
        y = y * weight.reshape(affine)
    if bias is not None:
        y = y + bias.reshape(affine)
    return y


def _hardsigmoid(x: torch.Tensor) -> Any:
    """``hardsigmoid`` as ``hardtanh(x + 3, 0, 6) / 6`` (ATen's own formula): its default
    decomposition converts integer scalar constants to float, which XNNPACK does not take
    (MobileNetV3's squeeze-excitation)."""
    if x.dtype != torch.float32:
        return NotImplemented
    return aten.hardtanh.default(x + 3.0, 0.0, 6.0) / 6.0


# ------------------------------------------------------------------------------- reductions
def _mean(x: torch.Tensor, dims: Sequence[int] | None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """``mean`` over the innermost one or two dims as XNNPACK's global average pooling: the
    input seen as ``[N, 1, 1, D]`` (or ``[N, 1, H, W]``), mean over dims (2, 3) kept, then the
    result's shape (XNNPACK takes ``mean.dim`` only on 4-D, dims (2, 3), keepdim). With two
    dynamic sizes, a kept mean over the last dim is a ``linear`` instead."""
    if dtype is not None or x.dtype != torch.float32 or not dims or x.dim() < 1:
        return NotImplemented
    rank = x.dim()
    axes = sorted({d % rank for d in dims})
    if not _static([x.shape[a] for a in axes]):
        return NotImplemented
    if axes == [rank - 1] and keepdim and not _viewable(x.shape):
        # batch and sequence dynamic (T5's RMSNorm): a view to [N, 1, 1, D] and back would carry
        # two symbolic sizes; a fully connected layer with one output (a row of 1/D) needs none
        d = x.shape[rank - 1]
        return aten.linear.default(x, torch.full((1, d), 1.0 / d, dtype=x.dtype))
    if not _viewable(x.shape):
        return NotImplemented
    if rank == 4 and axes == [2, 3] and keepdim:
        return NotImplemented  # already the form XNNPACK takes
    inner = len(axes)
    if inner not in (1, 2) or axes != list(range(rank - inner, rank)):
        return NotImplemented
    tail = list(x.shape[rank - inner :])
    pooled = aten.mean.dim(x.reshape(-1, 1, *([1] * (2 - inner)), *tail), [2, 3], True)
    out_shape = (
        [s for i, s in enumerate(x.shape) if i not in axes]
        if not keepdim
        else [1 if i in axes else s for i, s in enumerate(x.shape)]
    )
    return pooled.reshape(out_shape)


#: the longest last dim whose ``sum`` is written as a ``linear`` (a longer one is left to the runtime)
SUM_AS_LINEAR_MAX = 64


def _sum(x: torch.Tensor, dims: Sequence[int] | None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """``sum`` over a short static last dim as a fully connected layer with one output (a
    ``[1, K]`` row of ones, as ``_mean``'s row of ``1/D``): XNNPACK has no sum, and WavLM's gated
    relative position bias sums each head's gate in groups of 4 (``.view(.., 2, 4).sum(-1)``)
    in every layer, which split the delegate once per layer (tiny WavLM: 5 subgraphs against
    wav2vec2's 3). The same sum, one product by 1 per term."""
    if dtype is not None or x.dtype != torch.float32 or x.dim() < 2 or not dims:
        return NotImplemented
    rank, k = x.dim(), x.shape[-1]
    if sorted({d % rank for d in dims}) != [rank - 1] or not isinstance(k, int) or k > SUM_AS_LINEAR_MAX:
        return NotImplemented
    if not keepdim and not _viewable(x.shape[:-1]):
        return NotImplemented
    total = aten.linear.default(x, torch.ones((1, k), dtype=x.dtype))
    return total if keepdim else total.reshape(x.shape[:-1])


def _amax(x: torch.Tensor, dim: Sequence[int] = (), keepdim: bool = False) -> Any:
    """``amax`` over one dim of a 4-D float tensor as ``max.dim`` (XNNPACK's max reduction takes
    4-D inputs and the values output only): the row factor of an attention mask."""
    dims = [dim] if isinstance(dim, int) else list(dim)
    if x.dtype != torch.float32 or x.dim() != 4 or len(dims) != 1:
        return NotImplemented
    return aten.max.dim(x, dims[0] % 4, keepdim)[0]


def _adaptive_avg_pool2d(x: torch.Tensor, output_size: Sequence[int]) -> Any:
    """Adaptive average pooling whose windows tile the input exactly: to 1x1 a global average
    (``mean.dim`` over (2, 3), kept), otherwise ``avg_pool2d`` with kernel = stride = in/out.
    Its default decomposition goes through ``as_strided`` on channels-last inputs (ConvNeXt),
    which XNNPACK does not take."""
    if x.dtype != torch.float32 or x.dim() != 4 or not _static(x.shape[1:]):
        return NotImplemented
    oh, ow = (list(output_size) * 2)[:2] if len(output_size) == 1 else list(output_size)
    h, w = x.shape[2], x.shape[3]
    if (oh, ow) == (1, 1):
        return aten.mean.dim(x, [2, 3], True)
    if not oh or not ow or h % oh or w % ow:
        return NotImplemented
    k = [h // oh, w // ow]
    return aten.avg_pool2d.default(x, k, k, [0, 0], False, False)


# ------------------------------------------------------------------------------- attention
def _shared_prefix(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The largest ``j`` with ``b`` equal to ``a[:j]`` followed by ones (``len(a)``: equal; less:
    ``b`` broadcast over ``a``'s last batch dims, multi-query keys and values), else None."""
    for j in range(len(a), -1, -1):
        if _known_equal(a[:j], b[:j]) and all(isinstance(s, int) and s == 1 for s in b[j:]):
            return j
    return None


def _matmul(a: torch.Tensor, b: torch.Tensor) -> Any:
    """Batched matmul as reshape + ``bmm``, with no ``expand`` copy: equal batch dims merged;
    ``b`` broadcast over ``a``'s last batch dims (Falcon's multi-query ``[B, H, L, E] @ [B, 1, E,
    S]``) as those dims folded into ``a``'s rows, ``[B, H * L, E] @ [B, E, S]``, the same row
    products. Decomposed, the broadcast was two ``expand`` copies with a symbolic size, which
    XNNPACK refuses: four per layer outside the delegate (a tiny Falcon decoder, 9 subgraphs)."""
    if a.dim() < 3 or a.dim() != b.dim():
        return NotImplemented
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    j = _shared_prefix(batch_a, batch_b)  # len(batch_a): equal batch dims
    if j is None:
        return NotImplemented
    m, kk, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if j == len(batch_a):
        if a.dim() == 3:
            return aten.bmm.default(a, b)
        out = aten.bmm.default(a.reshape(-1, m, kk), b.reshape(-1, kk, n))
        return out.reshape(*batch_a, m, n)
    folded = m
    for size in batch_a[j:]:
        folded = folded * size
    rows = a.reshape(-1, folded, kk) if j else a.reshape(1, -1, kk)
    out = aten.bmm.default(rows, b.reshape(-1, kk, n))
    return out.reshape(*batch_a, m, n)


# ------------------------------------------------------------------------------ shape ops
def _as_view(op: Callable[..., torch.Tensor]) -> Callable[..., Any]:
    """``squeeze``/``unsqueeze``: a ``view`` to the same (static) shape, which XNNPACK takes."""

    def rewrite(x: torch.Tensor, *args: Any) -> Any:
        if not _viewable(x.shape):
            return NotImplemented
        shape = list(x.shape)
        if op is aten.unsqueeze.default:
            dim = args[0] % (len(shape) + 1)
            shape.insert(dim, 1)
        else:
            dims = args[0] if args else list(range(len(shape)))
            dims = [dims] if isinstance(dims, int) else list(dims)
            dims = {d % max(len(shape), 1) for d in dims}
            if not _static([shape[d] for d in dims if d < len(shape)]):
                return NotImplemented  # whether a dynamic dim is squeezed depends on its size
            shape = [s for i, s in enumerate(shape) if not (i in dims and s == 1)]
        return aten.view.default(x, shape)

    rewrite.__name__ = f"{op.__name__}_as_view"
    return rewrite


def _select(x: torch.Tensor, dim: int, index: int) -> Any:
    """``select`` as a one-wide ``slice`` plus a ``view`` (the selected dim static)."""
    dim = dim % x.dim() if x.dim() else dim
    if not _viewable(x.shape) or not isinstance(index, int) or not isinstance(x.shape[dim], int):
        return NotImplemented
    index = index % x.shape[dim]
    out_shape = [s for i, s in enumerate(x.shape) if i != dim]
    return aten.slice.Tensor(x, dim, index, index + 1).reshape(out_shape)


def _strided_slice(x: torch.Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    """``x[..., a::k]`` (every ``k``-th element along a static dim that ``k`` divides, from ``a``
    below ``k`` to the end) as a view that splits the dim into ``[n / k, k]``, a one-wide slice of
    the new inner dim and a view back: XNNPACK's slice takes stride 1 only (Cohere's
    interleaved rotary embedding reads ``x[..., ::2]`` and ``x[..., 1::2]``)."""
    if not isinstance(step, int) or step <= 1 or not _viewable(x.shape) or x.dim() == 0:
        return NotImplemented
    dim = dim % x.dim()
    n = x.shape[dim]
    start = 0 if start is None else start
    if not isinstance(n, int) or not isinstance(start, int) or n % step:
        return NotImplemented
    start = start + n if start < 0 else start
    if not 0 <= start < step or not (end is None or (isinstance(end, int) and end >= n)):
        return NotImplemented
    shape = list(x.shape)
    split = aten.view.default(x, [*shape[:dim], n // step, step, *shape[dim + 1 :]])
    picked = aten.slice.Tensor(split, dim + 1, start, start + 1)
    return aten.view.default(picked, [*shape[:dim], n // step, *shape[dim + 1 :]])


def _expand(x: torch.Tensor, size: Sequence[Any], *, implicit: bool = False) -> Any:
    """An ``expand`` to the tensor's own shape is the identity: a ``view``, not a copy. One that
    broadcasts a single size-1 dim ``n`` times (grouped-query attention repeating its key/value
    heads) is a ``cat`` of ``n`` copies (XNNPACK has no broadcast copy; it concatenates)."""
    if not _viewable(x.shape) or len(size) != x.dim():
        return NotImplemented
    target = [x.shape[i] if isinstance(s, int) and s == -1 else s for i, s in enumerate(size)]
    if _known_equal(target, list(x.shape)):
        return aten.view.default(x, list(x.shape))
    grown = [i for i, (s, t) in enumerate(zip(x.shape, target, strict=True)) if not _known_equal([s], [t])]
    if (
        len(grown) == 1
        and _static([x.shape[grown[0]], target[grown[0]]])
        and x.shape[grown[0]] == 1
        and 2 <= target[grown[0]] <= _MAX_CAT
    ):
        # distinct views: XNNPACK counts a concatenation's distinct inputs
        return aten.cat.default(
            [aten.view.default(x, list(x.shape)) for _ in range(target[grown[0]])], grown[0]
        )
    return NotImplemented


#: XNNPACK concatenates 2 to 5 tensors in one node.
_MAX_CAT = 5


def _split_with_sizes(x: torch.Tensor, sizes: Sequence[int], dim: int = 0) -> Any:
    """``split`` as ``slice`` ops (the split dim static): XNNPACK has no split, and takes slices."""
    dim = dim % x.dim()
    if not isinstance(x.shape[dim], int) or not all(isinstance(s, int) for s in sizes):
        return NotImplemented
    out, start = [], 0
    for n in sizes:
        out.append(aten.slice.Tensor(x, dim, start, start + n))
        start += n
    return out


def _split(x: torch.Tensor, split_size: int, dim: int = 0) -> Any:
    total = x.shape[dim % x.dim()]
    if not isinstance(total, int) or not isinstance(split_size, int) or split_size <= 0:
        return NotImplemented
    sizes = [min(split_size, total - i) for i in range(0, total, split_size)]
    return _split_with_sizes(x, sizes, dim)


def _cat(tensors: Sequence[torch.Tensor], dim: int = 0) -> Any:
    """A ``cat`` that repeats an input (rotary embeddings' ``cat((freqs, freqs))``) with distinct
    views of it: XNNPACK counts a concatenation's distinct inputs and refuses one. Inputs empty
    along ``dim`` are dropped, and a ``cat`` of one input is that input (Phi-3's partial rotary
    concatenates an empty pass-through part)."""
    if not tensors or not all(_viewable(t.shape) for t in tensors):
        return NotImplemented
    d = dim % tensors[0].dim() if tensors[0].dim() else 0
    kept = [t for t in tensors if not (t.dim() > d and isinstance(t.shape[d], int) and t.shape[d] == 0)]
    if len(kept) != len(tensors) and kept:
        if len(kept) == 1:
            return aten.view.default(kept[0], list(kept[0].shape))
        tensors = kept
        if len({id(t) for t in tensors}) == len(tensors):
            return aten.cat.default(list(tensors), dim)
    if len({id(t) for t in tensors}) == len(tensors):
        return NotImplemented
    seen: set[int] = set()
    parts = []
    for t in tensors:
        parts.append(aten.view.default(t, list(t.shape)) if id(t) in seen else t)
        seen.add(id(t))
    return aten.cat.default(parts, dim)


def _roll(x: torch.Tensor, shifts: Sequence[int], dims: Sequence[int] = ()) -> Any:
    """``roll`` as slices and a ``cat`` per rolled dim (static shapes): its default
    decomposition gathers with computed indices (``index_select``), which XNNPACK does not take
    (Swin Transformer's shifted windows)."""
    shifts, dims = list(shifts), list(dims)
    if not dims or len(shifts) != len(dims) or not _static([x.shape[d % x.dim()] for d in dims]):
        return NotImplemented
    for shift, dim in zip(shifts, dims, strict=True):
        dim = dim % x.dim()
        n = x.shape[dim]
        k = shift % n
        if k:
            x = aten.cat.default(
                [aten.slice.Tensor(x, dim, n - k, n), aten.slice.Tensor(x, dim, 0, n - k)], dim
            )
    return x


def _alias(x: torch.Tensor) -> Any:
    """``alias`` (an identity view) as a same-shape ``view``."""
    if not _viewable(x.shape):
        return NotImplemented
    return aten.view.default(x, list(x.shape))


# ----------------------------------------------------------------------------- elementwise
def _pow(x: torch.Tensor, exponent: Any) -> Any:
    """``x ** n`` for small integral ``n`` as multiplications, ``x ** 0.5`` as ``sqrt`` and
    ``x ** -0.5`` as ``rsqrt`` (XNNPACK takes ``pow`` only with the integer exponent 2)."""
    if x.dtype != torch.float32 or isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        return NotImplemented
    if exponent == 0.5:
        return aten.sqrt.default(x)
    if exponent == -0.5:
        return aten.rsqrt.default(x)
    if float(exponent) not in (2.0, 3.0, 4.0) or (isinstance(exponent, int) and exponent == 2):
        return NotImplemented  # 2 (an int) is XNNPACK's own
    y = x * x
    if exponent == 3.0:
        y = y * x
    elif exponent == 4.0:
        y = y * y
    return y


def _tanh_gelu(x: torch.Tensor, approximate: str = "none") -> Any:
    """``gelu(x, approximate="tanh")`` as its definition, ``0.5 x (1 + tanh(sqrt(2/pi) (x +
    0.044715 x^3)))``: XNNPACK's GELU is the exact one and ExecuTorch's visitor drops
    ``approximate`` (``xnnpack_fixes.partitioner_configs``); these ops stay in the delegate."""
    if approximate != "tanh" or x.dtype != torch.float32:
        return NotImplemented
    cube = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Tensor(x, x), x), 0.044715)
    inner = aten.mul.Tensor(aten.add.Tensor(x, cube), 0.7978845608028654)
    return aten.mul.Tensor(aten.mul.Tensor(x, 0.5), aten.add.Tensor(aten.tanh.default(inner), 1.0))


def _scalar_as_tensor_op(op: Any) -> Callable[..., Any]:
    """``add``/``sub``/``mul``/``div`` with a Python scalar (``.Scalar`` overloads: torch's own
    ``nn.RMSNorm`` adds its eps so) as the ``.Tensor`` overload, the one XNNPACK's configs name."""

    def rewrite(x: torch.Tensor, other: Any, alpha: Any = 1) -> Any:
        if x.dtype != torch.float32 or isinstance(other, bool) or not isinstance(other, (int, float)):
            return NotImplemented
        if alpha != 1:
            other = other * alpha
        return op(x, other)

    rewrite.__name__ = f"{op.__name__}_with_scalar"
    return rewrite


#: op -> rewrite; grouped so a user can pick a subset.
decompose_layer_norm: dict[Any, Callable[..., Any]] = {
    aten.layer_norm.default: _layer_norm,
    aten.group_norm.default: _group_norm,
}
#: SDPA itself is rewritten by ``XnnpackHeadAttention`` (``xnnpack_heads.py``: batch and sequence
#: dynamic) or ``XnnpackAttention`` (``xnnpack_attention.py``) into private ops, which these
#: entries expand; batched ``matmul`` (eager attention) becomes ``bmm``.
attention_as_bmm: dict[Any, Callable[..., Any]] = {
    **ATTENTION_TABLE,
    **HEADS_TABLE,
    aten.matmul.default: _matmul,
}
views_for_shape_ops: dict[Any, Callable[..., Any]] = {
    aten.squeeze.dim: _as_view(aten.squeeze.dim),
    aten.squeeze.dims: _as_view(aten.squeeze.dims),
    aten.squeeze.default: _as_view(aten.squeeze.default),
    aten.unsqueeze.default: _as_view(aten.unsqueeze.default),
    aten.select.int: _select,
    aten.slice.Tensor: _strided_slice,
    aten.expand.default: _expand,
    aten.split_with_sizes.default: _split_with_sizes,
    aten.split.Tensor: _split,
    aten.alias.default: _alias,
    aten.roll.default: _roll,
    aten.cat.default: _cat,
}
elementwise: dict[Any, Callable[..., Any]] = {
    aten.pow.Tensor_Scalar: _pow,
    aten.hardsigmoid.default: _hardsigmoid,
    aten.gelu.default: _tanh_gelu,
    aten.add.Scalar: _scalar_as_tensor_op(aten.add.Tensor),
    aten.sub.Scalar: _scalar_as_tensor_op(aten.sub.Tensor),
    aten.mul.Scalar: _scalar_as_tensor_op(aten.mul.Tensor),
    aten.div.Scalar: _scalar_as_tensor_op(aten.div.Tensor),
}
mean_as_global_pool: dict[Any, Callable[..., Any]] = {
    aten.mean.dim: _mean,
    aten.sum.dim_IntList: _sum,
    aten.amax.default: _amax,
    aten.adaptive_avg_pool2d.default: _adaptive_avg_pool2d,
    aten._adaptive_avg_pool2d.default: _adaptive_avg_pool2d,
}
REWRITES: dict[str, dict[Any, Callable[..., Any]]] = {
    "layer_norm": decompose_layer_norm,
    "mean": mean_as_global_pool,
    "elementwise": elementwise,
    "attention": attention_as_bmm,
    "shape_ops": views_for_shape_ops,
}


def rewrite_table(groups: Sequence[str] = tuple(REWRITES)) -> dict[Any, Callable[..., Any]]:
    """The decomposition-table entries of the chosen rewrite groups."""
    table: dict[Any, Callable[..., Any]] = {}
    for group in groups:
        table.update(REWRITES[group])
    return table


class FoldDecomposed(ProgramPass):
    """Constant folding again on the XNNPACK program, once decomposed: input-independent chains
    that the shared program's folding could not reach (inside a higher-order op such as
    transformers' rotary ``wrap_with_set_grad_enabled``, or made by a decomposition) become
    constants of this program only. Parameters are never folded (see ``fold_constants``)."""

    serves = "xnnpack"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        return fold_constants(program, drop_unused=False)


BEFORE_DECOMPOSITION: tuple[ProgramPass, ...] = (
    BmmAttentionAsSdpa(),
    XnnpackHeadAttention(),
    XnnpackAttention(),
)
AFTER_DECOMPOSITION: tuple[ProgramPass, ...] = (
    FoldDecomposed(),
    ErfGelu(),
    MaskedScoresAsSum(),
    ShiftedSoftmax(),
    MaxDimFromFront(),
    MaskedRowsAsMax(),
    SliceOfConcat(),
    UnitDimViews(),
    UntieEmbeddings(),
    LinearForTransposedWeight(),
    *DYNAMIC_PASSES,
)


class XnnpackRewrites(ProgramPass):
    """``XnnpackAttention`` then every rewrite in :data:`REWRITES` (one ``run_decompositions``
    call): what ``XnnpackExporter.decompose`` adds to its own table, usable on any program to
    inspect it."""

    serves = "xnnpack"
    in_place = False

    def call(self, program: ExportedProgram) -> ExportedProgram:
        return run_pipeline(program, rewrite_table())


def run_pipeline(program: ExportedProgram, table: dict[Any, Callable[..., Any]]) -> ExportedProgram:
    """XNNPACK's pipeline: the passes before decomposition (on a copy of the graph), one
    ``run_decompositions`` with ``table`` (the rewrites included), the passes after it (on the
    new program). The shared program is never edited."""
    for before in BEFORE_DECOMPOSITION:
        program = before(program).program
    decomposed = program.run_decompositions(table)
    if decomposed.constants is program.constants:  # the passes below add constants of their own
        set_weight_dicts(decomposed, constants=dict(program.constants))
    for after in AFTER_DECOMPOSITION:
        decomposed = after(decomposed).program
    return decomposed


def pipeline_names() -> tuple[str, ...]:
    """The pipeline's pass names, in order (the cache key, the manifest, ``-v``)."""
    return (
        *(p.name for p in BEFORE_DECOMPOSITION),
        *(f"xnnpack_rewrites:{group}" for group in REWRITES),
        *(p.name for p in AFTER_DECOMPOSITION),
    )


def xnnpack_friendly(program: ExportedProgram) -> ExportedProgram:
    """:class:`XnnpackRewrites` as a plain ExportedProgram -> ExportedProgram function."""
    return XnnpackRewrites()(program).program
