"""int8 quantization of the shared program, once, for both targets: PT2E static (``"int8"``) or
dynamic (``"int8-dynamic"``).

Why here: quantizing per target would give each artifact its own scales and zero points from its
own calibration run; quantizing the shared program means ONNX and XNNPACK are lowered from the
same quantized program and carry the same int8 weight codes and scales, which the manifest then
proves byte for byte.

The user's model is still traced exactly once. PT2E works on the traced graph module: prepare
(observers), calibrate on the user's data (static only), convert, then the converted graph module
(not the user's model) is re-exported to an ExportedProgram that becomes the shared program.

Weight range (a deliberate choice, docs/quantization.md): when the export targets ONNX, weights
are quantized to 7 bits, [-63, 63], for both targets. ONNX Runtime's x86 int8 kernels multiply
uint8 activations by int8 weights with ``vpmaddubsw``, which sums pairs of products into int16:
without AVX-VNNI, two full-range products (2 x 255 x 127) overflow and saturate, and the file
computes another model (measured on this machine: SNR 18.7 dB against quantized eager on a small
MLP, 27.6 dB on a ViT). ONNX Runtime documents ``reduce_range`` (7-bit weights) for such CPUs;
with 7 bits a pair stays within 2 x 255 x 63 = 32130. Measured against the alternatives
(bench/bench_int8_saturation.py): the 7-bit file matches quantized eager exactly in every session
configuration at the fast kernels' speed and costs 0.0-0.6 dB against the float model, whereas
``session.x64quantprecision`` fails to load transformer int8 models in ONNX Runtime 1.31 and
turning the S8-to-U8 transform off runs 4-5x slower than the 7-bit file. An XNNPACK-only export
keeps 8-bit weights (XNNPACK accumulates in int32).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ..compat.torch import is_annotated, pytree
from ..errors import InputError, TransformError

__all__ = [
    "SCHEMES",
    "weight_range",
    "is_quantized",
    "quantize_shared",
    "output_quant_steps",
    "quantized_outputs",
]

#: What ``quantize=`` accepts.
SCHEMES: tuple[str, ...] = ("int8", "int8-dynamic")

_QD = "quantized_decomposed."
_TORCHAO = "torchao."
_DEQUANT = ("quantized_decomposed.dequantize_per_tensor", "quantized_decomposed.dequantize_per_channel")
#: Ops the report does not list as "left in float": they move or select values, compute nothing.
_MOVES = frozenset(
    {
        "view",
        "reshape",
        "_unsafe_view",
        "permute",
        "transpose",
        "t",
        "expand",
        "slice",
        "select",
        "unsqueeze",
        "squeeze",
        "contiguous",
        "clone",
        "dropout",
        "flatten",
        "to",
        "_to_copy",
        "type_as",
        "alias",
        "detach",
        "lift_fresh_copy",
        "_assert_tensor_metadata",
        "split",
        "chunk",
        "unbind",
        "getitem",
        "cat",
        "stack",
        "index",
        "gather",
        "embedding",
        "new_ones",
        "new_zeros",
        "zeros",
        "ones",
        "full",
        "full_like",
        "arange",
        "zeros_like",
        "ones_like",
        "scalar_tensor",
    }
)


def weight_range(targets: Sequence[str]) -> tuple[int, str]:
    """The symmetric int8 weight range ``[-q, q]`` for an export to ``targets``, and why."""
    if "onnx" in targets:
        return 63, (
            "7-bit weights [-63, 63] because the export targets ONNX: ONNX Runtime's u8s8 kernels "
            "saturate int16 pair sums on x86 CPUs without AVX-VNNI with full-range weights "
            "(ONNX Runtime's reduce_range advice); both files carry the same codes"
        )
    return 127, "8-bit weights [-127, 127]: XNNPACK accumulates in int32 (no ONNX target)"


def _calibration_sets(calibration: Iterable[Any]) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    sets = []
    for i, item in enumerate(calibration):
        if (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[0], tuple)
            and isinstance(item[1], Mapping)
        ):
            sets.append((item[0], dict(item[1])))
        elif isinstance(item, tuple):
            sets.append((item, {}))
        elif isinstance(item, torch.Tensor):
            sets.append(((item,), {}))
        else:
            raise InputError(
                f"calibration[{i}] must be a tuple of arguments, got {type(item).__name__}",
                hint="pass calibration=[(x1,), (x2,), ...]",
            )
    if not sets:
        raise InputError("calibration is empty", hint="pass at least one representative input tuple")
    return sets


def _op(node: torch.fx.Node) -> str:
    target = node.target
    return str(getattr(target, "__name__", target)).split(".")[0]


def _left_in_float(prepared: torch.fx.GraphModule, why: Mapping[str, str]) -> dict[str, Any]:
    """The computations of the prepared graph that stay in float, by op and reason, and how many
    integer ops (masks, positions, indices) the quantizer left alone."""
    from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

    from .quantizer import is_float_node

    groups: dict[tuple[str, str], list[str]] = {}
    integer = 0
    for node in prepared.graph.nodes:
        if node.op != "call_function" or "activation_post_process" in node.name:
            continue
        op = _op(node)
        if op in _MOVES:
            continue
        if not is_float_node(node):
            integer += 1
            continue
        annotation = node.meta.get(Q_ANNOTATION_KEY)
        if is_annotated(annotation):
            continue
        reason = why.get(node.name, "no int8 pattern in XNNPACKQuantizer")
        groups.setdefault((op, reason), []).append(node.name)
    return {
        "float_ops": [
            {"op": op, "reason": reason, "count": len(names), "nodes": names[:5]}
            for (op, reason), names in sorted(groups.items(), key=lambda kv: -len(kv[1]))
        ],
        "integer_ops": integer,
    }


def quantize_shared(
    shared: Any, scheme: str, calibration: Iterable[Any] | None, *, targets: Sequence[str] = ("onnx",)
) -> None:
    """Replace the shared program by its PT2E int8 version: symmetric per-channel int8 weights
    in ``weight_range(targets)``; activations per-tensor int8, calibrated (``"int8"``) or chosen
    at run time (``"int8-dynamic"``, linear layers only)."""
    dynamic = _check_scheme(scheme, calibration)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from .quantizer import make_quantizer, one_dynamic_quantization_per_linear
    from .transforms import ProgramTransform

    example = (tuple(shared.example_args), dict(shared.example_kwargs))
    sets = _calibration_sets(calibration) if calibration is not None and not dynamic else []
    qmax, range_why = weight_range(targets)
    start = time.perf_counter()
    record: dict[str, Any] = {}

    def pt2e_int8(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
        module = ep.module()
        scans = [_positional(module, a, k) for a, k in [example, *sets]]
        quantizer = make_quantizer(dynamic=dynamic, weight_qmax=qmax, scan_sets=scans)
        prepared = prepare_pt2e(module, quantizer)
        record.update(_left_in_float(prepared, quantizer.reasons()))
        record["quantized_ops"] = dict(
            sorted(Counter(_op(n) for n in prepared.graph.nodes if _annotated(n)).items())
        )
        if dynamic and not record["quantized_ops"]:
            raise InputError(
                "quantize='int8-dynamic' found no linear layer to quantize: the files would be float "
                "files labelled int8",
                hint="int8-dynamic quantizes linear layers only; for convolutions use quantize='int8' "
                "with calibration data",
            )
        with torch.no_grad():
            # the weights' observers see the weights during a forward: dynamic activations need
            # no data, but without one call every weight scale stays the observer's default 1.0
            for args, kwargs in sets or [example]:
                prepared(*args, **kwargs)
        converted = convert_pt2e(prepared)
        if dynamic:
            one_dynamic_quantization_per_linear(converted)
        return _reexport(shared, converted)

    float_program = shared.exported_program
    label = "dynamic" if dynamic else "static"
    shared.apply_transforms(
        [ProgramTransform(pt2e_int8, name=f"pt2e-{scheme} (XNNPACKQuantizer, per-channel, {label})")]
    )
    shared.float_program = float_program
    shared.quantization = {
        "scheme": scheme,
        "quantizer": "XNNPACKQuantizer (integer-safe) symmetric per-channel",
        "weights": {"dtype": "int8", "range": [-qmax, qmax], "why": range_why},
        "activations": _activations(dynamic, len(sets)),
        "calibration_sets": len(sets),
        **record,
        "seconds": round(time.perf_counter() - start, 3),
    }
    shared.note(
        f"quantized to {scheme} with PT2E (weights in [-{qmax}, {qmax}])"
        + ("" if dynamic else f" on {len(sets)} calibration input(s)")
    )


def _check_scheme(scheme: str, calibration: Iterable[Any] | None) -> bool:
    """Refuse an unknown scheme, and static int8 without calibration data; True for the
    dynamic scheme."""
    if scheme not in SCHEMES:
        raise InputError(f"quantize={scheme!r} is not supported", hint=f"use one of {', '.join(SCHEMES)}")
    dynamic = scheme == "int8-dynamic"
    if not dynamic and calibration is None:
        raise InputError(
            "quantize='int8' needs calibration data",
            hint="pass calibration=[(x1,), (x2,), ...] with representative inputs, or use "
            "quantize='int8-dynamic' (activations quantized at run time, no calibration)",
        )
    return dynamic


def _reexport(shared: Any, converted: torch.nn.Module) -> torch.export.ExportedProgram:
    """The converted (quantized) module traced again with the shared program's examples and
    dynamic shapes."""
    try:
        return torch.export.export(
            converted,
            shared.example_args,
            shared.example_kwargs or None,
            dynamic_shapes=shared.dynamic_shapes,
            strict=False,
        )
    except Exception as exc:
        raise TransformError(
            f"the quantized graph could not be re-exported: {exc}",
            hint="quantize a model without data-dependent control flow",
        ) from exc


def _activations(dynamic: bool, sets: int) -> str:
    """How the activations are quantized, for the export's record."""
    if dynamic:
        return (
            "int8 per tensor, chosen at run time (eager and ONNX Runtime's DynamicQuantizeLinear "
            "per tensor; XNNPACK's dynamic fully-connected per row)"
        )
    return f"int8 per tensor, static, calibrated on {sets} input set(s)"


