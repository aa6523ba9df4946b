"""torchao's quantized weights in ONNX: ``DequantizeLinear`` with int4 blocks that ONNX Runtime fuses
into ``MatMulNBits``.

Two steps, because the translation of one op does not see its consumer:

1. :func:`register_torchao` gives torch.onnx a translation of ``torchao.dequantize_affine``
   (without it the op decomposes into a dozen elementwise ops that ONNX Runtime folds back into a
   float weight). A weight's dequantize (two dims, blocks along the input dim) becomes
   ``DequantizeLinear(Cast(codes, INT4), scales, axis=1, block_size=G)``; any other (an
   activation's per-token dequantize) is written as its arithmetic, ``(x - zp) * scale``, exact.
   ``quantize_affine`` and ``choose_qparams_affine`` keep torch.onnx's decomposition (exact too).
2. :func:`weights_for_matmulnbits`, on the translated model: ``linear`` reads the weight through a
   ``Transpose``, and ONNX Runtime fuses only ``MatMul(A, DequantizeLinear(B[K, N], axis=0))``
   with constant ``B``; so the transpose moves onto the constants: the codes are stored
   transposed as ``INT4`` (two per byte) and the scales transposed, under new names (``.kn``: no
   initializer carries a weight's name with other bytes). The weight manifest finds both as
   transformed copies (permutation and encoding recorded, checked bit for bit).

The accuracy level of the fused ``MatMulNBits`` is a session option of ONNX Runtime
(``session.qdq_matmulnbits_accuracy_level``, default 4: int8 activations inside the kernel, other
numerics than the program). By default the file records level 0 (float arithmetic on the
dequantized values: what the program computes) in its metadata, and dualexport's runner applies it
(:data:`SESSION_CONFIG_KEY`).

``ExportOptions(onnx_int4_accuracy_level=4)`` asks for ONNX Runtime's own fast path instead:
:func:`float_activations` (on the ONNX target's program, a copy: the shared program and the .pte
keep the 8-bit per-token activations) has each int4 linear read its float activation, which the
kernel quantizes per block of the input dim with int8 arithmetic; the file records level 4.
Measured on a 2-layer decoder of SmolLM2-135M's shape: decode 129 tok/s at level 0 with the
activations quantized in the graph, 355 at level 4 (2.75x). The proof then runs the file with its
weights prepacked (the int8 kernel needs them; without, it computes in float) and judges it against
the program with float activations (``OnnxExporter.proof_program``), by the SNR the program's own
activation quantization keeps (parity/tolerances.py: ``quantized_tolerance``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "register_torchao",
    "uses_torchao",
    "weights_for_matmulnbits",
    "float_activations",
    "Int4Result",
    "SESSION_CONFIG_KEY",
    "ACCURACY_LEVEL_ENTRY",
    "MATMULNBITS_ACCURACY_LEVEL",
    "MIN_OPSET",
]

#: ONNX metadata key: session config entries (JSON object) a runner applies when it loads the file.
SESSION_CONFIG_KEY = "dualexport.ort_session_config"
#: ONNX Runtime's session config entry for MatMulNBits' accuracy level.
ACCURACY_LEVEL_ENTRY = "session.qdq_matmulnbits_accuracy_level"
#: The level the file is proven at: 0 computes what the shared program computes.
MATMULNBITS_ACCURACY_LEVEL = 0
#: INT4 tensors and blocked DequantizeLinear arrived in opset 21.
MIN_OPSET = 21


def uses_torchao(program: Any) -> bool:
    """Whether the program holds torchao quantization ops."""
    return any(n.op == "call_function" and str(n.target).startswith("torchao.") for n in program.graph.nodes)


def _dequantize_affine(
    input: Any,
    block_size: Sequence[int],
    scale: Any,
    zero_point: Any = None,
    input_dtype: int = 3,
    quant_min: float | None = None,
    quant_max: float | None = None,
    output_dtype: int = 1,
) -> Any:
    """``torchao.dequantize_affine``: ``(input - zero_point) * scale`` per block."""
    from onnxscript import ir
    from onnxscript.onnx_opset import opset21

    op: Any = opset21  # values are traced torch.onnx values: the opset's static types do not apply

    rank = len(block_size)
    shape = input.shape
    blocked = [i for i, b in enumerate(block_size) if b != 1]
    if (
        rank == 2
        and len(blocked) == 1
        and blocked[0] == 1
        and quant_min is not None
        and quant_max is not None
        and int(quant_min) >= -8
        and int(quant_max) <= 7
    ):
        codes = op.Cast(input, to=ir.DataType.INT4)
        zp = op.Cast(zero_point, to=ir.DataType.INT4) if zero_point is not None else None
        out = op.DequantizeLinear(codes, scale, zp, axis=1, block_size=int(block_size[1]))
        return out if output_dtype in (None, 1) else op.Cast(out, to=output_dtype)
    # Per-token (or per-tensor) parameters broadcast over their blocks: the plain arithmetic,
    # as torchao computes it (integers subtracted exactly, then scaled).
    ok = shape is not None and all(
        b == 1 or (isinstance(d, int) and b == d) or d is None or not isinstance(d, int)
        for b, d in zip(block_size, shape.dims, strict=False)
    )
    if not ok:
        raise NotImplementedError(f"torchao.dequantize_affine with block_size {list(block_size)}")

    x = op.Cast(input, to=ir.DataType.FLOAT)
    # torchao reduces the blocked dims away (keepdim=False) and views the parameters back as
    # ``input``'s shape with the blocked dims 1: the same Reshape, from the input's runtime shape
    # (the parameters' static rank is not always known to the translation).
    mask = op.Constant(value_ints=[1 if b != 1 else 0 for b in block_size])
    target = op.Where(op.Cast(mask, to=ir.DataType.BOOL), op.Constant(value_ints=[1] * rank), op.Shape(x))

    def params(v: Any) -> Any:
        return op.Reshape(op.Cast(v, to=ir.DataType.FLOAT), target)

    if zero_point is not None:
        x = op.Sub(x, params(zero_point))
    out = op.Mul(x, params(scale))
    return out if output_dtype in (None, 1) else op.Cast(out, to=output_dtype)


def register_torchao(registry: Any) -> None:
    """Add the translation of ``torchao.dequantize_affine`` to torch.onnx's ``registry`` (once)."""
    import torchao.quantization.quant_primitives  # noqa: F401  (defines torch.ops.torchao)

    target = torch.ops.torchao.dequantize_affine.default
    if not registry.is_registered(target):
        registry.register_op(target, _dequantize_affine)


