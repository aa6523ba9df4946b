"""The PT2E quantizer dualexport runs on the shared program: ExecuTorch's XNNPACKQuantizer with the
integer subgraphs of a model kept out of quantization.

Why a subclass: ``XNNPACKQuantizer.transform_for_annotation`` turns *every* scalar argument of an
``add.Tensor``/``mul.Tensor`` into a float32 tensor attribute (so that a float scalar can carry
an observer). On transformers models many of those adds are integer arithmetic: position ids
(``arange(S) + past_length``), the mask's index arithmetic (``arange(S) + 0`` feeding
``aten.index``), Swin's window indices. After the rewrite ``int64 + float32 tensor`` computes a
float, and the first consumer that needs integers fails (``IndexError: tensors used as indices
must be long, int, byte or bool tensors``, ``Expected: Long, Got: float``, embedding indices
"got torch.FloatTensor"). No observer ever sits on those integers: the annotators already skip
non-float inputs. The fix is at the root: only floating-point nodes get their scalars turned
into attributes, and a filter keeps every node with a non-float input or output unannotated.
``tests/test_int8_families.py`` keeps a strict xfail showing plain PT2E failing on BERT.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from torchao.quantization.pt2e import PlaceholderObserver
from torchao.quantization.pt2e.utils import get_new_attr_name_with_prefix

from ..compat.torch import is_annotated

__all__ = [
    "one_dynamic_quantization_per_linear",
    "share_through_moves",
    "IntegerSafeQuantizer",
    "make_quantizer",
    "float_scalars_to_attrs",
    "is_float_node",
]

_SCALAR_OPS = (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def is_float_node(node: torch.fx.Node) -> bool:
    """Whether a node computes a floating-point tensor (tuples: every tensor in it)."""
    val = _val(node)
    vals = val if isinstance(val, (tuple, list)) else (val,)
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    return bool(tensors) and all(t.dtype.is_floating_point for t in tensors)


def float_scalars_to_attrs(model: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """ExecuTorch's ``_convert_scalars_to_attrs`` restricted to floating-point adds and muls: an
    integer ``arange + k`` keeps its integer scalar (and its integer result)."""
    for n in model.graph.nodes:
        if n.op != "call_function" or n.target not in _SCALAR_OPS or not is_float_node(n):
            continue
        new_args = []
        for arg in n.args:
            if isinstance(arg, torch.fx.Node) or not isinstance(arg, (int, float)):
                new_args.append(arg)
                continue
            name = get_new_attr_name_with_prefix("_tensor_constant_")(model)
            value = torch.tensor(float(arg))
            model.register_buffer(name, value)
            with model.graph.inserting_before(n):
                attr = model.graph.create_node("get_attr", name, (), {})
            attr.meta["val"] = n.meta["val"].fake_mode.from_tensor(value, static_shapes=True)
            new_args.append(attr)
        n.args = tuple(new_args)
    model.recompile()
    return model


#: Ops whose input needs relative precision: a fixed-point grid over the whole tensor rounds a
#: small variance to a few levels (or to zero), and the reciprocal square root amplifies it.
_RELATIVE = frozenset(
    {
        torch.ops.aten.rsqrt.default,
        torch.ops.aten.sqrt.default,
        torch.ops.aten.reciprocal.default,
        torch.ops.aten.log.default,
    }
)


def feeds_relative_op(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a normalization's statistic: it feeds rsqrt/sqrt/reciprocal/log, or
    is the divisor of a division (RMSNorm's ``mean(x*x) + eps``; a tiny Llama's int8 reference
    measured 18 dB against float with it quantized, 25 dB without)."""
    for user in node.users:
        if user.op != "call_function":
            continue
        if user.target in _RELATIVE:
            return True
        if user.target in (torch.ops.aten.div.Tensor, torch.ops.aten.div.Tensor_mode):
            if len(user.args) > 1 and user.args[1] is node:
                return True
    return False


#: elementwise ops whose constant operand the quantizer would observe as an activation
_ELEMENTWISE = frozenset(
    {
        torch.ops.aten.add.Tensor,
        torch.ops.aten.mul.Tensor,
        torch.ops.aten.sub.Tensor,
        torch.ops.aten.div.Tensor,
    }
)


def weight_operand(node: torch.fx.Node) -> bool:
    """Whether ``node`` is an elementwise op with a constant operand (a norm's gain, a scalar
    turned into an attribute). Why it stays in float: the quantizer observes that operand as an
    activation, per tensor, and a HistogramObserver on a constant is degenerate (RMSNorm's
    all-ones gain: scale 1/255, zero point 0, so the gain clips to 0.5); XNNPACK's static mul
    then computes yet another value (measured: a tiny Llama's static int8 .pte at cosine 0.76
    against its own quantized program, 1.0 with those muls in float)."""
    if node.op != "call_function" or node.target not in _ELEMENTWISE:
        return False
    return any(isinstance(a, torch.fx.Node) and a.op == "get_attr" for a in node.args)


