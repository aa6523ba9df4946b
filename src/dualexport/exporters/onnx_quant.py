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
(``session.qdq_matmulnbits_accuracy_level``, default 4); the file records the level it is proven
at in its metadata, and dualexport's runner applies it (:data:`SESSION_CONFIG_KEY`).

Level 4 (``export_llm``'s default for quantized decoders, ``ExportOptions.int4_level``) is ONNX
Runtime's own fast path: :func:`float_activations` (on the ONNX target's program, a copy: the
shared program and the .pte keep the 8-bit per-token activations) has each int4 linear, and each
8-bit weight with one scale per row (the int4 scheme's head; its scale repeated per block of
:data:`INT8_BLOCK`, ``MatMulNBits``' 8-bit weight), read its float activation, which the kernel
quantizes per block of the input dim with int8 arithmetic. Measured: 10 us per 576x1536 int4
linear at level 4 against 28 at level 0; SmolLM2's 49152x576 8-bit head 0.8 ms against 4.3 ms
as the float copy level 0 folds at load (89 ms as an 8-bit ``MatMulNBits`` at level 0). The
proof runs the file with its weights prepacked (the int8 kernel needs them) against
:func:`kernel_activations`, the program quantizing those activations as the kernel does (5e-6
from the kernel on a 576-wide linear with outlier channels, where float activations are 0.22
away), so each linear is judged to a float bound (pipeline/forced_proof.py). Level 0 computes
the program's own numerics: per-token activations in the graph, float arithmetic in the kernel.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "register_torchao",
    "uses_torchao",
    "weights_for_matmulnbits",
    "float_activations",
    "kernel_activations",
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
#: The block of an 8-bit weight's ``MatMulNBits`` (its per-row scale repeated per block).
INT8_BLOCK = 32
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
    if _per_row_int8(input, block_size, quant_min, quant_max):
        # an 8-bit weight with one scale per row (the int4 scheme's head, int8's linears): a
        # DequantizeLinear whose block is the whole row, so weights_for_matmulnbits can hand it
        # to MatMulNBits' 8-bit kernel at accuracy level 4 (ONNX Runtime folds it to float at 0)
        out = op.DequantizeLinear(input, scale, zero_point, axis=1, block_size=int(block_size[1]))
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


def _per_row_int8(input: Any, block_size: Sequence[int], quant_min: Any, quant_max: Any) -> bool:
    """Whether a dequantize reads a 2-D int8 weight with one block per row (per-channel)."""
    from onnxscript import ir

    shape = getattr(input, "shape", None)
    dims = list(shape.dims) if shape is not None else []
    return (
        len(block_size) == 2
        and len(dims) == 2
        and all(isinstance(d, int) for d in dims)
        and int(block_size[0]) == 1
        and int(block_size[1]) == dims[1]
        and getattr(input, "dtype", None) == ir.DataType.INT8
        and quant_min is not None
        and quant_max is not None
        and int(quant_min) >= -128
        and int(quant_max) <= 127
        and int(quant_min) < -8
    )


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


def _kernel_weight(node: Any) -> bool:
    """Whether ``node`` is the dequantize of a 2-D weight that ``MatMulNBits`` takes at level 4:
    int4 (codes within [-8, 7], blocks along the input dim) or 8-bit with one scale per row
    and rows a whole number of :data:`INT8_BLOCK` blocks (see weights_for_matmulnbits)."""
    if not isinstance(node, torch.fx.Node) or node.target is not torch.ops.torchao.dequantize_affine.default:
        return False
    qmin, qmax = _code_range(node)
    block = node.args[1]
    val = node.meta.get("val")
    if not (
        isinstance(val, torch.Tensor) and val.dim() == 2 and isinstance(qmin, int) and isinstance(qmax, int)
    ):
        return False
    if qmin >= -8 and qmax <= 7:
        return True
    k = int(val.shape[1])
    per_row = isinstance(block, (list, tuple)) and list(block) == [1, k]
    return qmin >= -128 and qmax <= 127 and per_row and k % INT8_BLOCK == 0


def _kernel_linears(program: Any) -> list[torch.fx.Node]:
    """The linears whose weight ``MatMulNBits`` takes at level 4 and whose activation the program
    quantizes per token itself."""
    return [
        n
        for n in program.graph.nodes
        if n.target is torch.ops.aten.linear.default
        and _kernel_weight(n.args[1])
        and _quantized_activation(n.args[0]) is not None
    ]


def float_activations(program: Any) -> Any:
    """A copy of ``program`` in which each ``linear`` of a weight ``MatMulNBits`` takes at level 4
    (int4, and 8-bit per row) reads its activation
    before the program's 8-bit quantization of it (``MatMulNBits`` at accuracy level 4 quantizes
    it itself); ``program`` itself is not edited. The same program when no linear changes."""
    from ..shared_state.passes.graph_edit import copy_program

    names = [n.name for n in _kernel_linears(program)]
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


def _kernel_block(weight: torch.fx.Node) -> int:
    """The block along the input dim ``MatMulNBits`` quantizes the activation of ``weight``'s
    linear in: the weight's own block (int4: its group), :data:`INT8_BLOCK` for a per-row
    8-bit weight (weights_for_matmulnbits repeats its scale per such block)."""
    val = weight.meta["val"]
    blocks: Any = weight.args[1]
    block = int(blocks[1])
    return INT8_BLOCK if block == int(val.shape[1]) and not _int4_codes(weight) else block


def _code_range(dequantize: torch.fx.Node) -> tuple[Any, Any]:
    """A ``dequantize_affine``'s ``quant_min`` and ``quant_max``."""
    args, kwargs = dequantize.args, dequantize.kwargs
    return (
        args[5] if len(args) > 5 else kwargs.get("quant_min"),
        args[6] if len(args) > 6 else kwargs.get("quant_max"),
    )


def _int4_codes(weight: torch.fx.Node) -> bool:
    qmin, qmax = _code_range(weight)
    return isinstance(qmin, int) and isinstance(qmax, int) and qmin >= -8 and qmax <= 7


def kernel_activations(program: Any) -> Any:
    """A copy of ``program`` in which each ``linear`` that ``MatMulNBits`` takes at level 4 reads
    its float activation quantized as that kernel quantizes it: symmetric int8 per block of the
    weight's block along the input dim, scale ``amax / 127``, rounded half to even (ONNX Runtime's
    MLAS ``QuantizeARow_CompInt8``; measured against the kernel: 5e-6 apart where the float
    activations are 0.22 apart). What the level-4 .onnx computes, up to summation order, so its
    proof holds each linear to a float bound (pipeline/forced_proof.py), not to an SNR."""
    from ..shared_state.passes.graph_edit import Inserter, fake_mode_of

    ops = torch.ops.torchao
    floated = float_activations(program)
    if floated is program:
        return program
    mode = fake_mode_of(floated)
    changed = {n.name for n in _kernel_linears(program)}
    #: one quantization per activation and block (q, k and v read the same one)
    quantized: dict[tuple[torch.fx.Node, int], torch.fx.Node] = {}
    for node in list(floated.graph.nodes):
        if node.name not in changed:
            continue
        x, weight = node.args[0], node.args[1]
        key = (x, _kernel_block(weight))
        if key not in quantized:
            block = [1] * (x.meta["val"].dim() - 1) + [key[1]]
            put = Inserter(floated.graph, x, mode)
            qp = put(
                ops.choose_qparams_affine.default,
                (x, "SYMMETRIC", block, torch.int8, -127, 127, None, None, None),
            )
            scale = put(operator.getitem, (qp, 0))
            zero = put(operator.getitem, (qp, 1))
            q = put(ops.quantize_affine.default, (x, block, scale, zero, torch.int8, -127, 127))
            quantized[key] = put(
                ops.dequantize_affine.default, (q, block, scale, zero, torch.int8, -127, 127)
            )
        node.replace_input_with(x, quantized[key])
    floated.graph.lint()
    floated.graph_module.recompile()
    return floated


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
    At accuracy level 4, an 8-bit weight with one scale per row likewise, its scale repeated per
    block of :data:`INT8_BLOCK` (``MatMulNBits`` has blocks, not rows): ONNX Runtime's 8-bit
    kernel then reads 1 byte per weight where the float copy it folds at level 0 reads 4.
    Zero points that are all zero are left out (DequantizeLinear's default). Records
    ``accuracy_level`` in the model's metadata when any weight was arranged."""
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    count = 0
    notes: dict[str, str] = {}
    for node in list(model.graph):
        if _arrange_for_matmulnbits(model.graph, node, accuracy_level, notes):
            count += 1
    for node in list(model.graph):  # the 8-bit weights left: float, as level 0 computes
        if _is_per_row_int8(node):
            _per_row_as_float(node)
    RemoveUnusedNodesPass()(model)
    if count:
        model.metadata_props[SESSION_CONFIG_KEY] = json.dumps({ACCURACY_LEVEL_ENTRY: str(accuracy_level)})
    return Int4Result(count, notes)


def _is_per_row_int8(node: Any) -> bool:
    """A ``DequantizeLinear`` of a stored 2-D int8 weight whose block is the whole row."""
    import onnx_ir as ir

    if node.op_type != "DequantizeLinear" or node.domain != "" or node.attributes.get_int("axis", 1) != 1:
        return False
    codes, cast = _const(node.inputs[0])
    if codes is None or cast is not None or codes.shape is None or len(codes.shape) != 2:
        return False
    return codes.dtype == ir.DataType.INT8 and node.attributes.get_int("block_size", 0) == codes.shape[1]


def _per_row_as_float(dq: Any) -> None:
    """A per-row 8-bit weight's ``DequantizeLinear`` as ``(Cast(codes) - Cast(zp)) * scales``:
    ONNX Runtime folds that into one float32 weight at load (what level 0 computes), where it
    would run the DequantizeLinear at every call (measured: 33 ms per step for SmolLM2's head)."""
    import onnx_ir as ir

    graph = dq.graph
    x = ir.node("Cast", [dq.inputs[0]], attributes={"to": ir.DataType.FLOAT})
    steps = [x]
    if len(dq.inputs) > 2 and dq.inputs[2] is not None:
        zp = ir.node("Cast", [dq.inputs[2]], attributes={"to": ir.DataType.FLOAT})
        steps += [zp, ir.node("Sub", [x.outputs[0], zp.outputs[0]])]
    steps.append(ir.node("Mul", [steps[-1].outputs[0], dq.inputs[1]]))
    graph.insert_before(dq, steps)
    steps[-1].outputs[0].type = dq.outputs[0].type
    steps[-1].outputs[0].shape = dq.outputs[0].shape
    ir.convenience.replace_all_uses_with(dq.outputs[0], steps[-1].outputs[0])


def _arrange_for_matmulnbits(graph: Any, node: Any, accuracy_level: int, notes: dict[str, str]) -> bool:
    """One ``Transpose(DequantizeLinear(..))`` read by MatMuls, arranged as ``MatMulNBits``
    fuses it; False (nothing changed) when it is not one this pass takes."""
    import ml_dtypes
    import numpy as np
    import onnx_ir as ir

    if (
        node.op_type != "Transpose"
        or node.domain != ""
        or list(node.attributes.get_ints("perm", [])) != [1, 0]
    ):
        return False
    dq = node.inputs[0].producer() if node.inputs[0] is not None else None
    if dq is None or dq.op_type != "DequantizeLinear" or dq.attributes.get_int("axis", 1) != 1:
        return False
    block = dq.attributes.get_int("block_size", 0)
    if not block or len(dq.outputs[0].uses()) != 1:
        return False
    out_users = [u for u, _ in node.outputs[0].uses()]
    if not out_users or any(u.op_type != "MatMul" for u in out_users):
        return False
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
        return False
    c = codes.const_value.numpy()
    if c.ndim != 2:
        return False
    if cast is ir.DataType.INT4 and (c.min() < -8 or c.max() > 7):
        return False
    s = scales.const_value.numpy()
    per_row = cast is None and c.dtype == np.int8 and block == c.shape[1]
    if per_row:  # an 8-bit weight: only at level 4, rows a whole number of blocks
        if accuracy_level != 4 or c.shape[1] % INT8_BLOCK:
            return False
        block = INT8_BLOCK
        s = np.repeat(s.reshape(-1, 1), c.shape[1] // block, axis=1)
    zeros = zps is not None and not np.any(zps.const_value.numpy())
    if zps is not None and not zeros:
        return False  # non-zero zero points: not written by our quantizer; left as they are
    kn = np.ascontiguousarray(c.T).astype(ml_dtypes.int4 if cast is ir.DataType.INT4 else c.dtype)
    new_codes = _initializer(f"{codes.name}.kn", kn)
    new_scales = _initializer(f"{scales.name}.kn", np.ascontiguousarray(s.T))
    for v in (new_codes, new_scales):
        if v.name not in graph.initializers:
            graph.register_initializer(v)
    new_dq = ir.node(
        "DequantizeLinear",
        inputs=[graph.initializers[new_codes.name], graph.initializers[new_scales.name]],
        attributes={"axis": 0, "block_size": block},
        name=f"{dq.name}_kn" if dq.name else None,
    )
    graph.insert_before(node, new_dq)
    new_dq.outputs[0].shape = ir.Shape([int(c.shape[1]), int(c.shape[0])])
    new_dq.outputs[0].type = node.outputs[0].type
    ir.convenience.replace_all_uses_with(node.outputs[0], new_dq.outputs[0])
    if zeros:
        notes[zps.name] = (
            f"zero points of symmetric {'int8' if per_row else 'int4'} weights: the .onnx's DequantizeLinear "
            "uses its default (0); checked: all zero in the holder, and outputs compared with the shared program"
        )
    return True