def _annotated(node: torch.fx.Node) -> bool:
    from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

    annotation = node.meta.get(Q_ANNOTATION_KEY)
    return (
        node.op == "call_function"
        and annotation is not None
        and is_annotated(annotation)
        and (annotation.output_qspec is not None or bool(annotation.input_qspec_map))
        and _op(node) not in _MOVES
    )


def _positional(module: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """The flat positional arguments ``module`` (an unlifted program module) takes for
    ``args``/``kwargs``: its graph's placeholders are the flattened inputs."""
    flat, _ = pytree.tree_flatten((tuple(args), dict(kwargs)))
    return tuple(flat)


def _quantization_op(target: object) -> bool:
    """A quantize, dequantize or choose-qparams op: PT2E's (``quantized_decomposed``, the int8
    exports) or torchao's (``torchao.*_affine``, the decoders' int4/int8 linears)."""
    name = str(target)
    return name.startswith(_QD) or (name.startswith(_TORCHAO) and "_affine" in name)


def is_quantized(program: torch.export.ExportedProgram) -> bool:
    """Whether the program holds quantize/dequantize ops (an int8 export, a quantized decoder)."""
    return any(n.op == "call_function" and _quantization_op(n.target) for n in program.graph.nodes)


def _user_output_nodes(program: torch.export.ExportedProgram) -> list[torch.fx.Node | None]:
    nodes = {n.name: n for n in program.graph.nodes}
    user = [s for s in program.graph_signature.output_specs if s.kind.name == "USER_OUTPUT"]
    return [nodes.get(getattr(s.arg, "name", "")) for s in user]


def output_quant_steps(program: torch.export.ExportedProgram) -> dict[int, float]:
    """Output index -> quantization step (scale) of the static dequantize that produces it."""
    steps: dict[int, float] = {}
    for i, node in enumerate(_user_output_nodes(program)):
        if node is not None and str(node.target).startswith(_DEQUANT[0]):
            scale = node.args[1]
            if isinstance(scale, (int, float)):
                steps[i] = float(scale)
    return steps


def quantized_outputs(program: torch.export.ExportedProgram) -> dict[int, float | None]:
    """Every floating-point user output computed from a quantized value, with the quantization
    step of the dequantize that produces it (None when a float op comes after the last
    dequantize: a LayerNorm, a dynamic linear). Why all of them: an int8 transformer's output is
    usually a float LayerNorm of quantized values, and judging it by the float table (1e-4)
    failed correct lowerings (a ViT at max_abs 0.33, cosine 0.9996)."""
    steps = output_quant_steps(program)
    quantized: set[str] = set()
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        if _quantization_op(node.target) or any(a.name in quantized for a in node.all_input_nodes):
            quantized.add(node.name)
    out: dict[int, float | None] = {}
    for i, node in enumerate(_user_output_nodes(program)):
        val = node.meta.get("val") if node is not None else None
        if node is not None and node.name in quantized and isinstance(val, torch.Tensor):
            if val.dtype.is_floating_point:
                out[i] = steps.get(i)
    return out
