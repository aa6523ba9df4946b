"""The XNNPACK target: ExecuTorch ``to_edge_transform_and_lower`` with the XNNPACK partitioner.

It is fed the shared program's decomposition (never a separately kept graph module), so every
user transform reaches the delegate; the decomposition preserves the ops XNNPACK asks to keep
whole (linear, conv, ...), as ExecuTorch itself does before partitioning.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import torch
from torch.export import ExportedProgram

from ..compat.executorch import default_decomposition_table, drop_lowered_payloads
from ..compat.torch import backed_size_oblivious, pending_unbacked_kept
from ..errors import XnnpackLoweringError
from ..shared_state.contract import (
    DATA_FILE_METHOD,
    DATA_SUFFIX,
    RANGES_METHOD,
    encode_input_ranges,
    input_specs,
)
from ..shared_state.dispatch_walk import walk_cia_ops_once_per_change
from ..shared_state.fingerprint import find_shape_env
from ..shared_state.nodes import describe_node, op_name, unused_weight_notes, weight_placeholders
from ..shared_state.passes.graph_edit import drop_dead_constants
from .backend_passes import pruned_backend_passes
from .base import ExportOptions, LoweredTarget
from .delegation import DelegationReport
from .xnnpack_fixes import decomposed_once, own_dicts, partitioner_configs, xnnpack_workarounds
from .xnnpack_partitions import VIEW_OF
from .xnnpack_rewrites import pipeline_names, rewrite_table, run_pipeline

__all__ = [
    "XnnpackExporter",
    "weight_notes",
    "derived_weights",
    "size_oblivious",
    "lower_to_buffer",
    "release_lowered_payloads",
]


@contextlib.contextmanager
def size_oblivious() -> Iterator[None]:
    """Decide size checks without guarding on the example's sizes while ExecuTorch lowers.

    Why: fake-tensor kernels run during lowering ask size questions of the shared program's
    shape environment (``_select_conv_backend`` asks whether the batch is below 16, ATen's CPU
    kernels pick a strategy by size); each answer became a guard that narrowed the declared range,
    and ExecuTorch then memory-planned the .pte for the narrowed maximum (a conv with a batch up
    to 64 refused 16). torch.onnx wraps its own decompositions in the same setting.
    """
    with backed_size_oblivious():
        yield


logger = logging.getLogger(__name__)

_BN_OPS = {
    "aten._native_batch_norm_legit_no_training.default",
    "aten.batch_norm.default",
    "aten._native_batch_norm_legit.no_stats",
    "aten.native_batch_norm.default",
}
_CONV_OPS = {"aten.convolution.default", "aten.conv2d.default", "aten.conv1d.default"}


def weight_notes(program: ExportedProgram) -> dict[str, str]:
    """Why XNNPACK may hold an entry's bytes differently: fused with BatchNorm, folded, unused.

    Read off the decomposed graph, so the manifest's reasons come from the program, not guesses.
    """
    return {name: reason for name, (_, reason) in _classify_weights(program).items()}


def derived_weights(program: ExportedProgram) -> dict[str, tuple[str, ...]]:
    """Weights some use of which XNNPACK stores as a function of them (fused with BatchNorm,
    requantized, re-encoded scales): a copy the manifest records as ``derived`` even where the
    weight is also stored as-is, and which a weights-only patch cannot rewrite."""
    return {
        f"xnnpack:{name}": (name,)
        for name, (kind, _) in _classify_weights(program).items()
        if kind == "derived"
    }


def _classify_weights(program: ExportedProgram) -> dict[str, tuple[str, str]]:
    """name -> (``unused`` | ``implicit`` | ``derived``, the reason)."""
    notes: dict[str, tuple[str, str]] = {
        name: ("unused", reason) for name, reason in unused_weight_notes(program).items()
    }
    for name, node in weight_placeholders(program).items():
        users = list(node.users)
        if not users:
            continue
        user_ops = {op_name(u) for u in users}
        quant = _quantization_note(node, users)
        value = program.state_dict.get(name, program.constants.get(name))
        if quant and quant.startswith("zero points"):
            if isinstance(value, torch.Tensor) and not bool(value.any()):
                notes[name] = ("implicit", quant)
            # non-zero zero points must be found in the artifact, not excused
        elif quant:
            notes[name] = ("derived", quant)
        elif user_ops & _BN_OPS:
            notes[name] = (
                "derived",
                "BatchNorm parameter: XNNPACK folds it into the preceding convolution "
                "(FuseBatchNormWithConvPass), so its bytes are not stored",
            )
        elif user_ops & _CONV_OPS and any(
            op_name(cu) in _BN_OPS or any(op_name(g) in _BN_OPS for g in cu.users)
            for u in users
            for cu in u.users
        ):
            notes[name] = (
                "derived",
                "convolution parameter fused with the following BatchNorm by XNNPACK: "
                "stored values differ from the state_dict by design",
            )
    return notes


def _quantization_note(node: torch.fx.Node, users: list[torch.fx.Node]) -> str | None:
    """Why a tensor of an int8 program is not stored as-is by XNNPACK."""
    for u in users:
        target = str(u.target)
        if target.startswith("torchao.dequantize_affine") and len(u.args) > 3 and u.args[3] is node:
            return (
                "zero points of symmetric quantized weights (torchao): XNNPACK's qc8w/qb4w kernels "
                "encode them implicitly (0); checked: all zero in the holder and outputs compared with eager"
            )
        if (
            target.startswith("quantized_decomposed.dequantize_per_channel")
            and len(u.args) > 2
            and u.args[2] is node
        ):
            return (
                "zero points of symmetric per-channel int8 weights: XNNPACK's qc8 kernels encode "
                "them implicitly (0); checked: all zero in the holder and outputs compared with eager"
            )
        if (
            target.startswith("quantized_decomposed.dequantize_per_channel")
            and len(u.args) > 1
            and u.args[1] is node
        ):
            return (
                "per-channel scales of int8 weights, stored in the XNNPACK payload in its own "
                "encoding; checked: outputs compared with eager within one quantization step"
            )
        if op_name(u) in _CONV_OPS | {"aten.linear.default"} and len(u.args) > 2 and u.args[2] is node:
            weight = u.args[1]
            if isinstance(weight, torch.fx.Node) and str(weight.target).startswith(
                "quantized_decomposed.dequantize_per_channel"
            ):
                return (
                    "bias of an int8 op: XNNPACK requantizes it to int32 with input scale x weight "
                    "scale; checked: outputs compared with eager within one quantization step"
                )
    return None


def _xnnpack_partitioner():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner(configs=partitioner_configs())


def _edge_passes(options: ExportOptions) -> list[Any]:
    """Passes on the edge program before partitioning (with the XNNPACK pipeline on)."""
    return [drop_identity_clones] if options.xnnpack_passes else []


def _quant_op(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and "quantize_per_" in str(node.target)


def drop_identity_clones(graph_module: torch.fx.GraphModule) -> Any:
    """Identity clones go: at the edge a ``permute_copy`` is already contiguous, so the
    ``.contiguous()`` after each attention transpose (and eval dropout) is a copy XNNPACK runs
    per inference (13 in a 2-layer BERT). Kept: a clone that changes the dim order, one between a
    graph input and an output (the output must not alias the input), and one next to a quantize
    or dequantize (ExecuTorch's RemoveCloneOpsTransform dropped those too, and a statically
    quantized wav2vec2's .pte then computed something else: its proof failed at SNR -1.9 dB)."""
    from torch.fx.passes.infra.pass_base import PassResult

    graph = graph_module.graph
    outputs = set(graph.output_node().all_input_nodes)
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or "clone" not in str(node.target) or not node.args:
            continue
        src = node.args[0]
        out, val = node.meta.get("val"), getattr(src, "meta", {}).get("val")
        if not isinstance(out, torch.Tensor) or not isinstance(val, torch.Tensor):
            continue
        if out.dim_order() != val.dim_order() or out.dtype != val.dtype:
            continue
        if (src.op == "placeholder" and node in outputs) or _quant_op(src) or any(map(_quant_op, node.users)):
            continue
        node.replace_all_uses_with(src)
        graph.erase_node(node)
        changed = True
    if changed:
        graph.lint()
        graph_module.recompile()
    return PassResult(graph_module, changed)


class XnnpackExporter:
    target: ClassVar[str] = "xnnpack"
    suffix: ClassVar[str] = ".pte"
    refused_dtypes: ClassVar[Mapping[torch.dtype, tuple[str, str]]] = dict.fromkeys(
        (torch.complex32, torch.complex64, torch.complex128),
        (
            "ExecuTorch has no complex dtype: its Edge dialect and portable kernels refuse complex "
            "tensors (an FFT's output), and XNNPACK computes none",
            "compute the transform in real arithmetic (an FFT as a matmul with cos/sin tables, "
            "torch.view_as_real), or export target='onnx' alone",
        ),
    )

    def weight_notes(self, decomposed: ExportedProgram) -> dict[str, str]:
        return weight_notes(decomposed)

    def proof_program(
        self, program: ExportedProgram, options: ExportOptions
    ) -> tuple[ExportedProgram, str] | None:
        return None

    def passes(self, options: ExportOptions) -> tuple[str, ...]:
        if not options.xnnpack_passes:
            return ()
        return pipeline_names()

    def decompose(self, program: ExportedProgram, options: ExportOptions | None = None) -> ExportedProgram:
        """ExecuTorch's edge decomposition, keeping the ops the partitioner takes whole; with
        ``options.xnnpack_passes`` the table also carries the XNNPACK rewrites (one
        ``run_decompositions`` call makes the target's program with its pipeline applied)."""
        keep, _ = _xnnpack_partitioner().ops_to_not_decompose(program)
        table = default_decomposition_table()
        for op in keep:
            table.pop(op, None)
        rewrite = (options or ExportOptions()).xnnpack_passes
        if rewrite:
            table.update(rewrite_table())
        with size_oblivious():
            return run_pipeline(program, table) if rewrite else program.run_decompositions(table)

    def _diagnose(self, decomposed: ExportedProgram, exc: BaseException, stage: str) -> XnnpackLoweringError:
        text = str(exc).strip().splitlines()
        msg = text[0] if text else type(exc).__name__
        culprit = None
        text_all = str(exc)
        for node in decomposed.graph.nodes:
            if node.op == "call_function" and op_name(node) in text_all:
                culprit = node
                break
        where = f" at {describe_node(culprit)}" if culprit is not None else ""
        hint = (
            "the op may have no Edge/portable kernel; replace it in the model, or export "
            "target='onnx' alone; see the chained exception"
        )
        if "Cannot view a tensor" in text_all:  # ExecuTorch 1.4.1 re-traces a strided view
            hint = (
                "a view of a strided tensor (an expand or a transpose) with a dynamic size fails "
                "inside ExecuTorch's re-trace: make the tensor .contiguous() before the view in the "
                "model, declare that size static, or export target='onnx' alone"
            )
        return XnnpackLoweringError(
            f"ExecuTorch {stage} failed{where}: {type(exc).__name__}: {msg}", target=self.target, hint=hint
        )

    def lower(
        self,
        decomposed: ExportedProgram,
        staging: pathlib.Path,
        name: str,
        options: ExportOptions,
        methods: Mapping[str, Any] | None = None,
    ) -> LoweredTarget:
        """Lower and write ``staging/<name>.pte``; ``methods``: extra constant methods (name ->
        a number, a bool or a list of ints), e.g. the metadata ExecuTorch's LLM runner reads."""
        # Inference lowering: with grad on, ExecuTorch's passes trip over in-place updates of
        # buffers next to parameters that require grad (a KV cache beside Linear weights).
        with (
            torch.no_grad(),
            size_oblivious(),
            walk_cia_ops_once_per_change(),
            xnnpack_workarounds(),
            own_dicts(decomposed),
            pending_unbacked_kept(find_shape_env(decomposed)),
        ):
            return self._lower(decomposed, staging, name, options, methods or {})

    def _lower(
        self,
        decomposed: ExportedProgram,
        staging: pathlib.Path,
        name: str,
        options: ExportOptions,
        extra: Mapping[str, Any],
    ) -> LoweredTarget:
        from executorch.exir import to_edge_transform_and_lower

        external = _external_weights(decomposed, options)
        methods: dict[str, Any] = {RANGES_METHOD: encode_input_ranges(input_specs(decomposed))}
        if external:
            methods[DATA_FILE_METHOD] = [1]
        for key, text in options.file_metadata:
            methods[key] = list(text.encode())
        methods.update(extra)
        try:
            with (
                pruned_backend_passes(options.prune_backend_passes) as pruning,
                _tagged(decomposed, name, external),
            ):
                edge = to_edge_transform_and_lower(
                    decomposed_once(decomposed),
                    transform_passes=_edge_passes(options),
                    partitioner=[_xnnpack_partitioner()],
                    constant_methods=methods,
                )
        except Exception as exc:
            raise self._diagnose(decomposed, exc, "lowering (to_edge_transform_and_lower)") from exc
        lowered = edge.exported_program()
        # A constant the edge passes left without a reader (``cat([torch.tensor([]), x])`` loses
        # its empty operand) is still serialized; a 0-byte one makes ExecuTorch 1.4.1 refuse the
        # file (tensor parser error 0x23 at load). Nothing reads it: drop it.
        drop_dead_constants(lowered)
        delegation = DelegationReport.from_graph_module(lowered.graph_module)
        try:
            et = edge.to_executorch(backend_config(lowered))
        except Exception as exc:
            raise self._diagnose(decomposed, exc, "serialization (to_executorch)") from exc
        path = staging / f"{name}.pte"
        with open(path, "wb") as f:
            et.write_to_file(f)
        files = [path]
        if external:
            et.write_tensor_data_to_file(str(staging))  # <tag>.ptd, the tag being the name
            files.append(staging / f"{name}{DATA_SUFFIX}")
        del et
        release_lowered_payloads(lowered.graph_module)
        ops = tuple(sorted({op_name(n) for n in lowered.graph.nodes if n.op == "call_function"}))
        return LoweredTarget(
            target=self.target,
            files=tuple(files),
            ops=ops,
            delegation=delegation,
            weight_notes=self.weight_notes(decomposed),
            derived_copies=derived_weights(decomposed),
            kept_tensors=_kept_tensors(lowered),
            backend_passes=pruning(),
        )


def _weight_placeholders(program: ExportedProgram) -> list[torch.fx.Node]:
    """Placeholders of weights XNNPACK may keep as named data: parameters, buffers forward never
    mutates, lifted constants."""
    sig = program.graph_signature
    mutated = set(sig.buffers_to_mutate.values())
    names = {
        **sig.inputs_to_parameters,
        **sig.inputs_to_lifted_tensor_constants,
        **{k: v for k, v in sig.inputs_to_buffers.items() if v not in mutated},
    }
    return [n for n in program.graph.nodes if n.op == "placeholder" and n.name in names]


def _external_weights(program: ExportedProgram, options: ExportOptions) -> bool:
    if options.xnnpack_external_data is not None:
        return options.xnnpack_external_data
    total = 0
    for n in _weight_placeholders(program):
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            total += val.numel() * val.element_size()
    return total >= options.external_weights_above


@contextlib.contextmanager
def _tagged(program: ExportedProgram, tag: str, on: bool) -> Iterator[None]:
    """Program-data separation (ExecuTorch 1.4.1): the XNNPACK node visitor stores a weight
    whose placeholder carries ``meta["custom"]["delegate_constant_tag"]`` under that tag, which
    ``write_tensor_data_to_file`` writes as ``<tag>.ptd``. The tag sits on the XNNPACK program's
    own placeholders (never the shared program's) for the lowering only."""
    nodes = _weight_placeholders(program) if on else []
    for node in nodes:
        node.meta.setdefault("custom", {})["delegate_constant_tag"] = tag
    try:
        yield
    finally:
        for node in nodes:
            node.meta.get("custom", {}).pop("delegate_constant_tag", None)


def backend_config(lowered: ExportedProgram) -> Any:
    """The serialization config of a lowered program. ExecuTorch memory-plans mutable buffers and
    leaves them uninitialized unless told otherwise: a counter or cache that starts non-zero
    would silently start from garbage. A buffer updated at a few positions (a KV cache's rows)
    is written in place: ExecuTorch's reinplace pass turns the functional index_put into
    index_put_ on the buffer, where it would otherwise copy the whole buffer out and back every
    call."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    sig = lowered.graph_signature
    mutated = set(sig.buffers_to_mutate.values())
    patterns = [ph for ph, buf in sig.inputs_to_buffers.items() if buf in mutated]
    return ExecutorchBackendConfig(
        passes=[InitializedMutableBufferPass(patterns)] if patterns else [],
        run_reinplace_pass=bool(patterns),
    )


def lower_to_buffer(program: ExportedProgram, edit: Callable[[Any], None] | None = None) -> bytes:
    """Lower ``program`` with the XNNPACK partitioner and return the .pte bytes (the debug
    lowering of localization: no file, no ranges method, the same size-oblivious setting);
    ``edit`` sees the edge program manager before serialization (e.g. to strip taps)."""
    from executorch.exir import to_edge_transform_and_lower

    with (
        torch.no_grad(),
        size_oblivious(),
        walk_cia_ops_once_per_change(),
        pruned_backend_passes(),
        xnnpack_workarounds(),
        own_dicts(program),
        pending_unbacked_kept(find_shape_env(program)),
    ):
        edge = to_edge_transform_and_lower(program, partitioner=[_xnnpack_partitioner()])
        if edit is not None:
            edit(edge)
        buffer = edge.to_executorch(backend_config(edge.exported_program())).buffer
    release_lowered_payloads(edge.exported_program().graph_module)  # see its docstring: a leak
    return buffer


def release_lowered_payloads(graph_module: torch.fx.GraphModule) -> None:
    """Drop the delegate payloads (XNNPACK blob, named weight data) of a lowered program once
    its file is written.

    Why: the lowered module sits in a reference cycle that outlives ``gc.collect()`` (measured
    with ExecuTorch 1.4.1: every ``to_edge_transform_and_lower`` leaves one copy of the weights
    alive after the program is dropped), so without this each export keeps ~1x its weights.
    """
    drop_lowered_payloads(graph_module)


def _kept_tensors(lowered: ExportedProgram) -> dict[str, Any]:
    """Tensors the lowered (post-delegation) program still holds, by name; for invariant 2."""
    out: dict[str, Any] = {}
    for source in (lowered.state_dict, lowered.constants):
        for key, value in source.items():
            if isinstance(value, torch.Tensor):
                out[key] = getattr(value, VIEW_OF, value)  # an untied view: the holder's tensor
    return out
