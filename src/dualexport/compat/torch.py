"""torch's private symbols dualexport reaches (``SEAMS`` lists each), behind small functions.

Why: see the package docstring. torch is already loaded wherever these are called, so the module
imports it at the top; the torch.onnx internals and the quantized ops library are imported in
the functions that need them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch._ops import OpOverload
from torch.nn.modules.batchnorm import _BatchNorm as BatchNormBase
from torch.utils import _pytree as pytree

from . import Seam
from .patching import patched

__all__ = [
    "SEAMS",
    "BatchNormBase",
    "check_fact",
    "OpOverload",
    "backed_size_oblivious",
    "cia_registrations",
    "detect_fake_mode",
    "repair_user_links",
    "dim_like_types",
    "graph_used_names",
    "is_annotated",
    "is_contiguous_or_false",
    "non_persistent_buffers",
    "onnx_default_opset",
    "pending_unbacked_kept",
    "onnx_prepare_for_export",
    "onnx_program",
    "onnx_registry",
    "op_schema",
    "pytree",
    "register_quantized_decomposed",
    "set_graph_module",
    "patched_cia_materializer",
    "set_graph_signature",
    "set_range_constraints",
    "set_weight_dicts",
    "size_functions",
    "updated_program",
    "value_ranges",
    "weight_dicts",
]

_EP = "torch.export.exported_program.ExportedProgram"

SEAMS: tuple[Seam, ...] = (
    Seam(
        f"{_EP}._state_dict",
        "the weight link: a decomposed program reads the holder's dict",
        "set_weight_dicts",
    ),
    Seam(f"{_EP}._constants", "the weight link for lifted constants", "set_weight_dicts"),
    Seam(f"{_EP}._graph_module", "adopt the module an FX transform returned", "set_graph_module"),
    Seam(f"{_EP}._graph_signature", "a lifted or dropped constant's input spec", "set_graph_signature"),
    Seam(
        f"{_EP}._range_constraints",
        "put back the ranges a target's pin saw narrowed",
        "set_range_constraints",
    ),
    Seam(f"{_EP}._update", "a program over a rewritten graph module, same signature", "updated_program"),
    Seam(
        "torch.fx.graph.Graph._graph_namespace", "names FX handed out (erased nodes' too)", "graph_used_names"
    ),
    Seam(
        "torch.fx.graph._Namespace._used_names", "names FX handed out (erased nodes' too)", "graph_used_names"
    ),
    Seam("torch._guards.detect_fake_mode", "the fake mode of a program's meta values", "detect_fake_mode"),
    Seam("torch._ops.OpOverload", "is a call_function target an ATen-style op", "OpOverload"),
    Seam("torch._ops.OpOverload._schema", "an op's arguments, mutability and aliasing", "op_schema"),
    Seam("torch.utils._pytree.tree_flatten", "flatten inputs the way torch.export does", "pytree"),
    Seam("torch.utils._pytree.tree_unflatten", "rebuild inputs the way torch.export does", "pytree"),
    Seam("torch.utils._pytree.tree_leaves", "the tensors of nested inputs", "pytree"),
    Seam("torch.utils._pytree.tree_structure", "compare input structures", "pytree"),
    Seam("torch.utils._sympy.value_ranges.ValueRanges", "a symbol's range in the shape env", "value_ranges"),
    *(
        Seam(f"torch.utils._sympy.functions.{name}", "read a guard torch.export printed", "size_functions")
        for name in ("FloorDiv", "CeilDiv", "Mod", "PythonMod", "Max", "Min")
    ),
    Seam(
        "torch.export.dynamic_shapes._DimHint", "Dim.AUTO/STATIC in a dynamic_shapes spec", "dim_like_types"
    ),
    Seam(
        "torch.export.dynamic_shapes._DerivedDim", "derived dims in a dynamic_shapes spec", "dim_like_types"
    ),
    Seam(
        "torch._prims_common.is_contiguous_or_false", "contiguity without a guard", "is_contiguous_or_false"
    ),
    Seam(
        "torch.fx.experimental._config.patch",
        "backed_size_oblivious while ExecuTorch lowers",
        "backed_size_oblivious",
    ),
    Seam("torch.nn.modules.batchnorm._BatchNorm", "any BatchNorm module", "BatchNormBase"),
    Seam("torch._check", "a fact about a symbolic value, for the capture", "check_fact"),
    Seam(
        "torch.nn.modules.module.Module._non_persistent_buffers_set",
        "buffers not in state_dict",
        "non_persistent_buffers",
    ),
    Seam(
        "torchao.quantization.pt2e.quantizer.quantizer.QuantizationAnnotation._annotated",
        "did the quantizer annotate this node",
        "is_annotated",
    ),
    Seam(
        "torch.ao.quantization.fx._decomposed",
        "defines quantized_decomposed ops",
        "register_quantized_decomposed",
    ),
    Seam(
        "torch.fx.experimental.symbolic_shapes.ShapeEnv.pending_fresh_unbacked_symbols",
        "a lowering's trace leaves its unbacked sizes pending in the program's shape env",
        "pending_unbacked_kept",
    ),
    Seam(
        "torch.onnx._constants.ONNX_DEFAULT_OPSET", "torch.onnx.export's default opset", "onnx_default_opset"
    ),
    Seam("torch.onnx._internal.exporter._registration.ONNXRegistry", "torchlib's table", "onnx_registry"),
    Seam(
        "torch.onnx._internal.exporter._core._prepare_exported_program_for_export",
        "torch.onnx's decomposition, run once as the ONNX target's decomposition",
        "onnx_prepare_for_export",
    ),
    Seam(
        "torch.onnx._internal.exporter._core._exported_program_to_onnx_program",
        "translate the decomposed program (no second decomposition)",
        "onnx_program",
    ),
    Seam(
        "torch._export.utils._materialize_cpp_cia_ops",
        "the CIA walk skipped while unchanged",
        "patched_cia_materializer",
    ),
    Seam(
        "torch._C._dispatch_get_registrations_for_dispatch_key",
        "the dispatcher's CIA registrations (the walk's key)",
        "cia_registrations",
    ),
)


# ---------------------------------------------------------------------- ExportedProgram slots
def weight_dicts(program: torch.export.ExportedProgram) -> tuple[dict[str, Any], dict[str, Any]]:
    """The program's own state_dict and constants dicts (the objects its properties return)."""
    return program._state_dict, program._constants


