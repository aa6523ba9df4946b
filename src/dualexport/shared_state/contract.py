"""The program's input contract: which tensors it takes, in what order, of which dtype, and for
each dim its static size or its declared range; how that range is encoded into the files; and
the sizes at the edges of every range.

Why in one place, beside the program: both exporters write the ranges into their files, both
runtimes refuse inputs outside them, parity checks its input sets against them, and the target
job proves each file accepts the edges. Four readers of one contract must not hold four copies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram

from ..compat.torch import op_schema, pytree
from ..errors import InputError

__all__ = [
    # the contract
    "InputSpec",
    "input_specs",
    "output_shapes",
    "is_stateful",
    # checks
    "check_against_specs",
    "check_input_shapes",
    # flatten / unflatten
    "flatten_inputs",
    "unflatten_inputs",
    # the ranges in the files
    "RANGES_METHOD",
    "RANGES_METADATA",
    "DATA_FILE_METHOD",
    "DATA_SUFFIX",
    "encode_input_ranges",
    "decode_input_ranges",
    # the edges of every range
    "EdgeSizes",
    "edge_sizes",
]

#: ``{"dtype": "float32", "dims": [4, [1, 64], ...]}``: per dim a static size or ``[lo, hi]``
#: (``hi`` None for unbounded), for each user tensor input in the program's order.
InputSpec = dict[str, Any]

#: A constant method in the .pte returning the encoded ranges (ExecuTorch refuses inputs above
#: its memory-planned maximum on its own, but runs inputs below the minimum).
RANGES_METHOD = "dualexport_input_ranges"
#: The ONNX ``metadata_props`` key holding the ranges as JSON (ONNX cannot state them itself).
RANGES_METADATA = "dualexport.input_ranges"
#: A constant method in the .pte returning ``[1]`` when its XNNPACK weights are in the data file
#: ``<stem>.ptd`` beside it (ExecuTorch 1.4.1 crashes running such a program without the file,
#: so a runner checks first).
DATA_FILE_METHOD = "dualexport_external_data"
DATA_SUFFIX = ".ptd"


def _bound(value: object) -> int | None:
    """A range bound as an int; None for (torch's int_oo) infinity."""
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None


def _user_placeholders(program: ExportedProgram) -> list[torch.fx.Node]:
    from torch.export.graph_signature import InputKind

    user = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return [nodes[name] for name in user if name in nodes]


def input_specs(program: ExportedProgram) -> list[InputSpec]:
    """Per user tensor input: dtype and, per dim, its static size or its declared [lo, hi]."""
    specs: list[InputSpec] = []
    for node in _user_placeholders(program):
        fake = node.meta.get("val")
        if not isinstance(fake, torch.Tensor):
            continue
        dims: list[Any] = []
        for size in fake.shape:
            if isinstance(size, int):
                dims.append(size)
                continue
            rng = program.range_constraints.get(size.node.expr)
            dims.append(
                [
                    (_bound(rng.lower) or 0) if rng is not None else 0,
                    _bound(rng.upper) if rng is not None else None,
                ]
            )
        specs.append({"dtype": str(fake.dtype).replace("torch.", ""), "dims": dims})
    return specs


def is_stateful(program: ExportedProgram) -> bool:
    """Whether running the program changes its buffers (a counter, a KV cache): then every input
    set must start from fresh state in every runtime."""
    if program.graph_signature.buffers_to_mutate:
        return True
    buffers = set(program.graph_signature.inputs_to_buffers)
    for node in program.graph.nodes:
        schema = op_schema(node.target)
        if (
            node.op == "call_function"
            and schema is not None
            and schema.is_mutable
            and any(isinstance(a, torch.fx.Node) and a.name in buffers for a in node.args)
        ):
            return True
    return False


# ----------------------------------------------------------------------------------- checks
def check_against_specs(specs: Sequence[InputSpec], flat: Sequence[torch.Tensor], label: str) -> None:
    """Refuse inputs outside what the program was exported for, naming the dim and its range.

    Why: outside a declared range the eager reference fails with a bare guard assertion, ONNX
    Runtime accepts any size, and ExecuTorch runs sizes below the minimum and refuses those above
    its memory plan with an error code; nothing downstream would say what is wrong.
    """
    if len(specs) != len(flat):
        raise InputError(
            f"{label}: the program takes {len(specs)} tensor inputs, got {len(flat)}",
            hint="pass inputs with the structure of the example inputs",
        )
    for i, (spec, t) in enumerate(zip(specs, flat, strict=True)):
        dims = spec["dims"]
        if len(dims) != t.dim():
            raise InputError(
                f"{label}: input {i} has {t.dim()} dims, the program takes {len(dims)}",
                hint=f"use a shape like {dims}",
            )
        want = spec["dtype"]
        if str(t.dtype).replace("torch.", "") != want:
            raise InputError(
                f"{label}: input {i} is {t.dtype}, the program takes {want}",
                hint=f"convert it with .to(torch.{want})",
            )
        for d, (size, actual) in enumerate(zip(dims, t.shape, strict=True)):
            if isinstance(size, int):
                if size != actual:
                    raise InputError(
                        f"{label}: input {i} dim {d} is {actual}, but it was exported static at {size}",
                        hint="declare the dim dynamic with torch.export.Dim in dynamic_shapes",
                    )
                continue
            lo, hi = size
            if actual < lo or (hi is not None and actual > hi):
                raise InputError(
                    f"{label}: input {i} dim {d} is {actual}, outside the exported range "
                    f"[{lo}, {hi if hi is not None else 'inf'}]",
                    hint="re-export with a wider Dim(min=..., max=...) or pass inputs inside the range",
                )


def check_input_shapes(program: ExportedProgram, flat: Sequence[torch.Tensor], label: str) -> None:
    """:func:`check_against_specs` with the specs read off ``program``."""
    check_against_specs(input_specs(program), flat, label)


# -------------------------------------------------------------------- flatten / unflatten
def flatten_inputs(
    program: ExportedProgram, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None
) -> list[torch.Tensor]:
    """The tensors of (args, kwargs) in the order the exported program (and so ONNX and
    ExecuTorch) takes them."""
    flat, _ = pytree.tree_flatten((tuple(args), dict(kwargs or {})))
    return [x for x in flat if isinstance(x, torch.Tensor)]


def unflatten_inputs(
    program: ExportedProgram, flat: Sequence[torch.Tensor]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Flat input tensors back into (args, kwargs) by the program's input spec."""
    spec = program.call_spec.in_spec
    if spec is None:
        return tuple(flat), {}
    try:
        args, kwargs = pytree.tree_unflatten(list(flat), spec)
    except Exception as exc:
        raise InputError(
            f"{len(flat)} input tensors do not fit the program's inputs: {exc}",
            hint="give one tensor per input, in the order of the example inputs",
        ) from exc
    return tuple(args), dict(kwargs)


# ------------------------------------------------------------------- the ranges in the files
def encode_input_ranges(specs: Sequence[InputSpec]) -> list[int]:
    """[n_inputs, (ndim, (lo, hi) * ndim) * n_inputs]; hi = -1 for unbounded (a .pte constant
    method returns ints only)."""
    out = [len(specs)]
    for spec in specs:
        out.append(len(spec["dims"]))
        for d in spec["dims"]:
            lo, hi = (d, d) if isinstance(d, int) else (d[0], -1 if d[1] is None else d[1])
            out += [int(lo), int(hi)]
    return out


def decode_input_ranges(flat: Sequence[int]) -> list[list[tuple[int, int | None]]]:
    """Inverse of :func:`encode_input_ranges`, per input and dim ``(lo, hi or None)``."""
    it = iter(flat)
    out = []
    for _ in range(next(it)):
        dims = []
        for _ in range(next(it)):
            lo, hi = next(it), next(it)
            dims.append((lo, None if hi < 0 else hi))
        out.append(dims)
    return out


# -------------------------------------------------------------------- the edges of the ranges
@dataclass(frozen=True)
class EdgeSizes:
    """One assignment of every free symbol (``min``, ``max-1``, ``max``) and the input and
    output shapes it gives; ``outputs`` holds None where an output is not a tensor."""

    label: str
    symbols: Mapping[str, int]
    inputs: tuple[tuple[int, ...], ...]
    outputs: tuple[tuple[int, ...] | None, ...]


def _evaluate(shape: Sequence[Any], values: Mapping[Any, int]) -> tuple[int, ...] | None:
    out = []
    for size in shape:
        if isinstance(size, int):
            out.append(size)
            continue
        expr = size.node.expr
        expr = expr.xreplace(values) if hasattr(expr, "xreplace") else expr
        if getattr(expr, "free_symbols", None):
            return None
        out.append(int(expr))
    return tuple(out)


def output_shapes(program: ExportedProgram) -> list[Any]:
    """The fake value of each user output (a tensor with symbolic sizes, or something else)."""
    from torch.export.graph_signature import OutputKind

    out_node = next(n for n in program.graph.nodes if n.op == "output")
    values = out_node.args[0]
    user = {s.arg.name for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT}
    return [v.meta.get("val") for v in values if isinstance(v, torch.fx.Node) and v.name in user]


def edge_sizes(program: ExportedProgram) -> list[EdgeSizes]:
    """Every declared range at its minimum, its maximum minus one and its maximum (all symbols
    at once), with the input shapes and the output shapes each gives.

    Why these three: an artifact whose memory plan or kernel choice was narrowed during lowering
    refuses or miscomputes at the top of the range; the minimum catches specializations that
    assumed a size of at least 2; max-1 catches an off-by-one plan. Unbounded ranges contribute
    only their minimum; a minimum of 0 (``Dim``'s default) is taken as 1.
    """
    import sympy

    roots = {
        k: (_bound(v.lower), _bound(v.upper))
        for k, v in program.range_constraints.items()
        if isinstance(k, sympy.Symbol)
    }
    if not roots:
        return []
    inputs = [n.meta.get("val") for n in _user_placeholders(program)]
    outputs = output_shapes(program)
    edges: list[EdgeSizes] = []
    seen: set[tuple[tuple[int, ...], ...]] = set()
    for label in ("min", "max-1", "max"):
        values: dict[Any, int] = {}
        for sym, (lo, hi) in roots.items():
            lo = max(lo or 0, 1)  # a zero-size batch is declared by Dim's default, not meant
            if label == "min" or hi is None:
                values[sym] = lo
            else:
                values[sym] = max(lo, hi - 1 if label == "max-1" else hi)
        shapes = [_evaluate(t.shape, values) for t in inputs if isinstance(t, torch.Tensor)]
        if any(s is None for s in shapes):
            continue
        key = tuple(s for s in shapes if s is not None)
        if key in seen:
            continue
        seen.add(key)
        outs = tuple(_evaluate(o.shape, values) if isinstance(o, torch.Tensor) else None for o in outputs)
        edges.append(EdgeSizes(label, {str(k): v for k, v in values.items()}, key, outs))
    return edges
