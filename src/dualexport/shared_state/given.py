"""A program the user already holds (an ExportedProgram, or one loaded from a ``.pt2``) as the
shared program: which programs can serve, their example inputs, and their dynamic ranges as a
``torch.export`` spec.

Why a program is taken as it is and not traced again: it is the most natural input there is (from
``torch.export.export``, ``torch.export.load``, a quantization flow or another tool), and tracing
its ``module()`` again would make a second program with a second dict, which is the state_dict
split this project exists to remove. What a program cannot tell us is checked instead: whether it
was exported from a module in training mode (its files would compute batch statistics and random
dropout), whether it is still an ATen program (an ExecuTorch edge program cannot feed ONNX), and
which inputs it takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.export import ExportedProgram

from ..compat.torch import pytree, value_ranges
from ..errors import InputError
from .contract import check_input_shapes
from .nodes import describe_node
from .request import check_containers

__all__ = ["check_program", "program_inputs", "program_dynamic_shapes", "align_shape_env"]

#: Dialects a target can lower: torch.export's own output and its run_decompositions().
_DIALECTS = ("TRAINING", "ATEN")

#: op -> index of its ``training``/``train`` argument: True means the program computes training
#: numbers (batch statistics and updated running stats, random dropout).
_TRAINING_FLAG = {
    "aten.batch_norm.default": 5,
    "aten.native_batch_norm.default": 5,
    "aten._native_batch_norm_legit_functional.default": 5,
    "aten.dropout.default": 2,
    "aten.native_dropout.default": 2,
    "aten.feature_dropout.default": 2,
    "aten.alpha_dropout.default": 2,
    "aten.feature_alpha_dropout.default": 2,
}
#: ops that exist only in training: the non-functional BatchNorm with batch statistics.
_TRAINING_OPS = ("aten._native_batch_norm_legit.default",)


def _training_nodes(program: ExportedProgram) -> list[torch.fx.Node]:
    found = []
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        name = str(node.target)
        index = _TRAINING_FLAG.get(name)
        if index is not None:
            flag = node.args[index] if len(node.args) > index else node.kwargs.get("train", False)
            if flag is True:
                found.append(node)
        elif name in _TRAINING_OPS:
            found.append(node)
    return found


def check_program(program: Any) -> None:
    """Refuse a program no target can serve from, saying what to do instead."""
    if not isinstance(program, ExportedProgram):
        raise InputError(
            f"expected a torch.export.ExportedProgram, got {type(program).__name__}",
            hint="pass the result of torch.export.export(...) or torch.export.load('model.pt2')",
        )
    dialect = getattr(program, "dialect", None) or getattr(program.verifier, "dialect", None)
    if dialect not in _DIALECTS:
        raise InputError(
            f"the program is in the {dialect} dialect; both targets lower an ATen program "
            "(torch.export's output, or its run_decompositions())",
            hint="pass the ExportedProgram from torch.export.export, before to_edge() or any "
            "backend lowering",
        )
    training = _training_nodes(program)
    if training:
        raise InputError(
            f"the program was exported from a model in training mode: {len(training)} node(s) "
            f"compute training numbers (BatchNorm batch statistics, active dropout), the first "
            f"{describe_node(training[0])}; its artifacts would not compute what the model does "
            "in inference",
            hint="call model.eval() before torch.export.export, or pass the module itself to "
            "dx.export (it is traced in eval mode)",
        )


def _structure_text(spec: Any) -> str:
    text = str(spec).replace("\n", " ")
    return text if len(text) <= 200 else text[:197] + "..."


def program_inputs(
    program: ExportedProgram, args: Any, kwargs: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inputs the export runs and checks with: ``args``/``kwargs`` when given, else the
    program's own ``example_inputs``; refused when there are none or when they do not fit the
    program (structure, tensor count, dtype, a static size or a declared range)."""
    if args is None:
        if kwargs is not None:
            raise InputError(
                "kwargs were given without args",
                hint="pass args too (an empty tuple when every input is a keyword)",
            )
        example = getattr(program, "example_inputs", None)
        if example is None:
            raise InputError(
                "the program carries no example inputs (example_inputs is None) and no args were given",
                hint="pass args, e.g. dx.export(program, (x,)), or save a program exported with "
                "example inputs (torch.export.export keeps them; torch.export.save stores them)",
            )
        args, kwargs = example
        label = "the program's example_inputs"
    else:
        label = "args"
    check_containers(args, kwargs)
    kwargs = dict(kwargs or {})
    expected = program.call_spec.in_spec
    given = pytree.tree_structure((tuple(args), kwargs))
    if expected is not None and given != expected:
        raise InputError(
            f"{label} do not have the structure the program takes: got {_structure_text(given)}, "
            f"the program takes {_structure_text(expected)}",
            hint="pass inputs shaped like the program's example_inputs",
        )
    flat = [x for x in pytree.tree_leaves((tuple(args), kwargs)) if isinstance(x, torch.Tensor)]
    check_input_shapes(program, flat, label)
    return tuple(args), kwargs