def set_weight_dicts(
    program: torch.export.ExportedProgram,
    state_dict: dict[str, Any] | None = None,
    constants: dict[str, Any] | None = None,
) -> None:
    """Make the program hold these dicts (None leaves one as it is). torch has no public setter:
    ``state_dict`` and ``constants`` are read-only properties over these slots."""
    if state_dict is not None:
        program._state_dict = state_dict
    if constants is not None:
        program._constants = constants


def set_graph_module(program: torch.export.ExportedProgram, graph_module: torch.fx.GraphModule) -> None:
    """Make ``graph_module`` the program's module (same signature and weights)."""
    program._graph_module = graph_module


def set_range_constraints(program: torch.export.ExportedProgram, constraints: dict[Any, Any]) -> None:
    """Make the program hold these range constraints (``range_constraints`` is a read-only
    property over this slot): a pin puts back what a target's lowering narrowed."""
    program._range_constraints = constraints


def set_graph_signature(program: torch.export.ExportedProgram, signature: Any) -> None:
    """Replace the program's graph signature in place (after adding or dropping an input)."""
    program._graph_signature = signature


def updated_program(
    program: torch.export.ExportedProgram,
    graph_module: torch.fx.GraphModule,
    signature: Any,
    constants: Mapping[str, Any] | None = None,
) -> torch.export.ExportedProgram:
    """A new program over ``graph_module`` with the program's weights and range constraints."""
    kwargs = {} if constants is None else {"constants": dict(constants)}
    return program._update(graph_module, signature, **kwargs)


# ----------------------------------------------------------------------------- FX and ops
def graph_used_names(graph: torch.fx.Graph) -> set[str]:
    """Names FX's namespace has handed out in ``graph`` (erased nodes' included)."""
    namespace = getattr(graph, "_graph_namespace", None)
    return set(getattr(namespace, "_used_names", ()))


def repair_user_links(graph: torch.fx.Graph) -> int:
    """Add each node to the ``users`` of every node it reads where the link is missing; how many
    were added.

    Why: torch.export 2.13 can hand back a graph whose nodes disagree about who reads whom (a
    transformers ESM classifier: the pooler's ``select`` reads the encoder's last ``layer_norm``,
    which is also an output, and that ``layer_norm`` does not list it). Every later graph edit that
    erases or rewires the reader (dead-code elimination, ``replace_all_uses_with``) then fails
    inside FX with ``KeyError`` on the missing entry.
    """
    added = 0
    for node in graph.nodes:
        for read in node.all_input_nodes:
            if node not in read.users:
                read.users[node] = None
                added += 1
    return added


def detect_fake_mode(values: Iterable[Any]) -> Any:
    """The fake mode ``values`` (tensors) live in, or None."""
    return torch._guards.detect_fake_mode(list(values))


def op_schema(target: Any) -> Any:
    """The ``torch.FunctionSchema`` of an op overload, or None for any other call target."""
    return getattr(target, "_schema", None)


