"""Fold input-independent subgraphs of the shared program into lifted constants.

Why: Hugging Face models build their attention masks from ``arange``/``unsqueeze``/``expand``/
``gather`` chains over constants and non-mutated buffers. None of those int/bool ops is taken by
XNNPACK, so each chain splits a partition and costs a portable-kernel call per inference; the ONNX
graph carries them too. Computed once here, they become one small constant in both artifacts.

Parameters are never folded (a folded weight would be a copy under a new name, which the weight
manifest could not match to the state_dict), mutated buffers are never folded, and neither is any
result above ``max_bytes`` (folding an ``expand`` can materialize a large tensor).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.export import ExportedProgram

from ...compat.torch import OpOverload, op_schema
from .base import ProgramPass
from .graph_edit import drop_dead_constants, fake_mode_of, lift_constant, replace_all_uses

__all__ = ["fold_constants", "FoldConstants", "FOLD_MAX_BYTES"]

#: Largest folded result kept as a constant (bytes): masks and position ids, not activations.
FOLD_MAX_BYTES = 1 << 20

_NEVER_FOLD = {torch.ops.aten._assert_tensor_metadata.default}
_QUANT_NAMESPACES = frozenset({"quantized_decomposed", "torchao", "quant"})


def _static_tensor(val: Any) -> bool:
    return isinstance(val, torch.Tensor) and all(isinstance(s, int) for s in val.shape)


def _foldable_op(node: torch.fx.Node) -> bool:
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, OpOverload) or target in _NEVER_FOLD:
        return False
    if target.namespace in _QUANT_NAMESPACES:  # a folded dequantize would un-quantize the weights
        return False
    if torch.Tag.nondeterministic_seeded in target.tags or op_schema(target).is_mutable:
        return False
    return bool(op_schema(target).returns)


def _constant_inputs(program: ExportedProgram) -> dict[str, torch.Tensor]:
    """Placeholder name -> value for lifted constants and buffers that forward never mutates."""
    sig = program.graph_signature
    mutated = set(sig.buffers_to_mutate.values())
    out: dict[str, torch.Tensor] = {}
    for ph, name in sig.inputs_to_lifted_tensor_constants.items():
        value = program.constants.get(name)
        if isinstance(value, torch.Tensor):
            out[ph] = value
    for ph, name in sig.inputs_to_buffers.items():
        if name in mutated:
            continue
        value = program.state_dict.get(name, program.constants.get(name))
        if isinstance(value, torch.Tensor):
            out[ph] = value
    return out


def _aliases(node: torch.fx.Node) -> bool:
    """Whether ``node``'s result is a view of its first input (a view op)."""
    schema = op_schema(node.target)
    return bool(schema is not None and schema.returns and schema.returns[0].alias_info is not None)


def _written(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes whose result an in-place op writes, directly or through views of it."""
    out: set[torch.fx.Node] = set()
    for node in graph.nodes:
        schema = op_schema(node.target) if node.op == "call_function" else None
        if schema is None or not schema.is_mutable:
            continue
        for arg, value in zip(schema.arguments, node.args, strict=False):
            if isinstance(value, torch.fx.Node) and arg.alias_info is not None and arg.alias_info.is_write:
                src: torch.fx.Node | None = value
                while src is not None and src not in out:
                    out.add(src)
                    first = src.args[0] if src.op == "call_function" and src.args else None
                    src = first if isinstance(first, torch.fx.Node) and _aliases(src) else None
    return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _evaluate(program: ExportedProgram, max_bytes: int) -> dict[torch.fx.Node, Any]:
    """Every node whose value is computable now (from lifted constants alone), with that value;
    results larger than ``max_bytes`` and ops that cannot run eagerly are left out."""
    graph = program.graph
    values: dict[torch.fx.Node, Any] = {}
    constants = _constant_inputs(program)
    for node in graph.nodes:
        if node.op == "placeholder" and node.name in constants:
            values[node] = constants[node.name]
    with torch.no_grad():
        for node in graph.nodes:
            if node.op != "call_function" or not _foldable_op(node):
                continue
            if any(n not in values for n in node.all_input_nodes):
                continue
            val = node.meta.get("val")
            if node.target is not operator.getitem and not (
                _static_tensor(val) or (isinstance(val, (tuple, list)) and all(map(_static_tensor, val)))
            ):
                continue
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
            try:
                result = node.target(*args, **kwargs)
            except Exception:  # an op we cannot evaluate eagerly stays in the graph
                continue
            if isinstance(result, torch.Tensor) and _nbytes(result) > max_bytes:
                continue
            values[node] = result
    return values


def _drop_written(graph: torch.fx.Graph, values: dict[torch.fx.Node, Any]) -> None:
    """A value written in place later (the training IR keeps in-place ops: ``x.masked_fill_``),
    or aliased by one that is, must stay computed: as a constant it would be mutated, and what
    was folded after it would have read it before the write."""
    for bad in _written(graph):
        stack = [bad]
        while stack:
            n = stack.pop()
            if values.pop(n, None) is not None or n is bad:
                stack.extend(u for u in n.users if u in values)


def _decide_asserts(graph: torch.fx.Graph, values: dict[torch.fx.Node, Any]) -> None:
    """A metadata assert on a folded value is decided now: run it once and drop it, so it does
    not keep its input alive as a second constant."""
    for node in list(graph.nodes):
        if (
            node.op == "call_function"
            and node.target in _NEVER_FOLD
            and not node.users
            and all(n in values for n in node.all_input_nodes)
        ):
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
            try:
                node.target(*args, **kwargs)
            except Exception:  # a failing check stays in the program
                continue
            graph.erase_node(node)


def fold_constants(
    program: ExportedProgram, max_bytes: int = FOLD_MAX_BYTES, *, drop_unused: bool = True
) -> ExportedProgram:
    """Replace every maximal input-independent subgraph by one lifted constant, in place.

    Returns the same program (edited), so the holder's state_dict stays the one dict. With
    ``drop_unused=False`` a lifted constant nothing reads any more keeps its (unused)
    placeholder: a target's program keeps every entry of the holder's, and the weight manifest
    then reads it as unused by that target.
    """
    graph = program.graph
    values = _evaluate(program, max_bytes)
    _drop_written(graph, values)
    _decide_asserts(graph, values)
    frontier = [
        n
        for n in values
        if n.op == "call_function"
        and isinstance(values[n], torch.Tensor)
        and any(u not in values for u in n.users)
    ]
    if not frontier:
        return program

    fake_mode = fake_mode_of(program)
    for node in frontier:
        tensor = values[node].detach().contiguous().clone()
        ph = lift_constant(program, tensor, meta_from=node, fake_mode=fake_mode)
        replace_all_uses(program, node, ph)
    graph.eliminate_dead_code()
    if drop_unused:
        drop_dead_constants(program)  # lifted constants nothing reads any more
    program.graph_module.recompile()
    return program


class FoldConstants(ProgramPass):
    """:func:`fold_constants` as a declared pass: input-independent subgraphs (mask and position
    prologues) computed once, for both targets."""

    serves = "shared"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        return fold_constants(program)
