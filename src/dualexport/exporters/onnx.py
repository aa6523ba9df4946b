"""The ONNX target: torch.onnx's dynamo exporter fed with the shared program's decomposition.

Why the private exporter steps: ``torch.onnx.export(ep)`` decomposes again and keeps yet another
program with another dict; calling its two phases (decompose, translate) lets the decomposed
program be the one linked to the holder, and translates it once.

Deliberate choice (docs/design.md, "The weight manifest"): the graph runs through
torch.onnx's optimizer passes *except* the BatchNorm fusion, which folds BatchNorm into Conv and
keeps the name ``conv.weight`` for the folded values (``onnx_passes.py``). Every initializer that
carries a weight's name carries its bytes; a weight folded into a transposed copy is recorded as
transformed and checked bit for bit after the permutation; ONNX Runtime fuses BatchNorm at session
load (graph optimization level ALL), so speed is not lost. ``ExportOptions(onnx_passes=False)``
keeps the translated graph as it is (only dead nodes and unused initializers removed).
"""

from __future__ import annotations

import functools
import json
import logging
import pathlib
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch.export import ExportedProgram

from ..compat.torch import (
    OpOverload,
    onnx_default_opset,
    onnx_prepare_for_export,
    onnx_registry,
    register_quantized_decomposed,
)
from ..compat.torch import onnx_program as onnx_program_of
from ..errors import OnnxLoweringError
from ..shared_state.contract import RANGES_METADATA, input_specs
from ..shared_state.dispatch_walk import walk_cia_ops_once_per_change
from ..shared_state.nodes import describe_node, unused_weight_notes
from .base import ExportOptions, LoweredTarget
from .onnx_quant import (
    MIN_OPSET,
    Int4Result,
    float_activations,
    kernel_activations,
    register_torchao,
    uses_torchao,
    weights_for_matmulnbits,
)

__all__ = ["OnnxExporter", "unsupported_nodes"]

logger = logging.getLogger(__name__)

_SKIP_OPS = {"getitem"}
#: Initializer bytes above which weights go to external data whatever the options say (the 2 GB
#: protobuf limit, less room for the graph).
_INLINE_LIMIT = (2 << 30) - (64 << 20)


def target_opset(options: ExportOptions | None) -> int:
    """The opset of the file: the option, else torch.onnx.export's default (20: Gelu and the
    other fused ops ONNX Runtime runs as one kernel; torchlib's own floor, 18, decomposes them)."""
    return (options.onnx_opset if options is not None else None) or onnx_default_opset()


_GENERATED = re.compile(r"<eval_with_key>\.\d+")


def _reproducible_traces(model: Any) -> None:
    """Stack traces in node metadata name FX's generated code as ``<eval_with_key>.N``, where N
    counts every graph module this process compiled before: the same program would give
    different bytes in a fresh process and in a long-lived one (a reused Ray worker). The count
    carries no information, so it is dropped."""
    import onnx_ir as ir

    def fix(graph: Any) -> None:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            trace = node.metadata_props.get("pkg.torch.onnx.stack_trace")
            if trace and "<eval_with_key>" in trace:
                node.metadata_props["pkg.torch.onnx.stack_trace"] = _GENERATED.sub("<eval_with_key>", trace)

    fix(model.graph)
    for fn in model.functions.values():
        fix(fn)


@functools.lru_cache(maxsize=4)
def _registry(opset: int = 18) -> Any:
    """torch.onnx's translation table for ``opset`` (torchlib translates from 18 up; lower
    opsets are reached by converting the model afterwards, as torch.onnx.export does)."""
    # The table resolves each translation's op when it is built, and is cached for the process:
    # without the quantized_decomposed library defined first, a process whose first export is
    # not quantized (a reused Ray worker) could never translate a quantized one afterwards.
    from .onnx_int8 import register_int8_translations

    register_quantized_decomposed()
    return register_int8_translations(onnx_registry(max(opset, 18)))


def unsupported_nodes(program: ExportedProgram, registry=None) -> list[torch.fx.Node]:
    """call_function nodes whose ATen op has no ONNX translation in torch.onnx's registry."""
    registry = registry or _registry()
    out = []
    for node in program.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, OpOverload):
            continue
        if not registry.is_registered(node.target):
            out.append(node)
    return out


def _user_input_names(program: ExportedProgram) -> list[str]:
    from torch.export.graph_signature import InputKind

    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return [
        s.arg.name
        for s in program.graph_signature.input_specs
        if s.kind == InputKind.USER_INPUT
        and isinstance(nodes.get(s.arg.name, None) and nodes[s.arg.name].meta.get("val"), torch.Tensor)
    ]


