"""transformers' private symbols dualexport reaches (``SEAMS`` lists each).

Why: see the package docstring. The functions take a config object and never import
transformers (it costs seconds; the caller already has the config).
"""

from __future__ import annotations

from typing import Any

from . import Seam

__all__ = [
    "SEAMS",
    "attn_implementation",
    "experts_implementation",
    "has_attn_implementation",
    "set_attn_implementation",
    "set_experts_implementation",
]

SEAMS: tuple[Seam, ...] = (
    Seam(
        "transformers.configuration_utils.PreTrainedConfig._attn_implementation",
        "the attention kernel a model's modules dispatch to (set before and around export)",
        "set_attn_implementation",
    ),
    Seam(
        "transformers.configuration_utils.PreTrainedConfig._experts_implementation",
        "the mixture-of-experts kernel a model's experts modules dispatch to (set around export)",
        "set_experts_implementation",
    ),
)


def has_attn_implementation(config: Any) -> bool:
    """Whether ``config`` is a transformers config that names its attention kernel."""
    return hasattr(config, "_attn_implementation")


def attn_implementation(config: Any) -> Any:
    """The attention kernel ``config`` selects ("sdpa", "eager", a registered name, or None)."""
    return config._attn_implementation


def set_attn_implementation(config: Any, value: Any) -> None:
    """Select the attention kernel (transformers' setter; the public ``attn_implementation``
    keyword exists only at construction)."""
    config._attn_implementation = value


def experts_implementation(config: Any) -> Any:
    """The experts kernel ``config`` selects ("grouped_mm", "batched_mm", "eager", a registered
    name), or None: a config without mixture-of-experts modules, or one older than the setting."""
    return getattr(config, "_experts_implementation", None)


def set_experts_implementation(config: Any, value: Any) -> None:
    """Select the experts kernel (transformers' setter, which also sets the sub-configs'; the
    public ``experts_implementation`` keyword exists only at construction)."""
    config._experts_implementation = value
