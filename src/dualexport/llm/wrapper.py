"""The cache-aware program of a decoder: ``forward(input_ids[1,S], cache_position[S], *past)
-> (logits[1,S,V], new_k, new_v)``, one trace for prefill (S > 1) and decode (S = 1); ``past`` is
each layer's keys ``[1, Hkv, P, D]`` then each layer's values; ``new_k`` is the new rows
``[L, 1, Hkv, S, D]`` (the ``"rows"`` cache, which the caller writes at ``cache_position``) or the
whole updated cache (``"dense"``, ``"index_copy"``).

Why one input per layer: a stacked ``[L, ...]`` cache is read through a select per layer, which
XNNPACK takes only with static sizes (so the cache could not be passed by prefix) and which the
ExecuTorch runner copies whole every step.

Why explicit cache tensors (design (a) of issue 19): both targets then compute the same pure
function. A cache kept in mutable buffers is updated in place by ExecuTorch but silently dropped
by torch.onnx 2.13 (measured for issue 19: the ONNX model has no state outputs), so the two
files would carry two different programs.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..errors import DualExportError, InputError
from .layout import LlmLayout, input_names

__all__ = [
    "DecoderWithCache",
    "probe_layout",
    "example_inputs",
    "dynamic_shapes",
    "sliding_layers",
    "past_step",
]


def takes_attention_mask(model: nn.Module) -> bool:
    """Whether ``model.forward`` takes an ``attention_mask`` (by name or through ``**kwargs``)."""
    return "attention_mask" in _accepted_kwargs(model, {"attention_mask": None})


def _accepted_kwargs(model: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``model.forward`` takes (all of them when it takes ``**kwargs``):
    a user's module need not declare ``use_cache``. The cache goes by the name the forward
    declares: ``past_key_values``, or ``cache`` (transformers 5.24 renames it)."""
    params = inspect.signature(model.forward).parameters
    if "past_key_values" in kwargs and "past_key_values" not in params and "cache" in params:
        kwargs = {("cache" if k == "past_key_values" else k): v for k, v in kwargs.items()}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def _logits(out: Any) -> torch.Tensor:
    """The logits of a forward's result: a tensor, ``.logits``, or the first of a tuple."""
    logits = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
    if logits is None and isinstance(out, (tuple, list)) and out:
        logits = out[0]
    if not isinstance(logits, torch.Tensor):
        raise InputError(
            f"the model returned {type(out).__name__}, with no logits",
            hint="export a causal LM (…ForCausalLM), or a module returning logits (alone, first or as .logits)",
        )
    return logits


