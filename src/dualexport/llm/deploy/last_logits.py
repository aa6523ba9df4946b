"""The runner .pte's logits at each call's last position only (``[1, 1, V]``), as ExecuTorch's own
LLM export writes them.

Why: ExecuTorch's text runner reads one row per call (the last, to pick the next token). The
shared program returns a row per position, so a prefill of ``S`` tokens multiplies all ``S``
hidden states by the output head (``S x hidden x vocab``: on a 49k vocabulary, more multiply-adds
than the rest of a small model) and the runtime plans an ``S x vocab`` output. Here the head reads
the last position's hidden state alone: every op after the head's input works position by
position, so the row it returns is the one the program computes.

How: a pass on the target's copy of the program's graph: from the logits output back through
position-wise ops (casts, scalar scaling, soft-capping) to the linear that makes them, whose input
is then taken at its last position.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

__all__ = ["last_position_logits", "last_row"]

_aten = torch.ops.aten
#: ops between the head and the logits that work element by element (their other operand a scalar)
_ELEMENTWISE = {
    _aten.to.dtype,
    _aten.to.dtype_layout,
    _aten._to_copy.default,
    _aten.clone.default,
    _aten.mul.Tensor,
    _aten.div.Tensor,
    _aten.tanh.default,
    _aten.add.Tensor,
    _aten.sub.Tensor,
}
_HEADS = {_aten.linear.default}


def last_row(hidden: torch.Tensor) -> torch.Tensor:
    """``[1, S, H]`` -> ``[1, 1, H]``: the last position."""
    return hidden[:, -1:]


def _is(node: Any, targets: set[Any]) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def last_position_logits(module: fx.GraphModule) -> str | None:
    """Make ``module``'s first output (the logits) its last position's only. Returns None when
    done, else why not (the graph is then unchanged)."""
    graph = module.graph
    output = next(n for n in graph.nodes if n.op == "output")
    outs = output.args[0]
    logits = outs[0] if isinstance(outs, (list, tuple)) else outs
    node = logits
    while _is(node, _ELEMENTWISE):
        tensors = [a for a in node.args if isinstance(a, fx.Node)]
        if len(tensors) != 1 or any(isinstance(v, fx.Node) for v in node.kwargs.values()):
            return f"{node.name} between the head and the logits reads another tensor"
        node = tensors[0]
    if not _is(node, _HEADS):
        return f"the logits do not come from a linear (from {getattr(node, 'target', node)})"
    hidden = node.args[0]
    val = hidden.meta.get("val") if isinstance(hidden, fx.Node) else None
    if val is None or val.dim() != 3:
        return "the head's input is not [1, S, hidden]"
    with graph.inserting_before(node):
        last = graph.call_function(last_row, (hidden,))
    node.replace_input_with(hidden, last)
    module.recompile()
    return None