def value_ranges(lower: Any, upper: Any) -> Any:
    """A ``ValueRanges(lower, upper)`` for a shape environment's ``var_to_range``."""
    from torch.utils._sympy.value_ranges import ValueRanges

    return ValueRanges(lower, upper)


def size_functions() -> dict[str, Any]:
    """The sympy functions torch.export writes size guards with (``FloorDiv``, ``Mod``, ...), by
    the names its messages print."""
    from torch.utils._sympy import functions

    return {n: getattr(functions, n) for n in ("FloorDiv", "CeilDiv", "Mod", "PythonMod", "Max", "Min")}


def dim_like_types() -> tuple[type, ...]:
    """The classes a dynamic_shapes entry for one dimension may be (besides int and None)."""
    from torch.export.dynamic_shapes import Dim, _DerivedDim, _DimHint

    return (_DimHint, Dim, _DerivedDim)


def is_contiguous_or_false(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is contiguous, False when that would need a guard on a symbolic size."""
    from torch._prims_common import is_contiguous_or_false as check

    return bool(check(tensor))


def check_fact(condition: Any) -> None:
    """Tell the capture a fact about a symbolic value (a data-dependent size's range), which it
    keeps as a runtime assert: ``torch._check``."""
    torch._check(condition)


@contextmanager
def backed_size_oblivious() -> Iterator[None]:
    """torch.fx's ``backed_size_oblivious`` setting, on within the block."""
    import torch.fx.experimental._config as fx_config

    # ``patch`` is installed on the config module at import time (torch's install_config_module)
    with cast(Any, fx_config).patch(backed_size_oblivious=True):
        yield


@contextmanager
def pending_unbacked_kept(env: Any) -> Iterator[None]:
    """The unbacked sizes pending in the shape env ``env`` (None: a static program) as they were
    before the block.

    Why: a lowering traces the program again (ExecuTorch's edge decomposition), and each
    data-dependent size of that trace (a runner program's ``cache_position[0].item()``) is left
    pending in the program's own shape env once the traced graph is done with it; the next trace
    of the same program (its tapped lowering) then fails on them (``PendingUnbackedSymbolNotFound``,
    torch 2.13)."""
    before = list(env.pending_fresh_unbacked_symbols) if env is not None else []
    try:
        yield
    finally:
        if env is not None:
            env.pending_fresh_unbacked_symbols[:] = before


def non_persistent_buffers(module: torch.nn.Module) -> set[str]:
    """The names of ``module``'s own buffers registered with ``persistent=False``."""
    return set(getattr(module, "_non_persistent_buffers_set", set()))


def is_annotated(annotation: Any) -> bool:
    """Whether a node's ``QuantizationAnnotation`` (torchao's pt2e, which keeps the flag torch.ao
    had) was marked annotated by a quantizer; False for None."""
    return bool(getattr(annotation, "_annotated", False))


def register_quantized_decomposed() -> None:
    """Define torch's ``quantized_decomposed`` op library (defined on import)."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401


# ------------------------------------------------------------------------------ torch.onnx
def onnx_default_opset() -> int:
    """The opset torch.onnx.export writes by default."""
    from torch.onnx import _constants

    return int(_constants.ONNX_DEFAULT_OPSET)


def onnx_registry(opset: int) -> Any:
    """torch.onnx's translation table (torchlib) for ``opset``."""
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry.from_torchlib(opset_version=opset)


def onnx_prepare_for_export(
    program: torch.export.ExportedProgram, registry: Any
) -> torch.export.ExportedProgram:
    """torch.onnx's own decomposition of ``program`` (what torch.onnx.export runs first)."""
    from torch.onnx._internal.exporter import _core

    return _core._prepare_exported_program_for_export(program, registry=registry)


def onnx_program(decomposed: torch.export.ExportedProgram, registry: Any) -> Any:
    """torch.onnx's translation of an already decomposed program (an ``ONNXProgram``)."""
    from torch.onnx._internal.exporter import _core

    return _core._exported_program_to_onnx_program(decomposed, registry=registry)


# ------------------------------------------------------------------- the dispatcher's CIA walk
def patched_cia_materializer(make: Callable[[Callable[[], None]], Callable[[], None]]) -> Any:
    """Within the block, the function torch's ``run_decompositions`` calls to walk the CIA
    registrations is ``make(torch's own)`` (see ``shared_state/dispatch_walk.py``; re-entrant:
    ``compat.patching.patched``)."""
    from torch._export import utils

    return patched(utils, "_materialize_cpp_cia_ops", make)


def cia_registrations() -> tuple[str, ...]:
    """The dispatcher's CompositeImplicitAutograd registrations (one C call)."""
    return tuple(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"))
