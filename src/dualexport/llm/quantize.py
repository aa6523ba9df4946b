"""Weight quantization of a decoder's shared program: one set of codes and scales for both files.

``quantize_linears(program, scheme)`` rewrites every ``linear`` whose weight is a parameter into
torchao's dynamically quantized form (what ExecuTorch's XNNPACK partitioner lowers to its
``qd8-f32-qb4w`` / ``qc8w`` kernels, and what ``exporters/onnx_quant.py`` writes as
``DequantizeLinear`` that ONNX Runtime fuses into ``MatMulNBits``)::

    scale_x, zp_x = torchao.choose_qparams_affine(x, "ASYMMETRIC", [1, .., K], int8)   # per token
    x_dq = torchao.dequantize_affine(torchao.quantize_affine(x, ...), ...)
    w_dq = torchao.dequantize_affine(codes, [1, G], scales, zero_points, int8, qmin, qmax)
    y = linear(x_dq, w_dq, bias)

The codes (int8 storage, ``[-8, 7]`` for int4), scales and zero points are new buffers of the
shared program (the state_dict the weight proof reads); the float weight leaves the program unless
another op still reads it (a tied embedding). Both targets compute exactly this graph: the .pte
with XNNPACK's dynamic-quantization kernels, the .onnx with the same activation quantization
written out and ``MatMulNBits`` at accuracy level 0 (fp32 arithmetic on the dequantized values).

Why the scales are bfloat16 values: XNNPACK stores group scales as bfloat16
(``node_visitor.get_quant_params``), so fp32 scales silently become other scales in the .pte
(measured: 48 dB against eager instead of 135 dB). Scales chosen in bfloat16 are stored exactly
by both files, and the manifest can prove the .pte's copy bit for bit.

Why a rewrite of the traced program and not torchao's ``quantize_`` on the model: the model is
traced once (invariant 1), the user's module is not touched, and the result is an ordinary
program transform, recorded like any other.

The interface a unified quantizer needs is :class:`WeightScheme` (what a scheme is) and
:func:`quantize_weight` (one tensor -> codes, scales, zero points); the graph rewrite is specific
to ``linear`` with dynamic activations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind

from ..compat.torch import detect_fake_mode, set_graph_signature
from ..errors import InputError
from ..shared_state.passes.graph_edit import replace_all_uses

__all__ = [
    "WeightScheme",
    "SCHEMES",
    "QuantizedWeight",
    "quantize_weight",
    "quantize_linears",
    "quantization_transform",
    "quantized_weights",
    "FLOAT_LINEARS_KEY",
    "QuantizationSummary",
    "quantization_summary",
]

logger = logging.getLogger(__name__)
aten = torch.ops.aten
#: ``graph_module.meta`` key: the linears' weights the scheme left in float32, and why
FLOAT_LINEARS_KEY = "dualexport_float_linears"


@dataclass(frozen=True)
class WeightScheme:
    """A weight quantization: ``bits`` per code (stored in int8), one scale per ``group_size``
    inputs of an output channel (None: one per output channel), scales rounded to ``scale_dtype``
    values; activations quantized dynamically per token to int8 (asymmetric).

    ``asymmetric``: each group's grid spans its own minimum to maximum (``w ~ m + d * q``, q in
    0..2^bits-1) instead of a grid symmetric about zero. The kernels both runtimes fuse take
    symmetric codes only (XNNPACK's qb4w has no zero points), so the program writes
    ``w = d * (q - 2^(bits-1)) + c`` with ``c = m + 2^(bits-1) * d`` per group: the symmetric
    product the kernel runs, plus ``c`` times the group sums of the input (two small float
    linears, :func:`quantize_linears`). Why: a 4-bit GGUF (Q4_1: a scale and a minimum per group
    of 32) is held exactly by such a grid, where a symmetric one re-rounds every weight; on
    SmolLM2-135M-Instruct the mean NLL of a real text rises by 0.69 with the symmetric grid and by
    0.13 with this one (docs/quantization.md).

    ``head``: the scheme of the output head (a linear whose result the program returns as it is:
    the logits), None for this scheme. The head of a real model holds outliers a 4-bit grid
    cannot (SmolLM2's tied 49152 x 576 embedding is not a 4-bit GGUF tensor): 8-bit per channel
    there costs 14 MB and takes most of what remains of the NLL rise (0.13 -> 0.04)."""

    name: str
    bits: int
    group_size: int | None
    scale_dtype: torch.dtype = torch.bfloat16
    asymmetric: bool = False
    head: str | None = None

    @property
    def qmin(self) -> int:
        return -(1 << (self.bits - 1))

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    def block(self, in_features: int) -> list[int]:
        return [1, self.group_size or in_features]

    def accepts(self, weight: torch.Tensor) -> bool:
        return (
            weight.dim() == 2
            and weight.dtype == torch.float32
            and (self.group_size is None or weight.shape[1] % self.group_size == 0)
        )

    @property
    def offset(self) -> int:
        """The code of a group's minimum is ``-offset`` (asymmetric grids)."""
        return 1 << (self.bits - 1)

    def describe(self) -> str:
        groups = f"group {self.group_size}" if self.group_size else "per channel"
        grid = "asymmetric (group offsets)" if self.asymmetric else "symmetric"
        head = f"; output head {self.head}" if self.head else ""
        return f"{self.name}: {grid} {self.bits}-bit weights ({groups}, bf16 scales), dynamic int8 activations{head}"


#: ``quantize=`` values of ``export_llm``.
#: ``int4`` holds real weights: group offsets (an asymmetric grid per group of 32, which a 4-bit
#: GGUF's Q4_1 groups are) and an 8-bit head; on SmolLM2-135M-Instruct its mean NLL on a real text
#: rises by 0.040 over fp32, where torchao's 8da4w rises by 0.728 (docs/quantization.md).
#: ``int4-sym`` is the fast one (symmetric, every linear 4-bit, no offsets): 2.3-2.6x the decode
#: speed of ``int4`` on an 8-layer SmolLM2-shaped decoder, and the NLL rise of 8da4w (0.693).
SCHEMES: dict[str, WeightScheme] = {
    "int4": WeightScheme("int4", 4, 32, asymmetric=True, head="int8"),
    "int4-sym": WeightScheme("int4-sym", 4, 32),
    "int8": WeightScheme("int8", 8, None),
}


@dataclass(frozen=True)
class QuantizedWeight:
    """``codes`` int8 ``[N, K]``, ``scales`` float32 ``[N, K / group]`` (values of
    ``scheme.scale_dtype``), ``zero_points`` int8 zeros of the scales' shape (symmetric; the
    form torchao and XNNPACK's partitioner expect)."""

    codes: torch.Tensor
    scales: torch.Tensor
    zero_points: torch.Tensor
    #: float32 ``[N, K / group]``: each group's offset ``c`` (asymmetric schemes), else None
    offsets: torch.Tensor | None = None

    def dequantize(self, group: int) -> torch.Tensor:
        n, k = self.codes.shape
        blocks = self.codes.float().view(n, -1, group) - self.zero_points.float().unsqueeze(-1)
        blocks = blocks * self.scales.unsqueeze(-1)
        if self.offsets is not None:
            blocks = blocks + self.offsets.unsqueeze(-1)
        return blocks.view(n, k)


def quantize_weight(weight: torch.Tensor, scheme: WeightScheme) -> QuantizedWeight:
    """torchao's symmetric affine quantization of ``weight`` ``[N, K]``, with the scales rounded
    to ``scheme.scale_dtype`` before the codes are computed (the codes are the nearest levels of
    the scales the files store)."""
    from torchao.quantization.quant_primitives import (
        MappingType,
        choose_qparams_affine,
        quantize_affine,
    )

    w = weight.detach().float()
    block = scheme.block(w.shape[1])
    if scheme.asymmetric:
        return _quantize_asymmetric(w, scheme)
    scale, zp = choose_qparams_affine(
        w,
        MappingType.SYMMETRIC,
        block,
        torch.int8,
        scheme.qmin,
        scheme.qmax,
        scale_dtype=torch.float32,
        zero_point_dtype=torch.int8,
    )
    scale = scale.to(scheme.scale_dtype).float().view(w.shape[0], -1).contiguous()
    zp = torch.zeros_like(scale, dtype=torch.int8)
    codes = quantize_affine(w, block, scale, zp, torch.int8, scheme.qmin, scheme.qmax)
    return QuantizedWeight(codes.contiguous(), scale, zp)


def _quantize_asymmetric(w: torch.Tensor, scheme: WeightScheme) -> QuantizedWeight:
    """Each group's grid from its minimum ``m`` to its maximum: ``d = (max - m) / (2^bits - 1)``
    rounded to a ``scale_dtype`` value, ``q = round((w - m) / d)``; stored as symmetric codes
    ``q - offset`` with scale ``d`` and the group offset ``c = m + offset * d`` (float32)."""
    n, k = w.shape
    group = scheme.group_size or k
    blocks = w.view(n, k // group, group)
    low, high = blocks.amin(-1), blocks.amax(-1)
    levels = (1 << scheme.bits) - 1
    scale = ((high - low) / levels).to(scheme.scale_dtype).float()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant group: any scale
    q = torch.round((blocks - low.unsqueeze(-1)) / scale.unsqueeze(-1)).clamp(0, levels)
    codes = (q - scheme.offset).to(torch.int8).view(n, k)
    offsets = (low + scheme.offset * scale).contiguous()
    return QuantizedWeight(
        codes.contiguous(), scale.contiguous(), torch.zeros_like(scale, dtype=torch.int8), offsets
    )


# ------------------------------------------------------------------------------ the rewrite
def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _fake_mode(program: ExportedProgram) -> Any:
    vals = [_val(n) for n in program.graph.nodes if n.op == "placeholder"]
    return detect_fake_mode(v for v in vals if isinstance(v, torch.Tensor))


def _call(
    graph: torch.fx.Graph, mode: Any, op: Any, args: tuple[Any, ...], like: torch.fx.Node
) -> torch.fx.Node:
    node = graph.call_function(op, args)
    node.meta.update({k: v for k, v in like.meta.items() if k in ("stack_trace", "nn_module_stack")})
    vals = tuple(_val(a) if isinstance(a, torch.fx.Node) else a for a in args)
    with mode:
        node.meta["val"] = op(*vals)
    return node


def _buffer_name(program: ExportedProgram, base: str) -> str:
    taken = set(program.state_dict) | set(program.constants)
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


def quantized_weights(program: ExportedProgram) -> dict[str, dict[str, str]]:
    """``weight name -> {"codes": .., "scales": .., "zero_points": ..}`` of a program this module
    quantized (read from the graph: the buffers each weight ``dequantize_affine`` reads)."""
    sig = program.graph_signature
    names = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
    out: dict[str, dict[str, str]] = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.torchao.dequantize_affine.default:
            continue
        args = node.args
        if not all(
            isinstance(a, torch.fx.Node) and a.op == "placeholder" for a in (args[0], args[2], args[3])
        ):
            continue
        codes = names[args[0].name]
        out[codes] = {"codes": codes, "scales": names[args[2].name], "zero_points": names[args[3].name]}
    return out


def _activation(
    graph: torch.fx.Graph, mode: Any, x: torch.fx.Node, block: list[int], like: torch.fx.Node
) -> torch.fx.Node:
    """torchao's dynamic per-token int8 quantization of ``x`` (asymmetric), as torchao's
    ``Int8DynamicActivationIntxWeightConfig`` traces it: what XNNPACK's partitioner matches."""
    import operator

    ops = torch.ops.torchao
    qp = _call(
        graph,
        mode,
        ops.choose_qparams_affine.default,
        (x, "ASYMMETRIC", block, torch.int8, -128, 127, None, None, torch.int8),
        like,
    )
    s = _call(graph, mode, operator.getitem, (qp, 0), like)
    z = _call(graph, mode, operator.getitem, (qp, 1), like)
    q = _call(graph, mode, ops.quantize_affine.default, (x, block, s, z, torch.int8, -128, 127), like)
    return _call(graph, mode, ops.dequantize_affine.default, (q, block, s, z, torch.int8, -128, 127), like)


def quantize_linears(program: ExportedProgram, scheme: WeightScheme) -> ExportedProgram:
    """Rewrite every ``linear`` of ``program``'s top graph whose weight is a parameter the scheme
    accepts (2-D float32, in-features divisible by the group), in place; returns ``program``.
    Each linear quantizes its own input, even where several read one tensor (q/k/v, gate/up):
    XNNPACK's partitioner groups a shared activation chain with all its linears and then split a
    2-layer Llama into 5 delegates instead of 1 (ONNX's common-subexpression pass merges the
    copies in the .onnx)."""
    import torchao.quantization.quant_primitives  # noqa: F401  (defines torch.ops.torchao)

    graph = program.graph_module.graph
    sig = program.graph_signature
    params = dict(sig.inputs_to_parameters)
    mode = _fake_mode(program)
    if mode is None:
        raise InputError("the program has no fake tensors to quantize against", hint="re-export the model")
    specs = list(sig.input_specs)
    new_specs: list[Any] = []
    add_buffer = _buffer_adder(program, mode, specs, new_specs)
    weights: dict[str, _Buffers] = {}
    sums: dict[tuple[torch.fx.Node, int], torch.fx.Node] = {}
    changed = 0
    kept: dict[str, str] = {}
    heads = _output_heads(program) if scheme.head else set()
    matmuls = (aten.addmm.default, aten.mm.default, aten.matmul.default, aten.bmm.default)
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in matmuls:
            _keep_matmul_weights(node, params, kept)
            continue
        if node.op != "call_function" or node.target is not aten.linear.default:
            continue
        use = SCHEMES[scheme.head] if node in heads and scheme.head else scheme
        if _quantize_linear(program, mode, use, node, params, weights, kept, add_buffer, sums):
            changed += 1
    if not changed:
        listed = "; ".join(f"{n} {why}" for n, why in kept.items()) or "no linear reads a parameter"
        raise InputError(
            f"quantize={scheme.name!r} found no linear to quantize in the program ({listed})",
            hint="quantization rewrites aten.linear with a parameter weight (a Conv1D written as "
            "addmm, as GPT-2's, is not one); export with quantize=None",
        )
    dropped = _drop_float_weights(program, specs, new_specs, params, weights)
    graph.lint()
    program.graph_module.recompile()
    logger.info(
        "%s: %d linear(s) over %d weight(s), %d float weight(s) left the program",
        scheme.describe(),
        changed,
        len(weights),
        len(dropped),
    )
    for name, why in kept.items():
        logger.warning("%s is not quantized: %s", name, why)
    program.graph_module.meta[FLOAT_LINEARS_KEY] = dict(kept)
    return program


#: a weight's quantized buffers: codes, scales, zero points, and the group offsets (or None)
_Buffers = tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node, "torch.fx.Node | None"]
#: ops that pass a value through unchanged on its way to an output (a head's logits)
_PASS_THROUGH = (
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.alias.default,
    aten.slice.Tensor,  # the logits of the last position
)


def _output_heads(program: ExportedProgram) -> set[torch.fx.Node]:
    """The linears whose result the program returns as it is (through views only): the output
    head (a decoder's logits)."""
    out = program.graph.output_node()
    heads: set[torch.fx.Node] = set()
    stack = list(out.all_input_nodes)
    while stack:
        node = stack.pop()
        if node.op != "call_function":
            continue
        if node.target is aten.linear.default:
            heads.add(node)
        elif node.target in _PASS_THROUGH:
            stack.extend(node.all_input_nodes[:1])
    return heads


def _buffer_adder(
    program: ExportedProgram, mode: Any, specs: list[Any], new_specs: list[Any]
) -> Callable[[str, torch.Tensor], torch.fx.Node]:
    """A function adding a persistent buffer placeholder before the user inputs (its spec to
    ``new_specs``), so the codes and scales are state the weight proof reads."""
    from torch.export.graph_signature import InputSpec, TensorArgument

    graph = program.graph_module.graph
    user_idx = next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT), len(specs))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first_user = placeholders[user_idx] if user_idx < len(placeholders) else None

    def add_buffer(name: str, tensor: torch.Tensor) -> torch.fx.Node:
        ctx = (
            graph.inserting_before(first_user)
            if first_user is not None
            else graph.inserting_after(placeholders[-1])
        )
        with ctx:
            ph = graph.placeholder(f"b_{name.replace('.', '_')}")
        ph.meta["val"] = mode.from_tensor(tensor, static_shapes=True)
        program.state_dict[name] = tensor
        new_specs.append(
            InputSpec(kind=InputKind.BUFFER, arg=TensorArgument(name=ph.name), target=name, persistent=True)
        )
        return ph

    return add_buffer


