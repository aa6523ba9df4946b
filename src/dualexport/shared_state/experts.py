"""The mixture-of-experts kernel a transformers model is traced with.

Why: transformers (5.x) builds its experts modules (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, ...)
with the ``"grouped_mm"`` kernel by default. On a CPU float32 model that kernel is the custom op
``transformers::grouped_mm_fallback`` fed by a ``histc`` of the routing: torch.onnx 2.13 has no
translation for the op and ExecuTorch 1.4.1 refuses ``histc`` (not Core ATen), so both targets
failed. ``"eager"`` loops over the experts a batch hits (data-dependent: no trace). transformers'
own ``"batched_mm"`` kernel computes the same sum with the chosen experts' weights gathered per
token-expert pair (``index`` on the parameters, ``bmm``): every op of it exports to both runtimes,
the weights stay the parameters themselves (the weight proof sees them), and parity is checked
against the user's eager model on its own kernel. It is selected for the trace only; the model's
setting is restored after.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from torch import nn

from ..compat.transformers import experts_implementation, set_experts_implementation

__all__ = ["EXPORTED_EXPERTS", "exportable_experts"]

logger = logging.getLogger(__name__)

#: The experts kernel a trace uses.
EXPORTED_EXPERTS = "batched_mm"
#: Kernels that do not trace into ops both targets take (see the module docstring).
_UNEXPORTABLE = frozenset({"grouped_mm", "eager"})


def _configs(model: nn.Module) -> list[Any]:
    """The distinct transformers configs of ``model``'s modules that select an unexportable
    experts kernel."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and experts_implementation(config) in _UNEXPORTABLE:
            seen.setdefault(id(config), config)
    return list(seen.values())


@contextlib.contextmanager
def exportable_experts(model: nn.Module) -> Iterator[None]:
    """Trace ``model``'s experts modules with :data:`EXPORTED_EXPERTS` (a model without them, or
    with a kernel of its user's own, is left alone); each config's own setting is restored after."""
    configs = _configs(model)
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