def _make_state_explicit(program: ExportedProgram) -> None:
    """Turn mutated buffers into explicit state: a graph input and an output per buffer.

    Why: torch.onnx keeps a mutated buffer as a constant initializer and drops the update, so an
    ONNX model of a stateful module silently forgets its state between calls. Editing the
    decomposed (per-target) program's signature makes the buffer a user input and its new value
    a user output; the shared program is not touched.
    """
    from torch.export.graph_signature import InputKind, InputSpec, OutputKind, OutputSpec

    sig = program.graph_signature
    mutated = {spec.target: spec for spec in sig.output_specs if spec.kind == OutputKind.BUFFER_MUTATION}
    if not mutated:
        program.meta_state = []  # type: ignore[attr-defined]
        return
    state = []
    for i, spec in enumerate(sig.input_specs):
        if spec.kind == InputKind.BUFFER and spec.target in mutated:
            state.append({"buffer": spec.target, "input": spec.arg.name})
            sig.input_specs[i] = InputSpec(
                kind=InputKind.USER_INPUT, arg=spec.arg, target=None, persistent=None
            )
    for i, spec in enumerate(sig.output_specs):
        if spec.kind == OutputKind.BUFFER_MUTATION:
            for item in state:
                if item["buffer"] == spec.target:
                    item["output_index"] = i
            sig.output_specs[i] = OutputSpec(kind=OutputKind.USER_OUTPUT, arg=spec.arg, target=None)
    program.meta_state = state  # type: ignore[attr-defined]