def _keep_matmul_weights(node: torch.fx.Node, params: dict[str, str], kept: dict[str, str]) -> None:
    """Record the parameters a non-linear matmul reads: the rewrite leaves them in float32."""
    for a in node.args:
        if isinstance(a, torch.fx.Node) and a.op == "placeholder" and a.name in params:
            kept.setdefault(params[a.name], f"read by {node.target} (not a linear): stays float32")


def _quantize_linear(
    program: ExportedProgram,
    mode: Any,
    scheme: WeightScheme,
    node: torch.fx.Node,
    params: dict[str, str],
    weights: dict[str, _Buffers],
    kept: dict[str, str],
    add_buffer: Callable[[str, torch.Tensor], torch.fx.Node],
    sums: dict[tuple[torch.fx.Node, int], torch.fx.Node],
) -> bool:
    """Rewrite one ``linear`` to read quantized activations and weights (the weight's buffers
    added once, shared by its linears); False, with the reason in ``kept``, if it stays float.
    With group offsets, ``+ linear(group_sums(x), offsets)`` follows it (the group sums of an
    input computed once for all its linears)."""
    graph = program.graph_module.graph
    x: Any = node.args[0]  # a Node whenever its value is a tensor (checked below)
    w = node.args[1]
    if not isinstance(w, torch.fx.Node) or w.op != "placeholder" or w.name not in params:
        return False
    name = params[w.name]
    tensor = program.state_dict.get(name)
    xv = _val(x)
    if not isinstance(tensor, torch.Tensor) or not scheme.accepts(tensor) or not isinstance(xv, torch.Tensor):
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else None
        kept.setdefault(
            name,
            f"{shape}: {scheme.name} needs 2-D float32 weights"
            + (f" with in_features a multiple of {scheme.group_size}" if scheme.group_size else ""),
        )
        return False
    key = f"{name}:{scheme.name}"
    if key not in weights:
        q = quantize_weight(tensor, scheme)
        base = name[: -len(".weight")] if name.endswith(".weight") else name
        tag = scheme.name.replace("-", "_")  # a name FX and ExecuTorch keep as it is
        weights[key] = (
            add_buffer(_buffer_name(program, f"{base}.{tag}_codes"), q.codes),
            add_buffer(_buffer_name(program, f"{base}.{tag}_scales"), q.scales),
            add_buffer(_buffer_name(program, f"{base}.{tag}_zero_points"), q.zero_points),
            None
            if q.offsets is None
            else add_buffer(_buffer_name(program, f"{base}.{tag}_offsets"), q.offsets),
        )
    codes, scales, zps, offsets = weights[key]
    k = int(tensor.shape[1])
    with graph.inserting_before(node):
        xq = _activation(graph, mode, x, [1] * (xv.dim() - 1) + [k], node)
        wq = _call(
            graph,
            mode,
            torch.ops.torchao.dequantize_affine.default,
            (codes, scheme.block(k), scales, zps, torch.int8, scheme.qmin, scheme.qmax),
            node,
        )
        if offsets is not None and (x, k) not in sums:
            ones = _group_sum_matrix(program, k, scheme.group_size or k, add_buffer)
            sums[(x, k)] = _call(graph, mode, aten.linear.default, (x, ones), node)
    node.args = (xq, wq, *node.args[2:])
    if offsets is not None:
        with graph.inserting_after(node):
            corr = _call(graph, mode, aten.linear.default, (sums[(x, k)], offsets), node)
        with graph.inserting_after(corr):
            total = _call(graph, mode, aten.add.Tensor, (node, corr), node)
        replace_all_uses(program, node, total, delete_user_cb=lambda user: user is not total)
    return True


