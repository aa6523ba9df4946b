"""A transformers ``Cache`` over explicit tensors: the decoder's own forward fills it, out of place.

Why a Cache and not a rewrite of attention: every transformers decoder already asks its cache for
what it needs (``update`` per layer, ``get_mask_sizes`` and ``get_query_offset`` for the mask,
``is_sliding`` for which mask a layer gets). Answering those questions from ``past_k``/``past_v``
and ``cache_position`` serves Llama, Qwen, Mistral, Gemma's sliding layers, Phi3's fused qkv and
GPT-2's learned positions with no case per model: each model keeps its own rotary, GQA, scaling,
soft-capping and mask functions. transformers is imported only here (``dualexport.llm`` imports
this module when a wrapper is built).

The layout is absolute: slot ``p`` of every layer holds position ``p`` (a sliding layer keeps all
``T`` slots and its window is the mask's job), so ``get_mask_sizes`` is ``(T, 0)`` for every layer
and the update is ``index_copy`` at ``cache_position``, out of place (the new tensor is the
layer's ``present``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..loading import allow_torchvision

allow_torchvision()

from transformers.cache_utils import Cache, CacheLayerMixin  # noqa: E402

__all__ = ["ExplicitCache", "RecordingCache", "SUPPORTED_LAYER_TYPES", "active_cache"]

#: transformers layer types this cache serves: full attention, and windowed attention whose
#: window (sliding or chunked) the model's own mask function applies over absolute positions.
SUPPORTED_LAYER_TYPES = {"full_attention": False, "sliding_attention": True, "chunked_attention": True}


class _Scatter:
    """Writes ``S`` new rows into ``T`` slots as dense ops, shared by every layer of one call:
    ``present = past * keep + onehot @ new``, where ``onehot[t, s] = (cache_position[s] == t)``
    and ``keep[t] = 1 - sum_s onehot[t, s]``.

    Why not ``index_copy``: it decomposes to ``index_put``, which XNNPACK does not take, so every
    layer's update split the delegate (twice). Here the update is a ``bmm``, a ``mul`` and an
    ``add``; it is exact for finite values (each slot sums one product with 1 and zeros) and
    assumes distinct positions, as prefill and decode feed them. ``onehot`` and ``keep`` depend
    on ``cache_position`` only: they are computed once, before the first layer.
    """

    def __init__(self, position_ids: torch.Tensor, slots: int, dtype: torch.dtype) -> None:
        hit = (torch.arange(slots, dtype=position_ids.dtype).view(-1, 1) == position_ids).to(dtype)
        self.onehot = hit.unsqueeze(0)  # [1, T, S]
        self.keep = (1.0 - hit.sum(-1)).view(1, 1, slots, 1)  # [1, 1, T, 1]

    def __call__(self, past: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        _, heads, slots, dim = past.shape
        rows = new.to(past.dtype).transpose(1, 2).contiguous().view(1, -1, heads * dim)  # [1, S, Hkv*D]
        placed = torch.bmm(self.onehot, rows).view(1, slots, heads, dim).transpose(1, 2)
        return past * self.keep + placed


class _ExplicitLayer(CacheLayerMixin):
    """One layer's keys and values ``[1, Hkv, T, D]``; ``update`` writes the new states at
    ``cache_position`` into new tensors (out of place: the results are the layer's present)."""

    is_compileable = True  # the mask is always materialized (no ``is_causal`` shortcut in decode)
    supports_early_init = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, cache: ExplicitCache, sliding: bool):
        super().__init__()
        self.keys, self.values, self.cache = keys, values, cache
        self.is_sliding = sliding
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.keys is not None and self.values is not None
        if self.cache.scatter == "index_copy":
            position = self.cache.cache_position
            self.keys = self.keys.index_copy(2, position, key_states.to(self.keys.dtype))
            self.values = self.values.index_copy(2, position, value_states.to(self.values.dtype))
        else:
            scatter = self.cache.dense_scatter(self.keys)
            self.keys, self.values = scatter(self.keys, key_states), scatter(self.values, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        assert self.keys is not None
        return self.keys.shape[2], 0

    def get_seq_length(self) -> Any:
        return self.cache.query_offset

    def get_max_length(self) -> int:
        assert self.keys is not None
        return self.keys.shape[2]


_ACTIVE: contextvars.ContextVar[ExplicitCache | None] = contextvars.ContextVar(
    "dualexport_cache", default=None
)


def active_cache() -> ExplicitCache | None:
    """The cache of the forward running now (the mask function reads its positions)."""
    return _ACTIVE.get()


class ExplicitCache(Cache):
    """The cache a wrapper hands the model: layer ``l`` starts from ``past_k[l]``/``past_v[l]``;
    after the forward, ``present()`` stacks what the layers hold.

    The query offset is ``cache_position[0]`` (a tensor, as transformers' StaticLayer does): with
    transformers' own mask functions the query positions are ``cache_position[0] + arange(S)``,
    i.e. taken as contiguous, which is how prefill and decode feed them; the exported attention's
    mask (``attention.additive_mask``) reads the positions themselves, as rotary and learned
    positions do (``position_ids``: ``cache_position`` as ``[1, S]``, passed when the caller made
    that view already). ``scatter``: how a layer writes its new states, ``"dense"`` (see
    :class:`_Scatter`) or ``"index_copy"``.
    """

    def __init__(
        self,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        cache_position: torch.Tensor,
        sliding: Sequence[bool],
        scatter: str = "dense",
        position_ids: torch.Tensor | None = None,
    ) -> None:
        self.cache_position = cache_position
        self.position_ids = cache_position.view(1, -1) if position_ids is None else position_ids
        self.query_offset = cache_position[0]
        self.scatter = scatter
        self._dense: _Scatter | None = None
        layers = [_ExplicitLayer(past_k[i], past_v[i], self, bool(s)) for i, s in enumerate(sliding)]
        super().__init__(layers=list[Any](layers))
        self.explicit = layers

    def dense_scatter(self, like: torch.Tensor) -> _Scatter:
        if self._dense is None:
            self._dense = _Scatter(self.position_ids, like.shape[2], like.dtype)
        return self._dense

    def get_query_offset(self, layer_idx: int = 0) -> Any:
        return self.query_offset

    def get_seq_length(self, layer_idx: int = 0) -> Any:
        return self.query_offset

    @contextlib.contextmanager
    def active(self) -> Iterator[ExplicitCache]:
        """This cache as :func:`active_cache` for the duration of a forward."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def present(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys = [layer.keys for layer in self.explicit]
        values = [layer.values for layer in self.explicit]
        assert all(k is not None for k in keys) and all(v is not None for v in values)
        return torch.stack(keys), torch.stack(values)  # type: ignore[arg-type]


class _RecordingLayer(CacheLayerMixin):
    """Remembers the shape and dtype of the states a layer writes (the probe that finds the cache
    layout of any decoder, a user's module included)."""

    supports_early_init = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys, self.values, self.is_initialized = key_states, value_states, True
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0

    def get_seq_length(self) -> int:
        return 0

    def get_max_length(self) -> int:
        return -1


class RecordingCache(Cache):
    """An empty cache that grows a recording layer per ``layer_idx`` the model updates."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=_RecordingLayer)

    def shapes(self) -> list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype] | None]:
        layers: list[Any] = list(self.layers)
        return [
            (tuple(layer.keys.shape), tuple(layer.values.shape), layer.keys.dtype)
            if getattr(layer, "is_initialized", False)
            else None
            for layer in layers
        ]