class OnnxExporter:
    target: ClassVar[str] = "onnx"
    suffix: ClassVar[str] = ".onnx"
    refused_dtypes: ClassVar[Mapping[torch.dtype, tuple[str, str]]] = {
        torch.bfloat16: (
            "ONNX Runtime's CPU kernels do not compute in bfloat16 (Gemm, MatMul, Conv and most "
            "others have no bfloat16 implementation: the file would not load)",
            "cast the model and its inputs to float32 (model.float()) for the .onnx, or export "
            "target='xnnpack' alone",
        ),
    }

    def registry(self, options: ExportOptions | None = None) -> Any:
        return _registry(target_opset(options))

    def weight_notes(self, decomposed: ExportedProgram) -> dict[str, str]:
        return unused_weight_notes(decomposed)

    def proof_program(
        self, program: ExportedProgram, options: ExportOptions
    ) -> tuple[ExportedProgram, str] | None:
        if options.int4_level != 4 or not uses_torchao(program):
            return None
        approx = kernel_activations(program)
        if approx is program:
            return None
        return approx, (
            "the shared program with its int4 and 8-bit linears' activations quantized as "
            "MatMulNBits at accuracy level 4 quantizes them (per block, symmetric int8)"
        )

    def passes(self, options: ExportOptions) -> tuple[str, ...]:
        from .onnx_passes import ORT_PIPELINE

        return ORT_PIPELINE if options.onnx_passes else ()

    def decompose(self, program: ExportedProgram, options: ExportOptions | None = None) -> ExportedProgram:
        from .onnx_fixes import contiguous_attention_outputs, pooled_means_as_last_dim_means
        from .onnx_int8 import fuse_dynamic_linears

        program = pooled_means_as_last_dim_means(contiguous_attention_outputs(program))
        registry = self.registry(options)
        if uses_torchao(program):  # quantized weights: written as ONNX Runtime fuses them
            register_torchao(registry)
            if options is not None and options.int4_level == 4:
                program = float_activations(program)  # the kernel quantizes them (level 4)
        dec = onnx_prepare_for_export(program, registry)
        fuse_dynamic_linears(dec)  # int8-dynamic: ONNX Runtime's fused form
        _make_state_explicit(dec)
        return dec

    def _diagnose(self, decomposed: ExportedProgram, exc: BaseException) -> OnnxLoweringError:
        missing = unsupported_nodes(decomposed, self.registry())
        if missing:
            where = "; ".join(describe_node(n) for n in missing[:5])
            more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
            return OnnxLoweringError(
                f"no ONNX translation for {len(missing)} node(s): {where}{more}",
                target=self.target,
                hint="replace the op in the model with supported ones, register a translation with "
                "torch.onnx.ONNXRegistry / custom_translation_table, or export target='xnnpack' alone",
            )
        first = str(exc).strip().splitlines()
        return OnnxLoweringError(
            f"torch.onnx could not translate the program: {type(exc).__name__}: {first[-1] if first else ''}",
            target=self.target,
            hint="see the chained exception; torch.onnx.export(..., report=True) on the same "
            "program writes a detailed report",
        )

    def lower(
        self, decomposed: ExportedProgram, staging: pathlib.Path, name: str, options: ExportOptions
    ) -> LoweredTarget:
        from onnx_ir.passes.common import RemoveUnusedNodesPass

        try:
            with walk_cia_ops_once_per_change():
                onnx_program = onnx_program_of(decomposed, self.registry(options))
        except Exception as exc:
            raise self._diagnose(decomposed, exc) from exc
        model = onnx_program.model
        kept = {
            k: raw
            for k, v in model.graph.initializers.items()
            if isinstance(raw := getattr(v.const_value, "raw", None), torch.Tensor)
        }
        if target_opset(options) != 18:
            # torchlib writes opset 18 imports whatever the registry translated to; torch.onnx.export
            # converts to the asked opset afterwards (with the converter's fallback), and so do we.
            from onnxscript import version_converter

            version_converter.convert_version(model, target_opset(options), fallback=True)
        quant = self._quantized_weights(model, decomposed, options)
        state = _state_initializers(model, decomposed)
        # The exported dim ranges travel with the file (ONNX cannot state them); our runner and
        # any consumer can refuse out-of-range inputs instead of computing garbage.
        specs = input_specs(decomposed)
        state_inputs = {s["input"] for s in state}
        user_specs = [
            sp
            for sp, name in zip(specs, _user_input_names(decomposed), strict=True)
            if name not in state_inputs
        ]
        model.metadata_props[RANGES_METADATA] = json.dumps(user_specs)
        for key, text in options.file_metadata:
            model.metadata_props[key] = text
        from .onnx_passes import PipelineResult

        pipeline = PipelineResult()
        if options.onnx_passes:
            from .onnx_passes import optimize_for_ort

            pipeline = optimize_for_ort(model)
        else:
            RemoveUnusedNodesPass()(model)
        model.producer_name = "dualexport"
        _reproducible_traces(model)
        files = self._save(model, staging, name, options)
        ops = tuple(sorted({n.op_type if not n.domain else f"{n.domain}::{n.op_type}" for n in model.graph}))
        return LoweredTarget(
            target=self.target,
            files=tuple(files),
            ops=ops,
            weight_notes={**pipeline.notes, **quant.notes, **self.weight_notes(decomposed)},
            derived_copies=pipeline.derived,
            kept_tensors=kept,
            opset=model.opset_imports.get("", None),
        )

    def _quantized_weights(
        self, model: Any, decomposed: ExportedProgram, options: ExportOptions
    ) -> Int4Result:
        """A program with torchao-quantized weights (``export_llm(quantize=...)``): blocked
        DequantizeLinear in the form ONNX Runtime fuses into MatMulNBits (needs opset 21)."""
        if not uses_torchao(decomposed):
            return Int4Result()
        if target_opset(options) < MIN_OPSET:
            raise OnnxLoweringError(
                f"quantized weights need ONNX opset {MIN_OPSET} (INT4, blocked DequantizeLinear); "
                f"the export asks for {target_opset(options)}",
                target=self.target,
                hint=f"export with ExportOptions(onnx_opset={MIN_OPSET})",
            )
        return weights_for_matmulnbits(model, options.int4_level)

    def _save(
        self, model: Any, staging: pathlib.Path, name: str, options: ExportOptions
    ) -> list[pathlib.Path]:
        """Write ``model`` (and its external data file when a weight is big enough) and check it;
        the files written."""
        import onnx
        import onnx_ir as ir

        path = staging / f"{name}.onnx"
        data_name = f"{name}.onnx.data"
        sizes = [v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None]
        # Inline when asked, but never past what the format holds (a protobuf is at most 2 GB).
        inline = options.onnx_external_data is False and sum(sizes) < _INLINE_LIMIT
        big = [] if inline else [n for n in sizes if n >= options.external_data_threshold]
        try:
            if big:
                ir.save(
                    model, path, external_data=data_name, size_threshold_bytes=options.external_data_threshold
                )
            else:
                ir.save(model, path)
            onnx.checker.check_model(str(path), full_check=False)
        except Exception as exc:
            raise OnnxLoweringError(
                f"the ONNX model failed to save or check: {type(exc).__name__}: {exc}",
                target=self.target,
                hint="this is usually an exporter bug; try onnx_opset=<another opset>",
            ) from exc
        return [path] + ([staging / data_name] if big else [])


def _state_initializers(model: Any, decomposed: ExportedProgram) -> list[dict[str, Any]]:
    """The program's state (``meta_state``: a buffer carried from call to call) as model inputs
    defaulting to the buffer's initial value (an initializer of the same name), so a first call
    may omit it; each call returns the updated state. The state's record, each item completed
    with its output's name, is also written in the model's metadata."""
    import onnx_ir as ir

    state = decomposed.meta_state if hasattr(decomposed, "meta_state") else []
    for item in state:
        value = next(v for v in model.graph.inputs if v.name == item["input"])
        value.const_value = ir.tensor(
            decomposed.state_dict.get(item["buffer"], decomposed.constants.get(item["buffer"]))
            .detach()
            .clone()
            .numpy(),
            name=item["input"],
        )
        model.graph.register_initializer(value)
        item["output"] = model.graph.outputs[item["output_index"]].name
    if state:
        model.metadata_props["dualexport.state"] = json.dumps(state)
    return state
