"""How a transformers model is traced: as a deployment file runs it, whatever it was set up for.

Why, one setting each (every one set for the trace only; the model's own is restored after):

* **The experts kernel.** transformers (5.x) builds its experts modules (Mixtral, Qwen2-MoE,
  Qwen3-MoE, OLMoE, GPT-OSS, ...) with the ``"grouped_mm"`` kernel by default. On a CPU float32
  model that kernel is the custom op ``transformers::grouped_mm_fallback`` fed by a ``histc`` of
  the routing: torch.onnx 2.13 has no translation for the op and ExecuTorch 1.4.1 refuses
  ``histc`` (not Core ATen), so both targets failed. ``"eager"`` loops over the experts a batch
  hits (data-dependent: no trace). transformers' own ``"batched_mm"`` kernel computes the same sum
  with the chosen experts' weights gathered per token-expert pair (``index`` on the parameters,
  ``bmm``): every op of it exports to both runtimes and the weights stay the parameters themselves
  (the weight proof sees them). Parity is checked against the program, and the tests check the
  files against the user's model on its own kernel.
* **The cache.** A causal LM returns its key/value cache object by default (``use_cache=True``);
  torch.export refuses an output of a class it cannot flatten ("Found DynamicCache in output"),
  and a file of a stateless forward has no use for it. The trace runs with ``use_cache=False``
  (the logits are the same) unless the call itself passes ``use_cache`` or ``past_key_values``
  (``dx.export_llm``'s cache wrapper passes both: it is not touched).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from torch import nn

from ..compat.transformers import experts_implementation, set_experts_implementation

__all__ = ["EXPORTED_EXPERTS", "exportable_experts", "no_cache_output", "traced_as_deployed"]

logger = logging.getLogger(__name__)

#: The experts kernel a trace uses.
EXPORTED_EXPERTS = "batched_mm"
#: Kernels that do not trace into ops both targets take (see the module docstring).
_UNEXPORTABLE = frozenset({"grouped_mm", "eager"})
#: Arguments by which a call manages its cache itself.
_CACHE_ARGUMENTS = frozenset({"use_cache", "past_key_values"})


def _configs(model: nn.Module) -> list[Any]:
    """The distinct configs of ``model``'s modules (transformers' and its sub-configs)."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None:
            seen.setdefault(id(config), config)
    return list(seen.values())


@contextlib.contextmanager
def exportable_experts(model: nn.Module) -> Iterator[None]:
    """Trace ``model``'s experts modules with :data:`EXPORTED_EXPERTS` (a model without them, or
    with a kernel of its user's own, is left alone)."""
    configs = [c for c in _configs(model) if experts_implementation(c) in _UNEXPORTABLE]
    saved = [experts_implementation(c) for c in configs]
    if configs:
        logger.info(
            "mixture-of-experts kernel %s -> %r for the trace (exports to both targets)",
            sorted(set(saved)),
            EXPORTED_EXPERTS,
        )
    try:
        for config in configs:
            set_experts_implementation(config, EXPORTED_EXPERTS)
        yield
    finally:
        for config, value in zip(configs, saved, strict=True):
            set_experts_implementation(config, value)


@contextlib.contextmanager
def no_cache_output(model: nn.Module, kwargs: Mapping[str, Any] | None) -> Iterator[None]:
    """Trace ``model`` with ``use_cache=False`` in every config that sets it, unless the call's
    ``kwargs`` manage the cache themselves."""
    if kwargs and _CACHE_ARGUMENTS & set(kwargs):
        yield
        return
    configs = [c for c in _configs(model) if getattr(c, "use_cache", None) is True]
    if configs:
        logger.info("use_cache=False for the trace: a deployment file returns no cache object")
    try:
        for config in configs:
            config.use_cache = False
        yield
    finally:
        for config in configs:
            config.use_cache = True


@contextlib.contextmanager
def traced_as_deployed(model: nn.Module, kwargs: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Every setting of the module docstring, around one trace."""
    with exportable_experts(model), no_cache_output(model, kwargs):
        yield
