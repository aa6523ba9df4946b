"""Per-layer localization: the first node of the shared program whose value diverges in a runtime.

Both artifacts come from one ExportedProgram, so values can be aligned by node name:
- reference: every node of the *shared* program, evaluated eagerly (torch.fx Interpreter);
- ONNX Runtime: the artifact *from disk*, with the values torch.onnx named after the FX nodes of
  its decomposed program added as graph outputs (in memory; nothing is written), graph
  optimizations off so fused values still exist;
- ExecuTorch: a debug lowering of the XNNPACK decomposed program with every node tapped
  (ExecuTorch's intermediate_output_tap: taps survive delegation), run in the runtime.
Decomposed nodes are mapped back to shared nodes through their ``from_node`` provenance.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from ..shared_state.dispatch_walk import walk_cia_ops_once_per_change
from ..shared_state.nodes import op_name, user_frame
from .metrics import Metrics
from .report import Divergence
from .tolerances import Tolerance, tolerance_for

__all__ = [
    "reference_values",
    "onnx_values",
    "xnnpack_values",
    "first_divergence",
    "shared_name_map",
    "shared_name_of",
    "TappedXnnpack",
    "TappedOnnx",
]

logger = logging.getLogger(__name__)


def _program_args(
    program: ExportedProgram,
    flat_inputs: Sequence[torch.Tensor],
    state: Mapping[str, torch.Tensor] | None = None,
) -> list:
    """The graph's flat arguments; ``state``: buffers by name that stand for the program's own
    (a cache carried from call to call), taken as they are."""
    user = iter(flat_inputs)
    out = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            out.append(next(user))
        elif spec.kind == InputKind.PARAMETER:
            out.append(program.state_dict[spec.target])
        elif spec.kind == InputKind.BUFFER and state is not None and spec.target in state:
            out.append(state[spec.target])
        elif spec.kind == InputKind.BUFFER:
            # a copy: the graph may update buffers in place, and the holder must not change
            buf = program.state_dict.get(spec.target, program.constants.get(spec.target))
            out.append(buf.clone())
        else:
            out.append(program.constants[spec.target])
    return out


def reference_values(
    program: ExportedProgram, flat_inputs: Sequence[torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Value of every call_function node of ``program`` (tensor outputs only), in graph order."""
    values: dict[str, torch.Tensor] = {}

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            if n.op == "call_function" and isinstance(result, torch.Tensor):
                values[n.name] = result.detach().clone()
            return result

    with torch.no_grad():
        _Recorder(program.graph_module).run(*_program_args(program, flat_inputs))
    return values


def shared_name_of(
    node: torch.fx.Node, shared_names: set[str] | frozenset[str], graph_id: int | None = None
) -> str | None:
    """The shared program's node ``node`` (of a derived program) comes from, through its
    ``from_node`` provenance; None when it comes from none of ``shared_names``.

    With ``graph_id`` (``id`` of the shared program's graph) the node's own name does not count:
    a derived program renames its nodes, so ``linear_3`` there may come from the shared
    ``linear_7`` while a shared ``linear_3`` exists. The source in the shared graph is taken, or,
    when the derivation started from a copy of it (``ExportedProgram.module()``, as torch.onnx's
    decomposition does), the deepest source, which is that copy's node of the same name."""
    if graph_id is None and node.name in shared_names:
        return node.name
    sources = list(node.meta.get("from_node") or [])
    deepest: str | None = None
    while sources:
        src = sources[0]
        if graph_id is None and src.name in shared_names:
            return str(src.name)
        if src.graph_id == graph_id:
            return str(src.name) if src.name in shared_names else None
        deepest = str(src.name)
        sources = list(getattr(src, "from_node", None) or [])
    return deepest if graph_id is not None and deepest in shared_names else None


def shared_name_map(program: ExportedProgram, shared_names: set[str]) -> dict[str, str]:
    """Node of a derived program -> the shared program's node it came from (last one wins)."""
    out: dict[str, str] = {}
    for n in program.graph.nodes:
        if n.op != "call_function":
            continue
        s = shared_name_of(n, shared_names)
        if s is not None:
            out[n.name] = s
    return out


