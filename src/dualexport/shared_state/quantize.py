"""int8 PT2E static quantization of the shared program, once, for both targets.

Why here: quantizing per target would give each artifact its own scales and zero points from its
own calibration run; quantizing the shared program means ONNX (QuantizeLinear/DequantizeLinear)
and XNNPACK (int8 kernels) are lowered from the same quantized program and carry the same
parameters, which the manifest then proves.

The user's model is still traced exactly once. PT2E works on the traced graph module: prepare
(observers), calibrate on the user's data, convert, then the converted graph module (not the
user's model) is re-exported to an ExportedProgram that becomes the shared program.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ..errors import InputError, TransformError

__all__ = ["is_quantized", "quantize_shared", "output_quant_steps"]


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


def quantize_shared(shared: Any, scheme: str, calibration: Iterable[Any] | None) -> None:
    """Replace the shared program by its PT2E int8 (symmetric, per-channel weights) version."""
    if scheme != "int8":
        raise InputError(f"quantize={scheme!r} is not supported", hint="use quantize='int8'")
    if calibration is None:
        raise InputError(
            "quantize='int8' needs calibration data",
            hint="pass calibration=[(x1,), (x2,), ...] with representative inputs",
        )
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from .transforms import ProgramTransform

    sets = _calibration_sets(calibration)
    start = time.perf_counter()

    def pt2e_int8(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
        prepared = prepare_pt2e(ep.module(), quantizer)
        with torch.no_grad():
            for args, kwargs in sets:
                prepared(*args, **kwargs)
        converted = convert_pt2e(prepared)
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

    float_program = shared.exported_program
    shared.apply_transforms([ProgramTransform(pt2e_int8, name="pt2e-int8 (XNNPACKQuantizer, per-channel)")])
    shared.float_program = float_program
    shared.quantization = {
        "scheme": "int8",
        "quantizer": "XNNPACKQuantizer symmetric per-channel",
        "calibration_sets": len(sets),
        "seconds": round(time.perf_counter() - start, 3),
    }
    shared.note(f"quantized to int8 with PT2E on {len(sets)} calibration input(s)")


def is_quantized(program: torch.export.ExportedProgram) -> bool:
    """Whether the program holds quantize/dequantize ops (an int8 export)."""
    return any(
        n.op == "call_function" and str(n.target).startswith("quantized_decomposed.")
        for n in program.graph.nodes
    )


_DEQUANT = ("quantized_decomposed.dequantize_per_tensor", "quantized_decomposed.dequantize_per_channel")


def output_quant_steps(program: torch.export.ExportedProgram) -> dict[int, float]:
    """Output index -> quantization step (scale) of the dequantize that produces it, if any."""
    out_node = next(n for n in program.graph.nodes if n.op == "output")
    steps: dict[int, float] = {}
    user_outputs = [s for s in program.graph_signature.output_specs if s.kind.name == "USER_OUTPUT"]
    names = [s.arg.name for s in user_outputs]
    nodes = {n.name: n for n in program.graph.nodes}
    for i, name in enumerate(names):
        node = nodes.get(name)
        if node is not None and any(str(node.target).startswith(d) for d in _DEQUANT[:1]):
            scale = node.args[1]
            if isinstance(scale, (int, float)):
                steps[i] = float(scale)
    del out_node
    return steps
