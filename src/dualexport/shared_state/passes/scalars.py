"""Drop data-dependent scalars that only runtime assertions read.

Why: a model can read a tensor's value into a Python int (``.item()``; transformers' OPT sizes a
position mask by ``past_key_values.get_seq_length() + seq``, and a cache whose length is a tensor
makes that an ``item``) and then never use the tensor it sized (the mask is dead once position ids
are given). ``torch.export`` keeps the read and the assertions it implied (``u0 >= 0``), and
sometimes the dead tensor too. ExecuTorch's decomposition re-traces the program and fails on such
a read: "PendingUnbackedSymbolNotFound: Pending unbacked symbols {u3} not in returned outputs".
The read computes nothing that any output or tensor depends on, so the read, the comparisons on it and
the assertions go, on the shared program, and both targets and eager keep computing the same
outputs (what is dropped is a check of the input's values that no output needs).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from .base import ProgramPass
from .graph_edit import drop_dead_constants

__all__ = ["AssertOnlyScalars"]

aten = torch.ops.aten

_READS = {aten.item.default, aten._local_scalar_dense.default}


def _scalar_only_closure(read: torch.fx.Node) -> list[torch.fx.Node] | None:
    """``read`` and every node reading it transitively, when none of them is a tensor, an output
    or anything but a scalar computation or an assertion; None otherwise."""
    seen: dict[torch.fx.Node, None] = {}
    stack = [read]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen[node] = None
        for user in node.users:
            if user.op != "call_function" or isinstance(user.meta.get("val"), torch.Tensor):
                return None
            stack.append(user)
    return list(seen)


class AssertOnlyScalars(ProgramPass):
    """``x.item()`` read only by assertions (and the scalar arithmetic feeding them) -> nothing."""

    serves = "shared"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        graph = program.graph
        if not any(n.op == "call_function" and n.target in _READS for n in graph.nodes):
            return program
        # the dead tensor the read sized goes first (export keeps some: ``aten.ones`` here)
        changed = graph.eliminate_dead_code()
        order = {n: i for i, n in enumerate(graph.nodes)}
        dropped: set[torch.fx.Node] = set()
        symbols = set()
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in _READS or node in dropped:
                continue
            closure = _scalar_only_closure(node)
            if closure is None:
                continue
            val = node.meta.get("val")
            if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
                symbols |= val.node.expr.free_symbols
            dropped.update(closure)
        for node in sorted(dropped, key=order.__getitem__, reverse=True):
            graph.erase_node(node)
        for sym in [s for s in program.range_constraints if getattr(s, "free_symbols", set()) & symbols]:
            del program.range_constraints[sym]
        if changed or dropped:
            drop_dead_constants(program)  # constants only the dead tensor read
            graph.lint()
            program.graph_module.recompile()
        return program
