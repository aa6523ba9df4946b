"""Say where a node came from: its op, its name and the line of the user's model.

Why: an error or a divergence that names only ``aten.foo.default`` sends the user hunting; the
node's ``stack_trace`` meta holds the line in their forward() that produced it.
"""

from __future__ import annotations

import torch

from ..compat.torch import OpOverload

__all__ = ["op_name", "user_frame", "describe_node", "weight_placeholders", "unused_weight_notes"]


def op_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, OpOverload):
        return str(target)  # e.g. aten.convolution.default
    return getattr(target, "__name__", str(target))


def user_frame(node: torch.fx.Node) -> str | None:
    """The innermost frame of the node's stack trace (the user's line), as 'file:line in fn: code'."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    frames = [i for i, ln in enumerate(lines) if ln.startswith("File ")]
    # Prefer the innermost frame outside torch itself: the user's line, not nn.Module internals.
    user = [i for i in frames if "/torch/" not in lines[i] and "site-packages" not in lines[i]]
    for i in user[-1:] or frames[-1:]:
        if lines[i].startswith("File "):
            code = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") else ""
            loc = lines[i].replace("File ", "", 1)
            return f"{loc}: {code}" if code else loc
    return lines[-1]


def describe_node(node: torch.fx.Node) -> str:
    where = user_frame(node)
    text = f"op {op_name(node)} at node '{node.name}'"
    return f"{text} (model line: {where})" if where else text


def weight_placeholders(program) -> dict[str, torch.fx.Node]:
    """state_dict/constants name -> its placeholder node in ``program``."""
    sig = program.graph_signature
    names: dict[str, str] = {}
    names.update(sig.inputs_to_parameters)
    names.update(sig.inputs_to_buffers)
    names.update(sig.inputs_to_lifted_tensor_constants)
    return {names[n.name]: n for n in program.graph.nodes if n.op == "placeholder" and n.name in names}


def unused_weight_notes(program) -> dict[str, str]:
    """Weights the (decomposed) program takes but never reads: a target may drop them."""
    return {
        name: "unused by the program (no node reads it), so the target does not store it"
        for name, node in weight_placeholders(program).items()
        if not node.users
    }