def _quantized_activation(node: Any) -> Any:
    """``x`` when ``node`` is torchao's ``dequantize_affine(quantize_affine(x, ..), ..)`` (an
    activation's 8-bit quantization written into the program), else None."""
    ops = torch.ops.torchao
    if not isinstance(node, torch.fx.Node) or node.target is not ops.dequantize_affine.default:
        return None
    q = node.args[0]
    if not isinstance(q, torch.fx.Node) or q.target is not ops.quantize_affine.default:
        return None
    x = q.args[0]
    return x if isinstance(x, torch.fx.Node) else None


def _int4_weight(node: Any) -> bool:
    """Whether ``node`` is the dequantize of a 2-D int4 weight (codes within [-8, 7])."""
    if not isinstance(node, torch.fx.Node) or node.target is not torch.ops.torchao.dequantize_affine.default:
        return False
    qmin = node.args[5] if len(node.args) > 5 else node.kwargs.get("quant_min")
    qmax = node.args[6] if len(node.args) > 6 else node.kwargs.get("quant_max")
    val = node.meta.get("val")
    return (
        isinstance(val, torch.Tensor)
        and val.dim() == 2
        and isinstance(qmin, int)
        and isinstance(qmax, int)
        and qmin >= -8
        and qmax <= 7
    )


def float_activations(program: Any) -> Any:
    """A copy of ``program`` in which each ``linear`` of an int4 weight reads its activation
    before the program's 8-bit quantization of it (``MatMulNBits`` at accuracy level 4 quantizes
    it itself); ``program`` itself is not edited. The same program when no linear changes."""
    from .xnnpack_attention import copy_program

    names = [
        n.name
        for n in program.graph.nodes
        if n.target is torch.ops.aten.linear.default
        and _int4_weight(n.args[1])
        and _quantized_activation(n.args[0]) is not None
    ]
    if not names:
        return program
    new = copy_program(program)
    by_name = {n.name: n for n in new.graph.nodes}
    for name in names:
        node = by_name[name]
        node.replace_input_with(node.args[0], _quantized_activation(node.args[0]))
    new.graph.eliminate_dead_code()
    new.graph.lint()
    new.graph_module.recompile()
    return new


# --------------------------------------------------------------------------- the ONNX model pass
@dataclass(frozen=True)
class Int4Result:
    """What :func:`weights_for_matmulnbits` did: how many weights it arranged for ``MatMulNBits``,
    and why the zero points it dropped are not stored (the manifest's reason)."""

    weights: int = 0
    notes: dict[str, str] = field(default_factory=dict)


