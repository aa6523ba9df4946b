"""A transformers ``Cache`` over explicit tensors: the decoder's own forward fills it, out of place.

Why a Cache and not a rewrite of attention: every transformers decoder already asks its cache for
what it needs (``update`` per layer, ``get_mask_sizes`` and ``get_query_offset`` for the mask,
``is_sliding`` for which mask a layer gets). Answering those questions from ``past_k``/``past_v``
and ``cache_position`` serves Llama, Qwen, Mistral, Gemma's sliding layers, Phi3's fused qkv and
GPT-2's learned positions with no case per model: each model keeps its own rotary, GQA, scaling,
soft-capping and mask functions. transformers is imported only here (``dualexport.llm`` imports
this module when a wrapper is built).

The layout is absolute: slot ``p`` of every layer holds position ``p`` (a sliding layer keeps all
``T`` slots and its window is the mask's job). Two ways to hand the update back (``mode``):

* ``"dense"`` / ``"index_copy"``: each layer writes its new states at ``cache_position`` into a
  new ``[1, Hkv, T, D]`` tensor (out of place), which is the layer's present; the program returns
  the whole cache, and ``get_mask_sizes`` is ``(T, 0)``.
* ``"rows"``: each layer attends over ``cat(past, new)`` (``T + S`` keys) and the program returns
  only the new rows ``[L, 1, Hkv, S, D]``, which the caller writes at ``cache_position``. Why: a
  decode step then reads the cache once and writes ``S`` rows, where the dense update reads and
  writes all ``T`` slots of every layer twice more (the measured gap to a runtime-owned cache).
  The past slots from the first position written now on are masked (their key position is
  :data:`STALE`, :meth:`ExplicitCache.rows_mask_terms`), so stale contents of those slots never
  count; ``get_mask_sizes`` is ``(P + S, 0)``, ``P`` the slots passed.
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

__all__ = [
    "ExplicitCache",
    "RecordingCache",
    "RowsUnsupported",
    "SUPPORTED_LAYER_TYPES",
    "CACHE_MODES",
    "active_cache",
]

#: How a layer's update is handed back (see the module docstring).
CACHE_MODES = ("dense", "index_copy", "rows")
#: ``"rows"``: the key position of a past slot a call must not read, after every query position
#: (a causal mask function holds it out).
STALE = 1 << 30


class RowsUnsupported(RuntimeError):
    """A decoder asked the ``"rows"`` cache for something only a whole-cache update serves (a
    padding mask, a vmap mask, a batch): the export falls back to ``"dense"``."""


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
        self.new: tuple[torch.Tensor, torch.Tensor] | None = None  # "rows": the states written now
        self.is_sliding = sliding
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.keys is not None and self.values is not None
        if self.cache.mode == "rows":
            if self.new is not None:
                raise RowsUnsupported("a layer updated its cache twice in one forward")
            self.new = (key_states.to(self.keys.dtype), value_states.to(self.values.dtype))
            return torch.cat([self.keys, self.new[0]], 2), torch.cat([self.values, self.new[1]], 2)
        if self.cache.mode == "index_copy":
            position = self.cache.cache_position
            self.keys = self.keys.index_copy(2, position, key_states.to(self.keys.dtype))
            self.values = self.values.index_copy(2, position, value_states.to(self.values.dtype))
        else:
            scatter = self.cache.dense_scatter(self.keys)
            self.keys, self.values = scatter(self.keys, key_states), scatter(self.values, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        assert self.keys is not None
        if self.cache.mode == "rows":
            return self.keys.shape[2] + query_length, 0
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
    """The cache a wrapper hands the model: layer ``l`` starts from ``past_k[l]``/``past_v[l]``
    (``[1, Hkv, P, D]`` each: the program's per-layer inputs);
    after the forward, ``present()`` stacks what the layers hold.

    The query offset is ``cache_position[0]`` (a tensor, as transformers' StaticLayer does): with
    transformers' own mask functions the query positions are ``cache_position[0] + arange(S)``,
    i.e. taken as contiguous, which is how prefill and decode feed them; the exported attention's
    mask (``attention.additive_mask``) reads the positions themselves, as rotary and learned
    positions do (``position_ids``: ``cache_position`` as ``[1, S]``, passed when the caller made
    that view already). ``mode``: how a layer hands back its new states, one of
    :data:`CACHE_MODES` (see the module docstring and :class:`_Scatter`).
    """

    def __init__(
        self,
        past_k: Sequence[torch.Tensor],
        past_v: Sequence[torch.Tensor],
        cache_position: torch.Tensor,
        sliding: Sequence[bool],
        mode: str = "dense",
        position_ids: torch.Tensor | None = None,
    ) -> None:
        if mode not in CACHE_MODES:
            raise ValueError(f"cache mode {mode!r} is not one of {CACHE_MODES}")
        self.cache_position = cache_position
        self.position_ids = cache_position.view(1, -1) if position_ids is None else position_ids
        self.query_offset = cache_position[0]
        self.mode = mode
        self._dense: _Scatter | None = None
        self._rows_terms: torch.Tensor | None = None
        # "rows": each 4-D mask handed to the model, by its id (kept, so its id stays its own),
        # with its 2-D form and the 0/1 matrix it came from; and their repeats per head group
        self._masks: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._repeated: dict[tuple[int, int], torch.Tensor] = {}
        layers = [_ExplicitLayer(past_k[i], past_v[i], self, bool(s)) for i, s in enumerate(sliding)]
        super().__init__(layers=list[Any](layers))
        self.explicit = layers

    def dense_scatter(self, like: torch.Tensor) -> _Scatter:
        if self._dense is None:
            self._dense = _Scatter(self.position_ids, like.shape[2], like.dtype)
        return self._dense

    def rows_mask_terms(self) -> torch.Tensor:
        """``"rows"``: the key positions ``[1, P + S]``, the past slots' then the new tokens'.
        A past slot at or after the first position written now holds nothing the call may read
        (stale: the new rows are the keys at those positions; or not written yet), so its key
        position is :data:`STALE`, after every query: the model's own mask function, which
        holds keys to ``kv_idx <= q_idx``, masks it. This takes positions contiguous from
        ``cache_position[0]``, as transformers' mask functions and prefill and decode do. Why
        not a 0/1 ``keep`` row multiplied in: its one-hot over ``[P, S]`` was six ops outside
        the delegate, once per call, which on a 2-layer model was 1 point of delegated share.
        Built once per forward."""
        if self._rows_terms is None:
            row = self.position_ids  # the [1, S] form the caller made already
            slots = self.explicit[0].keys.shape[2]  # type: ignore[union-attr]
            arange = torch.arange(slots, dtype=row.dtype).view(1, -1)
            past = arange.masked_fill(arange >= self.query_offset, STALE)
            self._rows_terms = torch.cat([past, row], 1)
        return self._rows_terms

    def remember_mask(self, mask: torch.Tensor, additive: torch.Tensor, allowed: torch.Tensor) -> None:
        """Keep the 2-D forms of a 4-D mask this forward's mask function returned: ``additive``
        ``[S, T + S]`` (0 or the dtype's minimum) and the ``allowed`` 0/1 matrix it came from."""
        self._masks[id(mask)] = (mask, additive, allowed)

    def repeated_mask(self, mask: torch.Tensor, repeats: int) -> torch.Tensor | None:
        """``mask`` in 2-D with its rows stacked ``repeats`` times (``[repeats * S, T + S]``, the
        rows of a query-head group's scores), built once per forward; None for a mask this cache
        did not build. Why not a view of the 4-D mask: ``[1, 1, S, T + S]`` has two dynamic sizes,
        a reshape XNNPACK does not take. Why each copy computed again from ``allowed``: XNNPACK
        refuses a concatenation that names one input twice (and the view that would tell them
        apart has the same two dynamic sizes); these few float ops stay inside the delegate."""
        entry = self._masks.get(id(mask))
        if entry is None or entry[0] is not mask:
            return None
        key = (id(mask), repeats)
        if key not in self._repeated:
            _, additive, allowed = entry
            low = torch.finfo(additive.dtype).max
            copies = [additive] + [(allowed - 1.0) * low for _ in range(repeats - 1)]
            self._repeated[key] = torch.cat(copies) if repeats > 1 else additive
        return self._repeated[key]

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
        """What the program returns: the whole updated cache, or in ``"rows"`` mode the new rows
        ``[L, 1, Hkv, S, D]``."""
        if self.mode == "rows":
            if any(layer.new is None for layer in self.explicit):
                raise RowsUnsupported("a layer did not update its cache")
            return (
                torch.stack([layer.new[0] for layer in self.explicit]),  # type: ignore[index]
                torch.stack([layer.new[1] for layer in self.explicit]),  # type: ignore[index]
            )
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