class TappedOnnx:
    """A session over the .onnx at ``path`` with the values ``names`` added as graph outputs (in
    memory), made once and run on any inputs.

    ``deployed``: with the session a runner makes (every graph optimization, weights prepacked,
    the session entries the file records), so fused kernels (``MatMulNBits``) compute the values;
    otherwise graph optimizations are off and every named value still exists."""

    def __init__(self, path: pathlib.Path, names: Sequence[str], *, deployed: bool = False) -> None:
        import json

        import onnx
        import onnxruntime as ort

        from ..exporters.onnx_quant import SESSION_CONFIG_KEY

        model = onnx.load(str(path), load_external_data=True)
        produced = {o for node in model.graph.node for o in node.output}
        existing = {o.name for o in model.graph.output}
        self.own_outputs = len(existing)
        self.names = set(names)
        wanted = [n for n in names if n in produced and n not in existing]
        inferred = onnx.shape_inference.infer_shapes(model)
        infos = {vi.name: vi for vi in inferred.graph.value_info}
        for n in wanted:
            model.graph.output.append(infos[n] if n in infos else onnx.helper.make_empty_tensor_value_info(n))
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if deployed:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            meta = {p.key: p.value for p in model.metadata_props}
            for key, value in json.loads(meta.get(SESSION_CONFIG_KEY, "{}")).items():
                opts.add_session_config_entry(str(key), str(value))
        else:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.session = _session(ort, model, path, opts)
        self.out_names = [o.name for o in self.session.get_outputs()]

    def values(self, flat_inputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every named value found; the file's own outputs under ``"output:<i>"``."""
        import numpy as np

        feed = {
            i.name: np.ascontiguousarray(t.detach().numpy())
            for i, t in zip(self.session.get_inputs(), flat_inputs, strict=False)
        }
        results = self.session.run(None, feed)
        values = {
            n: torch.from_numpy(np.asarray(r))
            for n, r in zip(self.out_names, results, strict=True)
            if n in self.names
        }
        for i in range(self.own_outputs):
            values[f"output:{i}"] = torch.from_numpy(np.asarray(results[i]))
        return values


def onnx_values(
    path: pathlib.Path,
    names: Sequence[str],
    flat_inputs: Sequence[torch.Tensor],
    *,
    deployed: bool = False,
) -> dict[str, torch.Tensor]:
    """The values ``names`` take in the .onnx at ``path`` on ``flat_inputs`` (:class:`TappedOnnx`,
    run once)."""
    return TappedOnnx(path, names, deployed=deployed).values(flat_inputs)


#: protobuf's limit for one message: a larger model goes through a file with external data
_PROTO_LIMIT = 2**31 - 2**26


def _session(ort: Any, model: Any, path: pathlib.Path, opts: Any) -> Any:
    """An ONNX Runtime session over ``model`` (a changed copy of the file at ``path``): from memory,
    or past protobuf's 2 GB from a temporary copy beside the file (inside the export's folder)."""
    import tempfile

    import onnx

    if model.ByteSize() < _PROTO_LIMIT:
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".tapped-") as tmp:
        copy = pathlib.Path(tmp) / path.name
        onnx.save(model, str(copy), save_as_external_data=True, location=path.name + ".data")
        return ort.InferenceSession(str(copy), opts, providers=["CPUExecutionProvider"])


