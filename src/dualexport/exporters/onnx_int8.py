"""int8-dynamic linear layers in the form ONNX Runtime fuses into its integer kernels.

The shared program computes a dynamically quantized linear as PT2E writes it:
``choose_qparams.tensor(x)`` -> ``quantize_per_tensor.tensor`` -> ``dequantize_per_tensor.tensor``
-> ``linear(., dequantize_per_channel(W_int8, scale, zero_point), bias)``. torch.onnx has no
translation for ``choose_qparams``, and a QDQ form with run-time scales is not what ONNX Runtime
fuses. In the ONNX target's decomposed program (a per-target pass: the shared program is not
touched) each such group becomes one call of ``dualexport::dynamic_int8_linear``, whose eager
kernel is the very same PT2E ops (so the decomposed program computes what the shared one does),
and whose ONNX translation is ONNX Runtime's own ``quantize_dynamic`` form:

    DynamicQuantizeLinear(x) -> (x_u8, x_scale, x_zp)
    MatMulInteger(x_u8, Transpose(W_int8), x_zp, Cast(zero_point, int8)) -> Cast(float)
    Mul(., Mul(x_scale, scale)) -> Add(., bias)

which ONNX Runtime rewrites at load into ``MatMulIntegerToFloat`` and then
``DynamicQuantizeMatMul`` (one kernel: quantize the activation per tensor, u8s8 GEMM, scale).
``DynamicQuantizeLinear`` computes uint8 parameters over ``[min(x, 0), max(x, 0)] / 255``,
exactly ``choose_qparams.tensor``'s int8 ones shifted by 128 (the shared program's eps is
float32's, see shared_state/quantizer.py). The int8 codes, scales and zero points stay the
program's own initializers, byte for byte (the ONNX pipeline leaves the Transpose and the Cast of
stored int8 tensors to ONNX Runtime, exporters/onnx_passes.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram

from ..shared_state.passes.graph_edit import replace_all_uses

__all__ = ["fuse_dynamic_linears", "register_int8_translations", "FUSED_DYNAMIC_OP"]

_QD = torch.ops.quantized_decomposed


@torch.library.custom_op("dualexport::dynamic_int8_linear", mutates_args=())
def _dynamic_int8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor,
    bias: torch.Tensor | None,
    weight_qmin: int,
    weight_qmax: int,
    eps: float,
) -> torch.Tensor:
    scale, zero_point = _QD.choose_qparams.tensor(x, -128, 127, eps, torch.int8)
    q = _QD.quantize_per_tensor.tensor(x, scale, zero_point, -128, 127, torch.int8)
    dq = _QD.dequantize_per_tensor.tensor(q, scale, zero_point, -128, 127, torch.int8)
    w = _QD.dequantize_per_channel.default(
        weight, weight_scale, weight_zero_point, 0, weight_qmin, weight_qmax, torch.int8
    )
    return torch.nn.functional.linear(dq, w, bias)


@_dynamic_int8_linear.register_fake
def _(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor,
    bias: torch.Tensor | None,
    weight_qmin: int,
    weight_qmax: int,
    eps: float,
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


FUSED_DYNAMIC_OP = torch.ops.dualexport.dynamic_int8_linear.default


def _is(node: Any, op: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target == op


def _match(linear: torch.fx.Node) -> tuple[Any, ...] | None:
    """The pieces of a PT2E dynamic linear ending at ``linear``, or None."""
    act: Any = linear.args[0]
    weight: Any = linear.args[1]
    bias = linear.args[2] if len(linear.args) > 2 else None
    if not (_is(act, _QD.dequantize_per_tensor.tensor) and _is(weight, _QD.dequantize_per_channel.default)):
        return None
    q, scale, zp = act.args[0], act.args[1], act.args[2]
    if not _is(q, _QD.quantize_per_tensor.tensor) or q.args[1] is not scale or q.args[2] is not zp:
        return None
    x = q.args[0]
    if not (isinstance(scale, torch.fx.Node) and scale.op == "call_function" and scale.args):
        return None
    choose: Any = scale.args[0]
    if not _is(choose, _QD.choose_qparams.tensor) or choose.args[0] is not x:
        return None
    if tuple(act.args[3:6]) != (-128, 127, torch.int8) or tuple(choose.args[1:3]) != (-128, 127):
        return None
    w, w_scale, w_zp, axis, qmin, qmax, dtype = weight.args[:7]
    if axis != 0 or dtype != torch.int8:
        return None
    return x, w, w_scale, w_zp, bias, qmin, qmax, float(choose.args[3])


def fuse_dynamic_linears(program: ExportedProgram) -> int:
    """Replace every PT2E dynamic linear of ``program`` (the ONNX target's decomposed program) by
    one ``dualexport::dynamic_int8_linear`` call, in place; the number replaced."""
    graph = program.graph_module.graph
    count = 0
    for node in list(graph.nodes):
        if not _is(node, torch.ops.aten.linear.default):
            continue
        parts = _match(node)
        if parts is None:
            continue
        with graph.inserting_before(node):
            fused = graph.call_function(FUSED_DYNAMIC_OP, parts)
        fused.meta.update(node.meta)
        replace_all_uses(program, node, fused)  # an output keeps its producer's name
        graph.erase_node(node)
        count += 1
    if count:
        graph.eliminate_dead_code()
        program.graph_module.recompile()
    return count


def _translation() -> Any:
    from onnx import TensorProto
    from onnxscript import opset18 as op

    def dynamic_int8_linear(
        x: Any,
        weight: Any,
        weight_scale: Any,
        weight_zero_point: Any,
        bias: Any = None,
        weight_qmin: int = -127,
        weight_qmax: int = 127,
        eps: float = 0.0,
    ) -> Any:
        x_q, x_scale, x_zero_point = op.DynamicQuantizeLinear(x)
        acc = op.MatMulInteger(
            x_q,
            op.Transpose(weight, perm=[1, 0]),
            x_zero_point,
            op.Cast(weight_zero_point, to=TensorProto.INT8),
        )
        y = op.Mul(op.Cast(acc, to=TensorProto.FLOAT), op.Mul(x_scale, weight_scale))
        return y if bias is None else op.Add(y, bias)

    return dynamic_int8_linear


def register_int8_translations(registry: Any) -> Any:
    """Add the translation of ``dualexport::dynamic_int8_linear`` to torch.onnx's ``registry``."""
    registry.register_op(FUSED_DYNAMIC_OP, _translation())
    return registry