def _group_sum_matrix(
    program: ExportedProgram, k: int, group: int, add_buffer: Callable[[str, torch.Tensor], torch.fx.Node]
) -> torch.fx.Node:
    """The ``[K / group, K]`` 0/1 matrix whose linear sums each group of an input (one buffer
    per in-features size, shared by every linear of that size)."""
    name = f"dualexport_group_sums_{k}_{group}"
    found = [n for n in program.graph.nodes if n.op == "placeholder" and n.name == f"b_{name}"]
    if found:
        return found[0]
    matrix = torch.zeros(k // group, k)
    for i in range(k // group):
        matrix[i, i * group : (i + 1) * group] = 1.0
    return add_buffer(name, matrix)


def _drop_float_weights(
    program: ExportedProgram,
    specs: list[Any],
    new_specs: list[Any],
    params: dict[str, str],
    weights: dict[str, Any],
) -> list[str]:
    """Remove the quantized weights nothing reads any more and install the new signature, so the
    float copies leave the program; returns the dropped names."""
    graph = program.graph_module.graph
    dropped = []
    quantized = {key.rsplit(":", 1)[0] for key in weights}
    for ph in [n for n in graph.nodes if n.op == "placeholder" and n.name in params]:
        if not ph.users and params[ph.name] in quantized:
            dropped.append(params[ph.name])
            graph.erase_node(ph)
    specs = [s for s in specs if not (s.kind == InputKind.PARAMETER and s.target in dropped)]
    user_idx = next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT), len(specs))
    set_graph_signature(
        program,
        ExportGraphSignature(
            input_specs=specs[:user_idx] + new_specs + specs[user_idx:],
            output_specs=list(program.graph_signature.output_specs),  # kept in step by the rewrite
        ),
    )
    for name in dropped:
        program.state_dict.pop(name, None)
    return dropped