def sliding_layers(model: nn.Module, layers: int) -> tuple[bool, ...]:
    """Which layers attend through a window (from the model's transformers config; a module
    without one is taken as full attention). Layer types no explicit cache can serve (linear
    attention, shared KV) are refused here, by name."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return (False,) * layers
    from transformers.cache_utils import get_layer_types_and_kwargs

    from .cache import SUPPORTED_LAYER_TYPES

    types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    bad = sorted({t for t in types if t not in SUPPORTED_LAYER_TYPES})
    if bad:
        raise InputError(
            f"{type(model).__name__} has layers of type {', '.join(bad)}: export_llm serves attention "
            "layers with a key/value cache (full, sliding or chunked) only",
            hint="export the model as a stateless forward with dx.export",
        )
    return tuple(SUPPORTED_LAYER_TYPES[t] for t in types[:layers])


class DecoderWithCache(nn.Module):
    """Drives ``model``'s own forward with an :class:`~dualexport.llm.cache.ExplicitCache` over the
    given tensors, and returns the logits and the cache update. Changes nothing in ``model``.
    ``mode``: how the update is handed back (``"rows"``: the new rows only; ``"dense"``: the
    whole updated cache; ``"index_copy"``: the same as the plain design writes it).
    ``padding_mask``: also pass ``attention_mask``, all ones over the cache's length (no padding),
    for a decoder that otherwise builds its own from ``past length + S`` (BioGPT:
    ``torch.ones(batch, past + S)`` with the past length a traced value, a size torch.export
    cannot capture); a static shape, the same mask."""

    def __init__(
        self, model: nn.Module, sliding: Sequence[bool], mode: str = "dense", padding_mask: bool = False
    ) -> None:
        super().__init__()
        self.model = model
        self.sliding = tuple(bool(s) for s in sliding)
        self.mode = mode
        self.padding_mask = padding_mask

    def forward(
        self, input_ids: torch.Tensor, cache_position: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from .cache import ExplicitCache

        layers = len(self.sliding)
        if len(past) != 2 * layers:
            raise InputError(
                f"the program takes {2 * layers} cache tensors (keys then values of {layers} layers), "
                f"got {len(past)}",
                hint="pass LlmLayout.past_args(past_k, past_v)",
            )
        position_ids = cache_position.unsqueeze(0)
        cache = ExplicitCache(
            past[:layers],
            past[layers:],
            cache_position,
            self.sliding,
            mode=self.mode,
            position_ids=position_ids,
        )
        given: dict[str, Any] = {"position_ids": position_ids, "past_key_values": cache, "use_cache": True}
        if self.padding_mask:
            given["attention_mask"] = torch.ones(1, past[0].shape[2], dtype=torch.long)
        kwargs = _accepted_kwargs(self.model, given)
        with cache.active():
            logits = _logits(self.model(input_ids=input_ids, **kwargs))
        present_k, present_v = cache.present()  # the new rows in "rows" mode
        return logits, present_k, present_v


def probe_layout(model: nn.Module, max_seq_len: int, name: str = "") -> LlmLayout:
    """Run ``model`` once on two tokens with a recording cache: the layers it updates and the
    shapes of the states it writes give the cache layout, for any decoder (a user's module too)."""
    from .cache import RecordingCache

    cache = RecordingCache()
    ids = torch.zeros(1, 2, dtype=torch.long)
    kwargs = _accepted_kwargs(
        model, {"position_ids": torch.arange(2).unsqueeze(0), "past_key_values": cache, "use_cache": True}
    )
    if "past_key_values" not in kwargs and "cache" not in kwargs:
        raise InputError(
            f"{type(model).__name__}.forward takes no past_key_values",
            hint="export_llm drives a transformers-style decoder: forward(input_ids, position_ids=..., "
            "past_key_values=cache) calling cache.update(key, value, layer_idx) in each layer",
        )
    try:
        with torch.no_grad():
            logits = _logits(model(input_ids=ids, **kwargs))
    except DualExportError:
        raise
    except Exception as exc:  # the model itself fails: its error, named as the model's
        raise InputError(
            f"{name or type(model).__name__} fails on a two-token forward with a cache, before any "
            f"export: {type(exc).__name__}: {exc}",
            hint="check that the model runs eagerly: model(input_ids, position_ids=..., "
            "past_key_values=DynamicCache(), use_cache=True) (a config whose sizes disagree, "
            "e.g. num_key_value_heads above num_attention_heads, fails there)",
        ) from exc
    shapes = cache.shapes()
    if not shapes or any(s is None for s in shapes):
        missing = [i for i, s in enumerate(shapes) if s is None]
        raise InputError(
            f"{type(model).__name__} did not write its cache "
            + (f"for layers {missing}" if missing else "at all"),
            hint="each attention layer must call past_key_values.update(key, value, layer_idx)",
        )
    (k0, v0, dtype) = shapes[0]  # type: ignore[misc]
    for i, s in enumerate(shapes):
        assert s is not None
        k, v, _ = s
        if len(k) != 4 or k[0] != 1 or k[2] != 2 or (k[1], k[3], v[1], v[3]) != (k0[1], k0[3], v0[1], v0[3]):
            raise InputError(
                f"layer {i} writes keys {k} and values {v}; the first wrote {k0} and {v0}",
                hint="export_llm needs [batch, kv_heads, seq, head_dim] states of one shape in every layer",
            )
    if logits.dim() != 3 or logits.shape[:2] != (1, 2):
        raise InputError(
            f"the model's logits have shape {tuple(logits.shape)} for 2 tokens",
            hint="a causal LM returns logits [batch, seq, vocab]",
        )
    config = getattr(model, "config", None)
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is None and config is not None:
        eos = getattr(config, "eos_token_id", None)
    eos_ids = tuple(
        int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    )
    return LlmLayout(
        inputs=input_names(len(shapes)),
        layers=len(shapes),
        kv_heads=k0[1],
        head_dim=k0[3],
        v_head_dim=v0[3],
        max_seq_len=max_seq_len,
        vocab=int(logits.shape[-1]),
        dtype=str(dtype).replace("torch.", ""),
        sliding=sliding_layers(model, len(shapes)),
        eos_token_ids=eos_ids,
        model=name or type(model).__name__,
    )


def example_inputs(layout: LlmLayout, seq: int | None = None) -> tuple[torch.Tensor, ...]:
    """A prefill from an empty cache: ``seq`` tokens (by default about half the window) spanning
    the vocabulary (parity draws token ids from the example's range), positions ``0..seq-1``."""
    seq = seq or max(2, min(8, layout.max_prompt // 2))
    dtype = getattr(torch, layout.dtype)
    ids = torch.linspace(0, layout.vocab - 1, seq).long().unsqueeze(0)
    past = layout.past_args(
        torch.zeros(layout.cache_shape(), dtype=dtype),
        torch.zeros(layout.cache_shape(values=True), dtype=dtype),
    )
    # each layer's tensor its own storage (views of one would be aliased inputs to torch.export)
    return (ids, torch.arange(seq, dtype=torch.long), *(p.clone() for p in past))


def dynamic_shapes(layout: LlmLayout) -> dict[str, Any]:
    """The number of new tokens S in 1..max_seq_len-1 (prefill and decode); with
    ``layout.past_step``, also the cache slots passed, ``past_step..max_seq_len``."""
    seq = torch.export.Dim("seq", min=1, max=layout.max_prompt)
    slots = None
    if layout.past_step:
        slots = {2: torch.export.Dim("past", min=layout.past_step, max=layout.max_seq_len)}
    return {"input_ids": {1: seq}, "cache_position": {0: seq}, "past": (slots,) * (2 * layout.layers)}


def past_step(max_seq_len: int) -> int:
    """The prefix granularity of a ``"rows"`` program's cache input: 32 slots, fewer for a short
    cache (at least 4 prefix lengths); 0 (all slots) when the cache is too short to gain."""
    step = min(32, max_seq_len // 4)
    return step if step >= 2 else 0