def _annotatable(node: torch.fx.Node, sentinels: set[str]) -> bool:
    """The filter the annotators ask about every node of a pattern: only float computations,
    none of whose values holds a sentinel, that are not a normalization's statistic and have no
    constant operand (``weight_operand``)."""
    if node.op == "call_function" and (
        not is_float_node(node) or node.name in sentinels or feeds_relative_op(node) or weight_operand(node)
    ):
        return False
    inputs = [a for a in node.all_input_nodes if a.op == "call_function" and _val(a) is not None]
    return all(is_float_node(a) and a.name not in sentinels for a in inputs)


#: Magnitude past which a value is a sentinel, not data: ExecuTorch's quantizer leaves a scalar
#: this large unquantized (``_is_input_large_scalar``, the HistogramObserver's bound).
SENTINEL = 3.4028235e15


def sentinel_nodes(model: torch.fx.GraphModule, sets: Sequence[tuple[Any, ...]]) -> set[str]:
    """Nodes whose value, on any of ``sets``, holds a sentinel (|x| >= SENTINEL or inf): an
    additive attention mask (``finfo.min`` where a position is masked), a position bias with
    the mask added in. Why: per-tensor int8 spreads 256 levels over the whole range, so with a
    -3.4e38 in it every real attention score rounds to the zero point and softmax averages
    (measured: a tiny Llama's int8 reference at 18 dB against float, T5's at 9.5 dB)."""
    found: set[str] = set()

    class _Scan(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            out = super().run_node(n)
            if isinstance(out, torch.Tensor) and out.dtype.is_floating_point and out.numel():
                if bool((out.abs() >= SENTINEL).any()):
                    found.add(n.name)
            return out

    with torch.no_grad():
        for args in sets:
            _Scan(model).run(*args)
    return found


#: Value-moving ops whose output must keep its input's quantization that ExecuTorch's
#: ``propagate_annotation`` misses in the pre-dispatch ATen it is run on (it lists
#: ``slice_copy``, not ``slice.Tensor``).
_MOVES = frozenset(
    {
        torch.ops.aten.slice.Tensor,
        torch.ops.aten.select.int,
        torch.ops.aten.squeeze.dims,
        torch.ops.aten.squeeze.default,
        torch.ops.aten.unsqueeze.default,
    }
)


def share_through_moves(model: torch.fx.GraphModule) -> None:
    """Give each slice/select/(un)squeeze of a quantized value its input's quantization.

    Why: left unannotated, a slice between a quantized value and a ``cat`` gets the cat's
    parameters on its output, and XNNPACK's partitioner delegates it as a quantized slice whose
    input and output scales differ, which XNNPACK refuses when the program loads ("Failed to
    create static slice node ... xnn_status_invalid_parameter": every int8 Llama, at
    ``rotate_half``). Sharing makes the slice exact in int8."""
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, SharedQuantizationSpec
    from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

    for n in model.graph.nodes:
        if n.op != "call_function" or n.target not in _MOVES or not isinstance(n.args[0], torch.fx.Node):
            continue
        prev = n.args[0]
        prev_annotation = prev.meta.get(Q_ANNOTATION_KEY)
        if prev_annotation is None or prev_annotation.output_qspec is None:
            continue
        if is_annotated(n.meta.get(Q_ANNOTATION_KEY)):
            continue
        shared = SharedQuantizationSpec(prev)
        n.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
            input_qspec_map={prev: shared}, output_qspec=shared, _annotated=True
        )


def _copy_chain(graph: torch.fx.Graph, chain: list[torch.fx.Node], before: torch.fx.Node) -> dict[Any, Any]:
    """Copies of ``chain`` (in order) inserted before ``before``, reading each other's copies."""
    mapping: dict[Any, Any] = {}
    with graph.inserting_before(before):
        for old in chain:
            mapping[old] = graph.node_copy(old, lambda a: mapping.get(a, a))
    return mapping


def one_dynamic_quantization_per_linear(model: torch.fx.GraphModule) -> int:
    """Give every dynamically quantized linear its own ``choose_qparams -> quantize ->
    dequantize`` chain (PT2E shares one among the linears that read the same value: attention's
    q/k/v projections); the number of chains added.

    Why: ExecuTorch's XNNPACK partitioner takes a dynamic linear with its own chain; a shared
    one leaves the chain's ``getitem`` outputs outside the delegate and splits it (a tiny BERT:
    3 subgraphs instead of 1, Llama 5). ONNX Runtime quantizes the activation inside each
    ``DynamicQuantizeMatMul`` anyway. The values are the same: each chain computes the same
    parameters from the same input."""
    qd = torch.ops.quantized_decomposed
    added = 0
    graph = model.graph
    for dq in list(graph.nodes):
        if dq.op != "call_function" or dq.target != qd.dequantize_per_tensor.tensor or len(dq.users) < 2:
            continue
        q = dq.args[0]
        scale = dq.args[1]
        if not (isinstance(q, torch.fx.Node) and isinstance(scale, torch.fx.Node) and scale.args):
            continue
        choose = scale.args[0]
        if not (isinstance(choose, torch.fx.Node) and choose.target == qd.choose_qparams.tensor):
            continue
        chain = [choose, *[u for u in choose.users], q, dq]  # choose, getitems, q, dq
        for user in list(dq.users)[1:]:
            user.replace_input_with(dq, _copy_chain(graph, chain, user)[dq])
            added += 1
    if added:
        graph.lint()
        model.recompile()
    return added


