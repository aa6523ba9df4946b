"""The reference: the shared program run eagerly in PyTorch."""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

__all__ = ["EagerRunner", "flatten_inputs"]


def flatten_inputs(program: ExportedProgram, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[torch.Tensor]:
    """The tensors of (args, kwargs) in the order the exported program (and so ONNX and
    ExecuTorch) takes them."""
    flat, _ = pytree.tree_flatten((tuple(args), dict(kwargs or {})))
    return [x for x in flat if isinstance(x, torch.Tensor)]


class EagerRunner:
    """Runs ``program.module()`` on flat inputs; outputs are flattened the same way the runtimes
    return them (pytree order)."""

    name = "eager"

    def __init__(self, program: ExportedProgram, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> None:
        self.module = program.module()
        # The unlifted module holds the holder's tensors, and torch.export's graph may update
        # buffers in place (add_/copy_). Give every buffer its own copy so running the
        # reference never changes the shared program.
        for fqn, buf in list(self.module.named_buffers()):
            owner_name, _, leaf = fqn.rpartition(".")
            owner = self.module.get_submodule(owner_name) if owner_name else self.module
            persistent = leaf not in getattr(owner, "_non_persistent_buffers_set", set())
            owner.register_buffer(leaf, buf.clone(), persistent=persistent)
        flat, self.in_spec = pytree.tree_flatten((tuple(args), dict(kwargs or {})))
        self._template = flat

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        it = iter(inputs)
        flat = [next(it) if isinstance(x, torch.Tensor) else x for x in self._template]
        args, kwargs = pytree.tree_unflatten(flat, self.in_spec)
        with torch.no_grad():
            out = self.module(*args, **kwargs)
        leaves, _ = pytree.tree_flatten(out)
        return [x.detach().clone() if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x in leaves]
