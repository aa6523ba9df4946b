"""The reference: the shared program run eagerly in PyTorch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.export import ExportedProgram

from ..compat.torch import pytree
from ..shared_state.program import reference_module

__all__ = ["EagerRunner"]


class EagerRunner:
    """Runs the program's module on flat inputs; outputs are flattened the way the runtimes
    return them (pytree order)."""

    name = "eager"

    def __init__(
        self, program: ExportedProgram, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None
    ) -> None:
        self._program = program
        self.module = reference_module(program)
        flat, self.in_spec = pytree.tree_flatten((tuple(args), dict(kwargs or {})))
        self._template = flat

    def reset(self) -> None:
        """Start a stateful model over: fresh copies of every buffer, from the holder's values."""
        self.module = reference_module(self._program)

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        it = iter(inputs)
        flat = [next(it) if isinstance(x, torch.Tensor) else x for x in self._template]
        args, kwargs = pytree.tree_unflatten(flat, self.in_spec)
        with torch.no_grad():
            out = self.module(*args, **kwargs)
        leaves, _ = pytree.tree_flatten(out)
        return [x.detach().clone() if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x in leaves]
