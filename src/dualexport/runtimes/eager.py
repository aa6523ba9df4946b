"""The reference: the shared program run eagerly in PyTorch."""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

__all__ = ["EagerRunner", "flatten_inputs", "is_stateful"]


def is_stateful(program: ExportedProgram) -> bool:
    """Whether running the program changes its buffers (a counter, a KV cache): then every input
    set must start from fresh state in every runtime."""
    if program.graph_signature.buffers_to_mutate:
        return True
    buffers = set(program.graph_signature.inputs_to_buffers)
    for node in program.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None and schema.is_mutable and any(
                isinstance(a, torch.fx.Node) and a.name in buffers for a in node.args):
            return True
    return False


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
        self._initial = {fqn: buf for fqn, buf in self.module.named_buffers()}
        self.reset()
        flat, self.in_spec = pytree.tree_flatten((tuple(args), dict(kwargs or {})))
        self._template = flat

    def reset(self) -> None:
        """Fresh copies of every buffer, from the holder's values.

        The unlifted module holds the holder's tensors, and torch.export's graph may update
        buffers in place (add_/copy_): copies keep the reference from changing the shared program,
        and resetting them starts a stateful model over for the next input set.
        """
        for fqn, buf in self._initial.items():
            owner_name, _, leaf = fqn.rpartition(".")
            owner = self.module.get_submodule(owner_name) if owner_name else self.module
            persistent = leaf not in getattr(owner, "_non_persistent_buffers_set", set())
            owner.register_buffer(leaf, buf.clone(), persistent=persistent)

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        it = iter(inputs)
        flat = [next(it) if isinstance(x, torch.Tensor) else x for x in self._template]
        args, kwargs = pytree.tree_unflatten(flat, self.in_spec)
        with torch.no_grad():
            out = self.module(*args, **kwargs)
        leaves, _ = pytree.tree_flatten(out)
        return [x.detach().clone() if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x in leaves]
