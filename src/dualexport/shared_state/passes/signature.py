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


def _renamed(program: ExportedProgram) -> list[tuple[int, Any, torch.fx.Node]] | None:
    """(index, spec, returned node) of each output spec that names another node than the graph
    returns there; None when the two do not even count the same outputs."""
    out = program.graph.output_node()
    args = out.args[0] if out.args else ()
    returned = list(args) if isinstance(args, (tuple, list)) else [args]
    specs = program.graph_signature.output_specs
    if len(specs) != len(returned):
        return None
    return [
        (i, spec, arg)
        for i, (spec, arg) in enumerate(zip(specs, returned, strict=True))
        if isinstance(arg, torch.fx.Node) and getattr(spec.arg, "name", None) not in (None, arg.name)
    ]


def output_signature_problems(program: ExportedProgram) -> list[str]:
    """Where the signature's output specs no longer name what the graph returns (a pass that
    replaced a returned node with ``Node.replace_all_uses_with`` leaves the old name behind, and
    torch.export's verifier then refuses the program at the next save or decomposition)."""
    renamed = _renamed(program)
    if renamed is None:
        return ["the graph returns another number of values than the signature names"]
    return [
        f"output {i} ({spec.kind.name}) is named {spec.arg.name!r} but the graph returns {arg.name!r}"
        for i, spec, arg in renamed
    ]


def sync_output_signature(program: ExportedProgram) -> bool:
    """The signature's output specs renamed after the nodes the graph returns (kinds and targets
    kept): the output node is the truth, the specs only mirror its names. True if any changed."""
    renamed = _renamed(program)
    if not renamed:
        return False
    sig = program.graph_signature
    specs = list(sig.output_specs)
    for i, spec, arg in renamed:
        specs[i] = OutputSpec(
            kind=spec.kind, arg=dataclasses.replace(spec.arg, name=arg.name), target=spec.target
        )
    set_graph_signature(program, ExportGraphSignature(input_specs=list(sig.input_specs), output_specs=specs))
    return True