def _const(value: Any) -> Any:
    """The initializer behind ``value`` (directly, or through a ``Cast`` to INT4), and the cast's
    target type; (None, None) when it is not a stored constant."""
    import onnx_ir as ir

    if value is None:
        return None, None
    if value.is_initializer() and value.const_value is not None:
        return value, None
    node = value.producer()
    if node is not None and node.op_type == "Cast" and node.domain == "":
        src = node.inputs[0]
        to = node.attributes.get_int("to")
        if src is not None and src.is_initializer() and src.const_value is not None and to is not None:
            return src, ir.DataType(to)
    return None, None


def _initializer(name: str, array: Any) -> Any:
    """A typed, shaped initializer value (onnx_ir skips serializing an untyped one)."""
    import onnx_ir as ir

    tensor = ir.tensor(array, name=name)
    return ir.Value(
        name=name,
        const_value=tensor,
        type=ir.TensorType(tensor.dtype),
        shape=ir.Shape([int(d) for d in array.shape]),
    )


def weights_for_matmulnbits(model: Any, accuracy_level: int = MATMULNBITS_ACCURACY_LEVEL) -> Int4Result:
    """``Transpose(DequantizeLinear(Cast(codes[N,K], INT4), scales[N,K/G], axis=1))`` read by
    ``MatMul`` -> ``DequantizeLinear(codes_kn[K,N] INT4, scales_kn[K/G,N], axis=0)``, in place.
    Zero points that are all zero are left out (DequantizeLinear's default). Records
    ``accuracy_level`` in the model's metadata when any weight was arranged."""
    import ml_dtypes
    import numpy as np
    import onnx_ir as ir

    graph = model.graph
    count = 0
    notes: dict[str, str] = {}
    for node in list(graph):
        if (
            node.op_type != "Transpose"
            or node.domain != ""
            or list(node.attributes.get_ints("perm", [])) != [1, 0]
        ):
            continue
        dq = node.inputs[0].producer() if node.inputs[0] is not None else None
        if dq is None or dq.op_type != "DequantizeLinear" or dq.attributes.get_int("axis", 1) != 1:
            continue
        block = dq.attributes.get_int("block_size", 0)
        if not block or len(dq.outputs[0].uses()) != 1:
            continue
        out_users = [u for u, _ in node.outputs[0].uses()]
        if not out_users or any(u.op_type != "MatMul" for u in out_users):
            continue
        codes, cast = _const(dq.inputs[0])
        scales, _ = _const(dq.inputs[1])
        zp_in = dq.inputs[2] if len(dq.inputs) > 2 else None
        zps, _ = _const(zp_in)
        if (
            codes is None
            or scales is None
            or cast not in (ir.DataType.INT4, None)
            or (zp_in is not None and zps is None)
        ):
            continue
        c = codes.const_value.numpy()
        if c.ndim != 2 or (cast is ir.DataType.INT4 and (c.min() < -8 or c.max() > 7)):
            continue
        zeros = zps is not None and not np.any(zps.const_value.numpy())
        if zps is not None and not zeros:
            continue  # non-zero zero points: not written by our quantizer; left as they are
        kn = np.ascontiguousarray(c.T).astype(ml_dtypes.int4 if cast is ir.DataType.INT4 else c.dtype)
        new_codes = _initializer(f"{codes.name}.kn", kn)
        new_scales = _initializer(f"{scales.name}.kn", np.ascontiguousarray(scales.const_value.numpy().T))
        for v in (new_codes, new_scales):
            if v.name not in graph.initializers:
                graph.register_initializer(v)
        new_codes = graph.initializers[new_codes.name]
        new_scales = graph.initializers[new_scales.name]
        new_dq = ir.node(
            "DequantizeLinear",
            inputs=[new_codes, new_scales],
            attributes={"axis": 0, "block_size": block},
            name=f"{dq.name}_kn" if dq.name else None,
        )
        graph.insert_before(node, new_dq)
        new_dq.outputs[0].shape = ir.Shape([int(c.shape[1]), int(c.shape[0])])
        new_dq.outputs[0].type = node.outputs[0].type
        ir.convenience.replace_all_uses_with(node.outputs[0], new_dq.outputs[0])
        if zeros:
            notes[zps.name] = (
                "zero points of symmetric int4 weights: the .onnx's DequantizeLinear uses its default "
                "(0); checked: all zero in the holder, and outputs compared with the shared program"
            )
        count += 1
    if count:
        from onnx_ir.passes.common import RemoveUnusedNodesPass

        RemoveUnusedNodesPass()(model)
        model.metadata_props[SESSION_CONFIG_KEY] = json.dumps({ACCURACY_LEVEL_ENTRY: str(accuracy_level)})
    return Int4Result(count, notes)
