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

import operator
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
    hidden, chain, why = _activation_source(node)
    if why:
        return why
    val = hidden.meta.get("val")
    if val is None or val.dim() != 3:
        return "the head's input is not [1, S, hidden]"
    with graph.inserting_after(hidden):
        last = graph.call_function(last_row, (hidden,))
    for reader in chain:  # the head, or the ops quantizing its input token by token
        reader.replace_input_with(hidden, last)
    module.recompile()
    return None


def _activation_source(head: fx.Node) -> tuple[Any, list[fx.Node], str]:
    """The float hidden state the head reads, and the nodes that read it on the way (the head
    itself, or a quantized head's per-token activation quantization: ``choose_qparams``,
    ``quantize``, ``dequantize``, whose rows are each position's own)."""
    source = head.args[0]
    if not isinstance(source, fx.Node) or not _is_quant(source):
        return source, [head], ""
    chain: list[fx.Node] = []
    roots: set[fx.Node] = set()
    stack = [source]
    while stack:
        node = stack.pop()
        if node in chain:
            continue
        chain.append(node)
        if node.target is operator.getitem or _is_quant(node):
            if _name(node).endswith("choose_qparams_affine") and not _per_row(node):
                return None, [], "the head's activations are quantized over more than one position"
            stack.extend(a for a in node.args if isinstance(a, fx.Node) and not _is_weight(a))
        else:
            roots.add(node)
    if len(roots) != 1:
        return None, [], "the head's quantized input has no single hidden state"
    root = roots.pop()
    chain.remove(root)
    return root, [n for n in chain if root in n.all_input_nodes], ""


def _name(node: fx.Node) -> str:
    return str(getattr(node.target, "__name__", node.target)).split(".")[0]


def _is_quant(node: fx.Node) -> bool:
    return node.op == "call_function" and _name(node) in _ACTIVATION_QUANT


def _is_weight(node: fx.Node) -> bool:
    return node.op in ("get_attr", "placeholder")


def _per_row(choose: fx.Node) -> bool:
    """A ``choose_qparams_affine`` whose block spans the last dimension only: one scale per row."""
    block = choose.args[2] if len(choose.args) > 2 else choose.kwargs.get("block_size")
    return isinstance(block, (list, tuple)) and all(int(b) == 1 for b in block[:-1])


#: torchao's dynamic activation quantization (``torch.ops.torchao.*``), each row its own scale
_ACTIVATION_QUANT = {"choose_qparams_affine", "quantize_affine", "dequantize_affine"}