#: Ops the dynamic scheme leaves in float although XNNPACK could quantize them dynamically:
#: ONNX Runtime has no int8-weight dynamic convolution (ConvInteger takes uint8 weights).
_DYNAMIC_SKIPPED = frozenset(
    {
        torch.ops.aten.conv1d.default,
        torch.ops.aten.conv2d.default,
        torch.ops.aten.convolution.default,
        torch.ops.aten.conv_transpose1d.default,
        torch.ops.aten.conv_transpose2d.input,
    }
)


class IntegerSafeQuantizer(XNNPACKQuantizer):
    """XNNPACKQuantizer that never turns integer arithmetic into float and leaves values that
    hold sentinels (masks) in float (see the module doc)."""

    def __init__(self, scan_sets: Sequence[tuple[Any, ...]] = (), *, linear_only: bool = False) -> None:
        super().__init__()
        self.scan_sets = list(scan_sets)
        self.linear_only = linear_only
        self.left_float: set[str] = set()
        self._graph: torch.fx.Graph | None = None

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        model = float_scalars_to_attrs(model)
        self.left_float = sentinel_nodes(model, self.scan_sets) if self.scan_sets else set()
        self._graph = model.graph
        return model

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils import propagate_annotation

        model = super().annotate(model)
        for _ in range(3):  # chains of moves: select -> view -> slice
            share_through_moves(model)
            propagate_annotation(model)
        return model

    def accepts(self, node: torch.fx.Node) -> bool:
        """The annotation filter (see ``_annotatable``); with ``linear_only`` (int8-dynamic)
        only linear layers."""
        if self.linear_only and node.op == "call_function" and node.target != torch.ops.aten.linear.default:
            return False
        return _annotatable(node, self.left_float)

    def reasons(self) -> dict[str, str]:
        """Why each float node this quantizer refused stays in float (for the manifest)."""
        out: dict[str, str] = {}
        for node in self._graph.nodes if self._graph is not None else ():
            if node.op != "call_function" or not is_float_node(node):
                continue
            if node.name in self.left_float:
                out[node.name] = f"holds a sentinel (|x| >= {SENTINEL:.3g}: an additive mask)"
            elif feeds_relative_op(node):
                out[node.name] = "a normalization statistic (feeds rsqrt/sqrt/reciprocal/log or a divisor)"
            elif weight_operand(node):
                out[node.name] = (
                    "a constant operand (a norm's gain, a scalar): per-tensor observers on constants degenerate"
                )
            elif any(a.name in self.left_float for a in node.all_input_nodes):
                out[node.name] = "an input holds a sentinel (an additive mask)"
            elif self.linear_only and node.target in _DYNAMIC_SKIPPED:
                out[node.name] = "int8-dynamic quantizes linear layers only"
        return out


def make_quantizer(
    *, dynamic: bool, weight_qmax: int, scan_sets: Sequence[tuple[Any, ...]] = ()
) -> IntegerSafeQuantizer:
    """Symmetric per-channel int8 weights in ``[-weight_qmax, weight_qmax]``; activations static
    per-tensor int8 (calibrated) or, with ``dynamic``, quantized at run time. ``scan_sets``:
    positional argument tuples the float graph runs on to find sentinel values."""
    config = get_symmetric_quantization_config(
        is_per_channel=True, is_dynamic=dynamic, weight_qmin=-weight_qmax, weight_qmax=weight_qmax
    )
    if dynamic:
        # eps: the smallest scale; float32's epsilon instead of ExecuTorch's 2**-12, so that
        # eager matches ONNX Runtime's DynamicQuantizeLinear (which has none) on small activations
        act = config.input_activation
        ctr = PlaceholderObserver.with_args(eps=torch.finfo(torch.float32).eps)
        config = dataclasses.replace(
            config, input_activation=dataclasses.replace(act, observer_or_fake_quant_ctr=ctr)
        )
    quantizer = IntegerSafeQuantizer(scan_sets, linear_only=dynamic)
    quantizer.set_global(config)
    quantizer.set_filter_function(quantizer.accepts)
    return quantizer