def quantization_transform(scheme: WeightScheme) -> Callable[[ExportedProgram], ExportedProgram]:
    """``quantize_linears`` for ``scheme`` as a program transform (``dx.export(transforms=...)``)."""

    def quantize(program: ExportedProgram) -> ExportedProgram:
        return quantize_linears(program, scheme)

    quantize.__name__ = f"quantize_{scheme.name}"
    return quantize


@dataclass(frozen=True)
class QuantizationSummary:
    """What a quantized program holds: per code width, the quantized weights (and their count of
    values), the linears' weights left in float32 with the reason, and the bytes the same weights
    take in float32 (the yardstick for the files' sizes)."""

    quantized: dict[str, int]
    values: dict[str, int]
    float_linears: dict[str, str]
    fp32_bytes: int

    def lines(self) -> list[str]:
        out = [
            f"{bits}: {n} weight(s), {self.values[bits] / 1e6:.2f} M values"
            for bits, n in self.quantized.items()
        ]
        out += [f"float32: {name}: {why}" for name, why in self.float_linears.items()]
        return out


def quantization_summary(program: ExportedProgram) -> QuantizationSummary:
    """Read from the program (the buffers each weight ``dequantize_affine`` reads and the meta the
    rewrite leaves): what a user needs to know of what the files hold."""
    groups = quantized_weights(program)
    quantized: dict[str, int] = {}
    values: dict[str, int] = {}
    roles: set[str] = set()
    for names in groups.values():
        codes = program.state_dict[names["codes"]]
        tag = names["codes"].rsplit(".", 1)[-1].removesuffix("_codes").replace("_", "-")
        bits = tag
        quantized[bits] = quantized.get(bits, 0) + 1
        values[bits] = values.get(bits, 0) + codes.numel()
        roles.update(names.values())
        base = names["codes"].removesuffix("_codes")
        roles.add(base + "_offsets")
    fp32 = 0
    for name, tensor in program.state_dict.items():
        if name in groups:
            fp32 += tensor.numel() * 4  # the weight these codes replace
        elif (
            name not in roles and not name.startswith("dualexport_group_sums") and tensor.is_floating_point()
        ):
            fp32 += tensor.numel() * tensor.element_size()
    kept = dict(program.graph_module.meta.get(FLOAT_LINEARS_KEY, {}))
    return QuantizationSummary(quantized, values, kept, fp32)
