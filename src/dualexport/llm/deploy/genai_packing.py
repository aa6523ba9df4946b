"""The genai .onnx's query, key and value projections as one packed projection, read by
``GroupQueryAttention``'s packed-QKV input, as onnxruntime-genai's own builder writes them.

Why: three projections of one input are three kernels per layer and step, and an int4 program
with group offsets adds a correction ``MatMul`` and an ``Add`` to each; ONNX Runtime's cost per
node is what a one-token decode step pays at this size. One projection of the concatenated
weights reads the same bytes in one kernel (SmolLM2-135M-Instruct int4: 968 nodes to 788; decode
0.57x to 0.94x the builder's file in one contended run, docs/benchmarks.md).

How: an onnx-ir rewrite of the file as it is finally stored (after :func:`genai.bake_session_config`
for a quantized file, so its ``MatMulNBits`` exist), for each ``GroupQueryAttention`` whose query,
key and value are each ``main(x)`` or ``main(x) + extra``, with the same ``x`` and the same kind
of ``main`` and ``extra`` for all three: ``main`` a ``MatMulNBits`` (the same bits, block and
level) or a ``MatMul`` by a constant; ``extra`` a constant bias or a ``MatMul`` of one shared
value by a constant (the group-offset correction). The constants are concatenated along the
output dim in query, key, value order (GroupQueryAttention's packed layout) and the key and value
inputs left empty. Anything else is left as it is. The deploy proof walks the file afterwards.
"""

from __future__ import annotations

import logging
import pathlib
import shutil
from typing import Any

__all__ = ["pack_qkv", "builder_fusions"]

logger = logging.getLogger(__name__)

_NBITS_ATTRS = ("K", "bits", "block_size", "accuracy_level")


def pack_qkv(ir: Any, graph: Any) -> int:
    """Every layer's projections packed that :func:`_plan` takes, in ``graph``; how many."""
    packed = 0
    for node in list(graph):
        if node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft":
            plan = _plan(node)
            if plan is not None:
                _pack(ir, graph, node, plan, packed)
                packed += 1
    return packed


def builder_fusions(path: pathlib.Path) -> tuple[int, int]:
    """Rewrite the .onnx at ``path`` (and its ``.data``) in place with the nodes onnxruntime-genai's
    builder writes: packed QKV projections (:func:`pack_qkv`) and residual norms
    (:func:`~dualexport.llm.deploy.genai_norms.fuse_skip_norms`); returns how many of each."""
    import onnx_ir as ir
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    from .genai_norms import fuse_skip_norms

    model = ir.load(path)
    packed = pack_qkv(ir, model.graph)
    norms = fuse_skip_norms(ir, model.graph)
    if not packed and not norms:
        return 0, 0
    RemoveUnusedNodesPass()(model)
    # written beside under the same names (the file names its data file), then moved over: the
    # model reads its tensors lazily from the data file being replaced
    folder = path.parent / f".packing.{path.name}"
    folder.mkdir(exist_ok=True)
    try:
        data = path.name + ".data"
        ir.save(model, folder / path.name, external_data=data, size_threshold_bytes=1024)
        del model
        for written in folder.iterdir():
            written.replace(path.parent / written.name)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return packed, norms


def _const(value: Any) -> Any:
    """The array of a stored constant (an initializer), else None."""
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def _projection(value: Any) -> dict[str, Any] | None:
    """``value`` as ``main(x) [+ extra]``, each step read only by the next; else None."""
    if value is None or len(value.uses()) != 1:
        return None
    node = value.producer()
    if node is None:
        return None
    if node.op_type == "Reshape":  # the flattening to [1, S, N] the attention rewrite adds
        shape = _const(node.inputs[1])
        if shape is None or len(shape) != 3 or int(shape[0]) != 1 or int(shape[1]) != -1:
            return None
        inner = _projection(node.inputs[0])
        return None if inner is None or inner["n"] != int(shape[2]) else inner
    extra: dict[str, Any] | None = None
    if node.op_type == "Add" and node.domain == "":
        for main_at in (0, 1):
            other = node.inputs[1 - main_at]
            extra = _extra(other)
            main = _main(node.inputs[main_at])
            if extra is not None and main is not None:
                return {**main, "extra": extra, "nodes": [*main["nodes"], node]}
        return None
    main = _main(value)
    return None if main is None else {**main, "extra": None}