class TappedXnnpack:
    """A debug lowering of a tapped copy of the XNNPACK program (the nodes ``keep`` accepts, else
    every tensor node), lowered once and run on any inputs: ExecuTorch's
    ``intermediate_output_tap`` taps survive delegation."""

    def __init__(
        self,
        decomposed: ExportedProgram,
        keep: Callable[[torch.fx.Node], bool] | None = None,
        same_names: bool = False,
    ) -> None:
        """``same_names``: the tapped copy is a copy of the graph with its nodes' names (a program
        whose unbacked sizes a re-decomposition cannot trace again, as a runner program's cache
        position), else a re-decomposition (its nodes named anew, traced to ``decomposed``'s by
        provenance)."""
        from executorch.devtools.intermediate_output_tap import (
            FULL_TENSOR,
            select_all_call_function,
            strip_taps_,
            tap_intermediate_outputs_,
        )
        from executorch.runtime import Runtime

        from ..exporters.xnnpack import lower_to_buffer, size_oblivious

        if same_names:
            from ..shared_state.passes.graph_edit import copy_program

            copy = copy_program(decomposed)
        else:
            with size_oblivious(), walk_cia_ops_once_per_change():
                copy = decomposed.run_decompositions({})  # a new graph over the same tensors
        base = select_all_call_function()
        self.user_outputs = len(copy.graph_signature.user_outputs)

        def tensor_nodes(n: torch.fx.Node) -> bool:
            return base(n) and isinstance(n.meta.get("val"), torch.Tensor) and (keep is None or keep(n))

        self.program, self.specs = tap_intermediate_outputs_(
            copy, rules=[(tensor_nodes, FULL_TENSOR)], error_on_empty=False
        )
        # a tap's output index counts the program's mutation outputs, which the method does not
        # return (a cache written in place)
        sig = self.program.graph_signature
        self._mutations = len(sig.buffers_to_mutate) + len(sig.user_inputs_to_mutate)
        # the loaded program reads the buffer in place: both live as long as the method
        self._buffer = lower_to_buffer(self.program, strip_taps_)
        self._loaded = Runtime.get().load_program(self._buffer)
        self.method = self._loaded.load_method("forward")

    def reset(self) -> None:
        """A fresh method: a program with mutable buffers (a cache) starts again from their
        initial values."""
        self.method = self._loaded.load_method("forward")

    def values(self, flat_inputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every tap by node name; the copy's own outputs under ``"output:<i>"``."""
        outs = self.method.execute([t.contiguous() for t in flat_inputs])
        at = [(s.node_name, s.output_index - self._mutations) for s in self.specs]
        values = {name: outs[i] for name, i in at if 0 <= i < len(outs) and isinstance(outs[i], torch.Tensor)}
        for i in range(min(self.user_outputs, len(outs))):
            if isinstance(outs[i], torch.Tensor):
                values[f"output:{i}"] = outs[i]
        return values


def xnnpack_values(
    decomposed: ExportedProgram,
    flat_inputs: Sequence[torch.Tensor],
    keep: Callable[[torch.fx.Node], bool] | None = None,
) -> tuple[dict[str, torch.Tensor], ExportedProgram]:
    """Debug-lower a tapped copy of the XNNPACK program and read every tap in the runtime
    (:class:`TappedXnnpack`, run once)."""
    tapped = TappedXnnpack(decomposed, keep)
    return tapped.values(flat_inputs), tapped.program


def first_divergence(
    shared: ExportedProgram,
    reference: Mapping[str, torch.Tensor],
    runtime: str,
    observed: Mapping[str, torch.Tensor],
    name_map: Mapping[str, str],
    *,
    rtol: float | None = None,
    atol: float | None = None,
    node_tolerance: Tolerance | None = None,
) -> Divergence | None:
    """Walk the shared program in order; the first node whose runtime value is out of tolerance."""
    by_shared: dict[str, torch.Tensor] = {}
    for derived, value in observed.items():
        shared_name = name_map.get(derived)
        ref = reference.get(shared_name) if shared_name else None
        if shared_name is not None and ref is not None and tuple(value.shape) == tuple(ref.shape):
            by_shared[shared_name] = value  # later derived nodes of one shared node overwrite
    curve: list[tuple[str, float]] = []
    first: tuple[torch.fx.Node, Metrics] | None = None
    for node in shared.graph.nodes:
        if node.name not in by_shared or node.name not in reference:
            continue
        ref = reference[node.name]
        if not ref.dtype.is_floating_point:
            continue
        tol = node_tolerance or tolerance_for(runtime, ref.dtype, rtol=rtol, atol=atol)
        m = tol.judge(by_shared[node.name].to(ref.dtype), ref)
        curve.append((node.name, m.max_abs))
        if first is None and not m.ok:
            first = (node, m)
    if first is None:
        return None
    node, m = first
    return Divergence(
        runtime=runtime,
        node=node.name,
        op=op_name(node),
        source=user_frame(node),
        metrics=m,
        curve=tuple(curve),
    )
