"""The program's output signature kept in step with the graph it describes.

Why: an ExportedProgram names its outputs twice, in the graph's output node and in the
signature's output specs. ``Node.replace_all_uses_with`` rewires the first only, so a pass that
replaces a node the graph returns (a product with a buffer of ones folded away, an SDPA at the
model's output rewritten) leaves the signature naming a node that no longer exists, and
torch.export's verifier refuses the program at its next save or decomposition. The output node
is the truth; the specs mirror its names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, OutputSpec

from ...compat.torch import set_graph_signature

__all__ = ["output_signature_problems", "sync_output_signature"]


def _output_args(program: ExportedProgram) -> list[Any]:
    """The graph output node's values, flat, in the order of the signature's output specs."""
    out = program.graph.output_node()
    args = out.args[0] if out.args else ()
    return list(args) if isinstance(args, (tuple, list)) else [args]


def output_signature_problems(program: ExportedProgram) -> list[str]:
    """Where the signature's output specs no longer name what the graph returns (a pass that
    replaced a returned node with ``Node.replace_all_uses_with`` leaves the old name behind, and
    torch.export's verifier then refuses the program at the next save or decomposition)."""
    specs = program.graph_signature.output_specs
    args = _output_args(program)
    if len(specs) != len(args):
        return [f"the graph returns {len(args)} values, the signature names {len(specs)}"]
    problems = []
    for i, (spec, arg) in enumerate(zip(specs, args, strict=True)):
        named = getattr(spec.arg, "name", None)
        if isinstance(arg, torch.fx.Node) and named is not None and named != arg.name:
            problems.append(
                f"output {i} ({spec.kind.name}) is named {named!r} but the graph returns {arg.name!r}"
            )
    return problems


def sync_output_signature(program: ExportedProgram) -> bool:
    """The signature's output specs renamed after the nodes the graph returns (kinds and targets
    kept): the output node is the truth, the specs only mirror its names. True if any changed."""
    specs = list(program.graph_signature.output_specs)
    args = _output_args(program)
    if len(specs) != len(args):
        return False
    changed = False
    for i, (spec, arg) in enumerate(zip(specs, args, strict=True)):
        named = getattr(spec.arg, "name", None)
        if isinstance(arg, torch.fx.Node) and named is not None and named != arg.name:
            specs[i] = OutputSpec(
                kind=spec.kind, arg=dataclasses.replace(spec.arg, name=arg.name), target=spec.target
            )
            changed = True
    if changed:
        sig = program.graph_signature
        set_graph_signature(
            program, ExportGraphSignature(input_specs=list(sig.input_specs), output_specs=specs)
        )
    return changed