def _main(value: Any) -> dict[str, Any] | None:
    """A ``MatMulNBits`` (no zero points, no bias) or a ``MatMul`` by a constant 2-D weight."""
    node = value.producer() if value is not None and len(value.uses()) == 1 else None
    if node is None:
        return None
    if node.op_type == "MatMulNBits" and node.domain == "com.microsoft" and len(node.inputs) == 3:
        b, scales = _const(node.inputs[1]), _const(node.inputs[2])
        attrs = {a: node.attributes.get_int(a, -1) for a in (*_NBITS_ATTRS, "N")}
        if b is None or scales is None or b.shape[0] != attrs["N"]:
            return None
        return {"kind": "nbits", "x": node.inputs[0], "b": b, "scales": scales, "attrs": attrs,
                "n": attrs["N"], "nodes": [node]}  # fmt: skip
    if node.op_type == "MatMul" and node.domain == "":
        w = _const(node.inputs[1])
        if w is None or w.ndim != 2:
            return None
        return {"kind": "matmul", "x": node.inputs[0], "w": w, "n": int(w.shape[1]), "nodes": [node]}
    return None


def _extra(value: Any) -> dict[str, Any] | None:
    """A constant bias ``[N]``, or ``MatMul(s, C)`` with a constant ``C`` (read only here)."""
    bias = _const(value)
    if bias is not None:
        return {"kind": "bias", "bias": bias} if bias.ndim == 1 else None
    main = _main(value)
    if main is None or main["kind"] != "matmul":
        return None
    return {"kind": "corr", "s": main["x"], "c": main["w"], "nodes": main["nodes"]}


def _plan(gqa: Any) -> list[dict[str, Any]] | None:
    """The three projections of ``gqa`` when they can be packed (see the module docstring)."""
    if len(gqa.inputs) < 3 or any(v is None for v in gqa.inputs[:3]):
        return None
    parts = [_projection(v) for v in gqa.inputs[:3]]
    if any(p is None for p in parts):
        return None
    first: dict[str, Any] = parts[0]  # type: ignore[assignment]
    for p in parts[1:]:
        assert p is not None
        if p["kind"] != first["kind"] or p["x"] is not first["x"]:
            return None
        if p["kind"] == "nbits" and any(p["attrs"][a] != first["attrs"][a] for a in _NBITS_ATTRS):
            return None
        extras = (p["extra"], first["extra"])
        if (extras[0] is None) != (extras[1] is None):
            return None
        if extras[0] is not None and extras[1] is not None:
            if extras[0]["kind"] != extras[1]["kind"]:
                return None
            if extras[0]["kind"] == "corr" and extras[0]["s"] is not extras[1]["s"]:
                return None
    return [p for p in parts if p is not None]


def _pack(ir: Any, graph: Any, gqa: Any, parts: list[dict[str, Any]], layer: int) -> None:
    """One layer's packed projection, in place of its three."""
    import numpy as np

    def init(name: str, array: Any) -> Any:
        value = ir.Value(name=name, const_value=ir.tensor(np.ascontiguousarray(array), name=name))
        graph.register_initializer(value)
        return value

    base, first, n = f"dx_qkv{layer}", parts[0], sum(p["n"] for p in parts)
    main_out = ir.Value(name=f"{base}_main")
    if first["kind"] == "nbits":
        b = init(f"{base}_B", np.concatenate([p["b"] for p in parts], axis=0))
        scales = init(f"{base}_scales", np.concatenate([p["scales"] for p in parts], axis=0))
        attrs = {a: first["attrs"][a] for a in _NBITS_ATTRS}
        nodes = [ir.node("MatMulNBits", [first["x"], b, scales], {**attrs, "N": n}, domain="com.microsoft",
                         outputs=[main_out])]  # fmt: skip
    else:
        w = init(f"{base}_W", np.concatenate([p["w"] for p in parts], axis=1))
        nodes = [ir.node("MatMul", [first["x"], w], outputs=[main_out])]
    packed = main_out
    extra = first["extra"]
    if extra is not None:
        if extra["kind"] == "bias":
            other = init(f"{base}_bias", np.concatenate([p["extra"]["bias"] for p in parts]))
        else:
            c = init(f"{base}_C", np.concatenate([p["extra"]["c"] for p in parts], axis=1))
            other = ir.Value(name=f"{base}_corr")
            nodes.append(ir.node("MatMul", [extra["s"], c], outputs=[other]))
        packed = ir.Value(name=f"{base}_packed")
        nodes.append(ir.node("Add", [main_out, other], outputs=[packed]))
    graph.insert_before(gqa, nodes)
    gqa.replace_input_with(0, packed)
    gqa.replace_input_with(1, None)
    gqa.replace_input_with(2, None)