def _dim_for(expr: Any, program: ExportedProgram, dims: dict[Any, Any]) -> Any:
    """The torch.export Dim for a symbolic size: a root symbol's range as a named Dim, a linear
    expression of one root (``2*s0 + 1``) as a derived Dim; anything else ``Dim.AUTO`` (the
    pin then refuses any range the re-export would narrow)."""
    import sympy
    from torch.export import Dim

    def root(sym: Any) -> Any:
        if sym not in dims:
            rng = program.range_constraints.get(sym)
            lo = int(rng.lower) if rng is not None else 0
            try:
                hi: int | None = int(rng.upper) if rng is not None else None
            except (TypeError, ValueError, OverflowError):
                hi = None
            name = str(sym) if str(sym).isidentifier() else f"d{len(dims)}"
            dims[sym] = Dim(name, min=lo, max=hi) if hi is not None else Dim(name, min=lo)
        return dims[sym]

    if isinstance(expr, sympy.Symbol):
        return root(expr)
    free = list(getattr(expr, "free_symbols", ()))
    if len(free) == 1:
        sym = free[0]
        poly = sympy.Poly(expr, sym) if expr.is_polynomial(sym) else None
        coeffs = poly.all_coeffs() if poly is not None and poly.degree() == 1 else []
        if coeffs and all(c.is_integer for c in coeffs) and int(coeffs[0]) > 0:
            a, b = int(coeffs[0]), int(coeffs[1])
            derived = root(sym) * a if a != 1 else root(sym)
            return derived + b if b else derived
    return Dim.AUTO


def program_dynamic_shapes(program: ExportedProgram, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The program's declared ranges as a ``torch.export.ShapesCollection`` over ``args`` and
    ``kwargs`` (keyed by those tensors), or None for a static program: what re-exporting its
    ``module()`` (int8 quantization) must declare to keep every range."""
    from torch.export import ShapesCollection
    from torch.export.graph_signature import InputKind

    user = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    flat = pytree.tree_leaves((tuple(args), dict(kwargs)))
    collection = ShapesCollection()
    dims: dict[Any, Any] = {}
    any_dynamic = False
    for value, name in zip(flat, user, strict=False):
        fake = nodes[name].meta.get("val") if name in nodes else None
        if not isinstance(value, torch.Tensor) or not isinstance(fake, torch.Tensor):
            continue
        sizes: list[Any] = list(fake.shape)
        spec = {
            i: _dim_for(size.node.expr, program, dims)
            for i, size in enumerate(sizes)
            if isinstance(size, torch.SymInt)
        }
        if spec:
            collection[value] = spec
            any_dynamic = True
    return collection if any_dynamic else None


def align_shape_env(program: ExportedProgram) -> tuple[str, ...]:
    """Give a deserialized program the shape environment a trace gives, and say what changed.

    Why: torch.export's trace keeps every backed size at least 2 in its shape environment (sizes
    0 and 1 are specialized) while ``range_constraints`` keeps the declared minimum (a
    ``Dim(min=1)`` reads ``[1, 32]`` there and ``[2, 32]`` in the environment); ``torch.export.load``
    rebuilds the environment from ``range_constraints`` (``[1, 32]``, and a derived size such as
    ``2*s0`` as a key of its own, which a trace never has). Every later comparison of
    environments (the pin around each target, a transform's or the int8 re-export's check that
    no declared range narrowed) compares a traced program with this one, and would read the
    trace's own convention as a narrowed range. The declared ranges (``range_constraints``, what
    the files must accept at min, max-1 and max) are left as they are."""
    import sympy

    from .fingerprint import find_shape_env

    env = find_shape_env(program)
    if env is None:
        return ()
    changed = []
    for key in [k for k in env.var_to_range if not isinstance(k, sympy.Symbol)]:
        # a derived size (``2*s0``) has no range of its own in a trace's environment: its
        # range follows from its root's (range_constraints still states it)
        del env.var_to_range[key]
        changed.append(f"{key}: derived, ranged by its root")
    for sym in program.range_constraints:
        vr = env.var_to_range.get(sym) if isinstance(sym, sympy.Symbol) else None
        if vr is None or not vr.lower < 2 <= vr.upper:
            continue
        env.var_to_range[sym] = value_ranges(sympy.Integer(2), vr.upper)
        changed.append(f"{sym}: [{vr.lower}, {vr.upper}] -> [2, {vr.upper}]")
    return tuple(changed)
