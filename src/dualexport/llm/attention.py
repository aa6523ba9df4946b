"""Attention for the exported decoder, registered in transformers' ``AttentionInterface``: the same
computation as transformers' eager attention, written in ops both targets take whole.

Why its own implementation: ``scaled_dot_product_attention`` decomposes (with a mask) into a
"safe" softmax whose guard ops XNNPACK refuses, and transformers' eager attention repeats the
key/value heads with ``expand`` and reshapes with the symbolic sequence length; each refused op
splits the XNNPACK delegate, once per layer. Here grouped-query attention folds the query heads of
a key/value head into the rows of one ``bmm`` (no copy of the keys), every reshape names at most one
dynamic size (as ``-1``, which XNNPACK's reshape takes), and the mask is additive (0 or the dtype's
minimum, transformers' eager mask). Every model keeps its own projections, rotary embedding,
scaling and soft-capping; calls this cannot serve exactly (attention sinks, no mask, other
layouts) go to transformers' SDPA attention.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ..compat.transformers import attn_implementation, has_attn_implementation, set_attn_implementation

__all__ = ["ATTENTION", "dualexport_attention", "additive_mask", "exported_attention"]

#: The name the implementation is registered under in transformers.
ATTENTION = "dualexport"

#: keyword arguments transformers passes that this implementation honours or that do not change
#: the result (the window is in the mask; dropout is off in eval)
_KNOWN = {
    "scaling",
    "dropout",
    "softcap",
    "sliding_window",
    "position_ids",
    "cache_position",
    "is_causal",
    "use_cache",
    "output_attentions",
    "past_key_values",
    "layer_idx",
}


def _fallback(module: nn.Module, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, *args, **kwargs)


def dualexport_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``query [1, H, S, D]``, ``key``/``value [1, Hkv, T, D]`` -> ``[1, S, H, Dv]`` (the layout
    transformers' attention functions return)."""
    unknown = {k for k, v in kwargs.items() if v is not None and k not in _KNOWN}
    heads, kv_heads = query.shape[1], key.shape[1]
    fallback = bool(
        unknown
        or attention_mask is None
        or attention_mask.dtype == torch.bool
        or query.dim() != 4
        or query.shape[0] != 1
        or heads % kv_heads
        or (dropout and module.training)
    )
    from .cache import active_cache

    cache = active_cache()
    rows_mask = None
    if not fallback and cache is not None and cache.mode == "rows":  # T + S keys
        assert attention_mask is not None
        rows_mask = cache.repeated_mask(attention_mask, heads // kv_heads)
        fallback = rows_mask is None  # a mask the cache did not build
    if fallback:
        return _fallback(
            module,
            query,
            key,
            value,
            attention_mask,
            scaling=scaling,
            dropout=dropout,
            softcap=softcap,
            **kwargs,
        )
    assert attention_mask is not None
    d, t, dv = query.shape[3], key.shape[2], value.shape[3]
    rep = heads // kv_heads
    scale = d**-0.5 if scaling is None else scaling
    # [1, H, S, D] -> [Hkv, rep * S, D]: the query heads that share a key/value head are rows of one
    # matrix (heads h = g * rep + r use key/value head g, transformers' repeat_kv order). Reshapes
    # only split or merge next to the dynamic S (merging heads across it makes torch.export guard
    # on strides and refuse S = 1); the keys' length is -1 (T + S is dynamic with the rows cache).
    q = query.contiguous().view(kv_heads, -1, d)
    k = key.contiguous().view(kv_heads, -1, d)
    v = value.contiguous().view(kv_heads, -1, dv)
    scores = torch.bmm(q, k.transpose(1, 2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if rows_mask is not None:
        # [rep * S, T + S], stacked per query head of a group, broadcasts over Hkv: the 4-D mask
        # would need a reshape naming two dynamic sizes, which XNNPACK does not take
        scores = scores + rows_mask
    else:
        # the mask [1, 1, S, T] broadcasts over [Hkv, rep, S, T]
        scores = (scores.view(kv_heads, rep, -1, t) + attention_mask).view(kv_heads, -1, t)
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    out = torch.bmm(weights, v).view(kv_heads, rep, -1, dv)
    return out.permute(2, 0, 1, 3).contiguous().view(1, -1, heads, dv), None


def additive_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    use_vmap: bool = False,
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' eager mask (0 where the model's mask function allows a key, the dtype's
    minimum elsewhere), ``[1, 1, S, T]``, in fewer ops: the index-based mask function evaluated on
    ``[S, 1]`` query and ``[1, T]`` key positions, then ``(allowed - 1) * max``, which XNNPACK
    takes (``where``/``expand`` it does not). The query positions are the exported program's
    ``cache_position`` when its cache asks (exact for any positions, and no ``arange``). Padding
    masks and vmap-only mask functions go to transformers' own. With a ``"rows"`` cache the keys
    are the ``T`` slots then the ``S`` new tokens (``ExplicitCache.rows_mask_terms``), and the
    2-D mask is remembered for :func:`dualexport_attention`."""
    from transformers.masking_utils import causal_mask_function, eager_mask

    from .cache import RowsUnsupported, active_cache

    mask_function = mask_function or causal_mask_function
    cache = active_cache()
    rows = cache is not None and cache.mode == "rows"
    if attention_mask is not None or use_vmap or batch_size != 1:
        if rows:
            raise RowsUnsupported("a padding mask, a vmap mask function or a batch")
        return eager_mask(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=mask_function,
            attention_mask=attention_mask,
            dtype=dtype,
            use_vmap=use_vmap,
            **kwargs,
        )
    zero = torch.zeros(1, 1, dtype=torch.long)
    if cache is not None and q_offset is cache.query_offset:  # the positions themselves
        q_idx = cache.position_ids.view(-1, 1)
    elif rows:
        raise RowsUnsupported("a mask over other query positions than the cache's")
    else:
        q_idx = (torch.arange(q_length) + q_offset).view(-1, 1)
    if rows:
        assert cache is not None
        kv_idx = cache.rows_mask_terms()
        allowed = mask_function(zero, zero, q_idx, kv_idx).to(dtype)
        mask2d = (allowed - 1.0) * torch.finfo(dtype).max
        mask = mask2d.unsqueeze(0).unsqueeze(0)
        cache.remember_mask(mask, mask2d, allowed)
        return mask
    kv_idx = (torch.arange(kv_length) + kv_offset).view(1, -1)
    allowed = mask_function(zero, zero, q_idx, kv_idx)
    return ((allowed.to(dtype) - 1.0) * torch.finfo(dtype).max).view(1, 1, q_length, kv_length)


def _register() -> None:
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTENTION, dualexport_attention)
    AttentionMaskInterface.register(ATTENTION, additive_mask)


def _configs(model: nn.Module) -> list[Any]:
    """Every transformers config the model's modules read (the model's and its sub-configs)."""
    seen: dict[int, Any] = {}
    for m in model.modules():
        config = getattr(m, "config", None)
        if config is not None and has_attn_implementation(config):
            seen.setdefault(id(config), config)
    return list(seen.values())


@contextlib.contextmanager
def exported_attention(model: nn.Module) -> Iterator[bool]:
    """Trace ``model`` with :func:`dualexport_attention` (yields whether it applies: a module
    without a transformers config keeps its own attention); its own setting is restored after."""
    configs = _configs(model)
    if not configs:
        yield False
        return
    _register()
    saved = [attn_implementation(c) for c in configs]
    try:
        for c in configs:
            set_attn_implementation(c, ATTENTION)
        yield True
    finally:
        for c, s in zip(configs, saved, strict=True):
            set_attn_implementation(c, s)
