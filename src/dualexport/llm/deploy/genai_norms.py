"""The genai .onnx's residual ``Add`` before each RMS norm as ONNX Runtime's
``SkipSimplifiedLayerNormalization`` (``com.microsoft``), as onnxruntime-genai's builder writes it.

Why: a decoder layer adds its residual and normalizes twice; as two nodes that is a kernel, a
write and a read of the hidden state more per norm and step. ONNX Runtime fuses the pair itself
only where its shape inference knows both inputs' shapes, which it does not in our files
(SmolLM2-135M-Instruct: 61 ``Add`` + ``SimplifiedLayerNormalization`` pairs left after its
optimizer, 0 in the builder's file).

How: an onnx-ir rewrite (genai_packing.builder_fusions), after the attention's: each
``SimplifiedLayerNormalization`` over the last axis whose input is an ``Add`` of two non-constant
values becomes one node whose fourth output (the sum) replaces the ``Add``'s other uses. The
deploy proof walks the file afterwards.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fuse_skip_norms"]


def fuse_skip_norms(ir: Any, graph: Any) -> int:
    """Rewrite every residual norm of ``graph`` (see the module docstring); returns how many."""
    fused = 0
    for norm in list(graph):
        if norm.op_type != "SimplifiedLayerNormalization" or norm.domain != "" or len(norm.inputs) != 2:
            continue
        if norm.attributes.get_int("axis", -1) != -1 or norm.attributes.get_int("stash_type", 1) != 1:
            continue
        add = norm.inputs[0].producer() if norm.inputs[0] is not None else None
        if add is None or add.op_type != "Add" or add.domain != "" or len(norm.outputs) != 1:
            continue
        a, b = add.inputs
        if a is None or b is None or a.const_value is not None or b.const_value is not None:
            continue
        out, total = (
            ir.Value(name=f"{norm.outputs[0].name}_skip"),
            ir.Value(name=f"{add.outputs[0].name}_skip"),
        )
        epsilon = norm.attributes.get_float("epsilon", 1e-5)
        skip = ir.node(
            "SkipSimplifiedLayerNormalization",
            [a, b, norm.inputs[1]],
            {"epsilon": epsilon},
            domain="com.microsoft",
            outputs=[out, ir.Value(name=""), ir.Value(name=""), total],
        )
        graph.insert_before(norm, skip)
        norm.outputs[0].replace_all_uses_with(out, replace_graph_outputs=True)
        add.outputs[0].replace_all_uses_with(total, replace_graph_outputs=True)
        fused += 1
    return fused
