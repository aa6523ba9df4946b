"""Small graph edits the passes share: a new lifted constant, a new op node with its fake value,
and reading an op's argument by its schema name.

Why here: a pass that adds a constant must keep the placeholders, the graph signature and
``program.constants`` in step (a program whose placeholder order differs from its input specs
fails validation much later, in a target's lowering), and a node added without ``meta["val"]``
breaks every later pass that reads shapes. One place does both right.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument

from ...compat.torch import (
    OpOverload,
    detect_fake_mode,
    graph_used_names,
    op_schema,
    set_graph_signature,
    updated_program,
)
from .base import ProgramPass
from .signature import output_signature_problems, sync_output_signature

__all__ = [
    "copy_program",
    "lift_constant",
    "OWN_CONSTANT_PREFIXES",
    "drop_dead_constants",
    "drop_dead_code",
    "call",
    "Inserter",
    "argument",
    "constant_value",
    "constant_scalar",
    "fake_mode_of",
    "NodeRewrite",
    "VIEW_OPS",
    "COPY_OPS",
    "shape_of",
    "same_size",
    "mutated_through",
    "structure",
    "replace_all_uses",
    "output_signature_problems",
    "sync_output_signature",
]

aten = torch.ops.aten
#: ops that only reinterpret a tensor's shape (a pattern reads through them)
VIEW_OPS = frozenset({aten.view.default, aten.reshape.default, aten._unsafe_view.default})
#: ops that copy a tensor unchanged (a pattern reads through them)
COPY_OPS = frozenset({aten.clone.default, aten.contiguous.default, aten.alias.default})


def shape_of(node: Any) -> tuple[Any, ...] | None:
    """The shape of a node's traced value (symbolic sizes kept), None for a non-tensor or non-node."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def same_size(a: Any, b: Any) -> bool:
    """Two sizes (or shapes) known equal: the same integer or symbolic expression, or symbolic
    expressions the shape environment proves equal without a guard (BLOOM's ``view(.., -1)``
    leaves ``(s**2)//s`` where the key length ``s`` is meant)."""
    if str(a) == str(b):
        return True
    if isinstance(a, (tuple, list, torch.Size)) and isinstance(b, (tuple, list, torch.Size)):
        return len(a) == len(b) and all(same_size(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        try:
            return bool(statically_known_true(a == b))
        except Exception:
            return False
    return False


def fake_mode_of(program: ExportedProgram) -> Any:
    """The fake mode the program's ``meta["val"]`` tensors live in (None when there is none)."""
    return detect_fake_mode(
        [n.meta["val"] for n in program.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    )


#: Name prefixes of the constants dualexport's passes lift (``lift_constant``'s default and the
#: XNNPACK program's own): a lowered program that keeps them holds what our passes made.
OWN_CONSTANT_PREFIXES: tuple[str, ...] = ("_folded_constant", "_xnnpack_")


def mutated_through(node: torch.fx.Node) -> bool:
    """Whether a user writes into ``node``'s result (or a view of it): then it must stay a view."""
    for user in node.users:
        if user.op != "call_function":
            continue
        schema = op_schema(user.target)
        if schema is not None and schema.is_mutable:
            for arg, value in zip(schema.arguments, user.args, strict=False):
                if value is node and arg.alias_info is not None and arg.alias_info.is_write:
                    return True
        if user.target in VIEW_OPS and mutated_through(user):
            return True
    return False


def lift_constant(
    program: ExportedProgram,
    tensor: torch.Tensor,
    *,
    prefix: str = "_folded_constant",
    meta_from: torch.fx.Node | None = None,
    fake_mode: Any = None,
) -> torch.fx.Node:
    """Add ``tensor`` to ``program`` as a lifted constant (placeholder, input spec and
    ``program.constants`` entry, placed before the user inputs) and return its placeholder."""
    graph = program.graph
    sig = program.graph_signature
    specs = list(sig.input_specs)
    user_idx = next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT), len(specs))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = placeholders[user_idx] if user_idx < len(placeholders) else None
    # FX names a placeholder's argument by its target, and keeps the names of erased nodes
    # reserved (a new node then gets a suffixed name but the asked-for target): both are taken
    taken = set(program.constants) | set(program.state_dict) | {n.name for n in graph.nodes}
    taken |= {n.target for n in graph.nodes if n.op == "placeholder"} | _reserved_names(graph)
    counter = 0
    while f"{prefix}_{counter}" in taken:
        counter += 1
    ctx = graph.inserting_before(anchor) if anchor is not None else graph.inserting_after(placeholders[-1])
    with ctx:
        ph = graph.placeholder(f"{prefix}_{counter}")
    ph.target = ph.name  # the argument, the spec and the constant share one name
    if meta_from is not None:
        ph.meta.update({k: v for k, v in meta_from.meta.items() if k in ("stack_trace", "nn_module_stack")})
    fake_mode = fake_mode if fake_mode is not None else fake_mode_of(program)
    ph.meta["val"] = fake_mode.from_tensor(tensor, static_shapes=True) if fake_mode else tensor
    program.constants[ph.name] = tensor
    specs.insert(
        user_idx,
        InputSpec(
            kind=InputKind.CONSTANT_TENSOR, arg=TensorArgument(name=ph.name), target=ph.name, persistent=None
        ),
    )
    set_graph_signature(program, ExportGraphSignature(input_specs=specs, output_specs=list(sig.output_specs)))
    return ph


def _reserved_names(graph: torch.fx.Graph) -> set[str]:
    """Names FX's namespace has handed out (erased nodes' included)."""
    return graph_used_names(graph)


def drop_dead_constants(program: ExportedProgram) -> None:
    """Lifted constants whose placeholder lost every user: placeholder, spec and value dropped."""
    sig = program.graph_signature
    graph = program.graph
    dead = {
        n.name
        for n in graph.nodes
        if n.op == "placeholder" and not n.users and n.name in sig.inputs_to_lifted_tensor_constants
    }
    if not dead:
        return
    for n in [n for n in graph.nodes if n.op == "placeholder" and n.name in dead]:
        graph.erase_node(n)
    kept = []
    for s in sig.input_specs:
        if s.kind == InputKind.CONSTANT_TENSOR and s.arg.name in dead:
            program.constants.pop(s.target, None)
            continue
        kept.append(s)
    set_graph_signature(program, ExportGraphSignature(input_specs=kept, output_specs=list(sig.output_specs)))


def call(
    graph: torch.fx.Graph,
    op: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    fake_mode: Any = None,
) -> torch.fx.Node:
    """A new ``call_function`` node (at the graph's current insertion point) with its
    ``meta["val"]`` computed from its inputs' fake values."""
    kwargs = dict(kwargs or {})
    node = graph.call_function(op, args, kwargs)
    fake_args, fake_kwargs = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
    if fake_mode is not None:
        with fake_mode:
            node.meta["val"] = op(*fake_args, **fake_kwargs)
    else:
        node.meta["val"] = op(*fake_args, **fake_kwargs)
    return node


class Inserter:
    """Adds nodes one after the other, starting after ``after`` (after the last placeholder when
    ``after`` is one: placeholders stay first)."""

    def __init__(self, graph: torch.fx.Graph, after: torch.fx.Node, fake_mode: Any = None) -> None:
        if after.op == "placeholder":
            after = [n for n in graph.nodes if n.op == "placeholder"][-1]
        self.graph, self.cursor, self.fake_mode = graph, after, fake_mode

    def __call__(
        self, op: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None = None
    ) -> torch.fx.Node:
        with self.graph.inserting_after(self.cursor):
            self.cursor = call(self.graph, op, args, kwargs, fake_mode=self.fake_mode)
        return self.cursor


def drop_dead_code(graph: torch.fx.Graph) -> None:
    """``eliminate_dead_code``, and the dtype asserts (``_assert_tensor_metadata``, from a
    ``.to()`` or ``.float()``) on tensors nothing else reads: they count as side effects and kept
    alive a chain a rewrite had replaced."""
    check = torch.ops.aten._assert_tensor_metadata.default
    while True:
        graph.eliminate_dead_code()
        dead = [
            n
            for n in graph.nodes
            if n.target is check
            and isinstance(n.args[0], torch.fx.Node)
            and all(u.target is check for u in n.args[0].users)
        ]
        if not dead:
            return
        for node in dead:
            graph.erase_node(node)


def replace_all_uses(
    program: ExportedProgram,
    old: torch.fx.Node,
    new: torch.fx.Node,
    *,
    delete_user_cb: Any = None,
) -> list[torch.fx.Node]:
    """``old``'s uses rewired to ``new`` everywhere, the graph's outputs and the program's
    output signature included (``Node.replace_all_uses_with`` alone leaves the signature naming
    ``old`` when it was returned)."""
    kwargs = {} if delete_user_cb is None else {"delete_user_cb": delete_user_cb}
    users = old.replace_all_uses_with(new, **kwargs)
    if any(u.op == "output" for u in users):
        sync_output_signature(program)
    return users


def finish_edit(program: ExportedProgram) -> ExportedProgram:
    """After a pass edited ``program``'s graph: dead code dropped, the graph checked and its code
    regenerated (what every rewrite ends with)."""
    drop_dead_code(program.graph)
    sync_output_signature(program)
    program.graph.lint()
    program.graph_module.recompile()
    return program


def argument(node: torch.fx.Node, name: str, default: Any = None) -> Any:
    """``node``'s argument ``name``, positional or keyword, by the op's schema."""
    if name in node.kwargs:
        return node.kwargs[name]
    schema = op_schema(node.target)
    if schema is None:
        return default
    for i, arg in enumerate(schema.arguments):
        if arg.name == name:
            return node.args[i] if i < len(node.args) and not arg.kwarg_only else default
    return default


def constant_value(program: ExportedProgram, node: Any) -> torch.Tensor | None:
    """The value of a placeholder that is a lifted constant or a buffer forward never mutates."""
    if not isinstance(node, torch.fx.Node) or node.op != "placeholder":
        return None
    sig = program.graph_signature
    name = sig.inputs_to_lifted_tensor_constants.get(node.name)
    if name is not None:
        value = program.constants.get(name)
        return value if isinstance(value, torch.Tensor) else None
    name = sig.inputs_to_buffers.get(node.name)
    if name is not None and name not in set(sig.buffers_to_mutate.values()):
        value = program.state_dict.get(name, program.constants.get(name))
        return value if isinstance(value, torch.Tensor) else None
    return None


def constant_scalar(program: ExportedProgram, node: Any, depth: int = 0) -> float | None:
    """The value of a number, or of a one-element tensor computed from constants only (a lifted
    scalar, or ops on one: DeBERTa's scale is ``sqrt(tensor(E) * factor)``), or None."""
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return float(node)
    if not isinstance(node, torch.fx.Node) or depth > 8:
        return None
    value = constant_value(program, node)
    if value is None and node.op == "call_function" and isinstance(node.target, OpOverload):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.numel() != 1 or val.requires_grad:
            return None
        args: list[Any] = []
        for a in node.args:
            if isinstance(a, torch.fx.Node):
                x = constant_scalar(program, a, depth + 1)
                if x is None:
                    return None
                args.append(torch.tensor(x, dtype=a.meta["val"].dtype))
            else:
                args.append(a)
        with torch.no_grad():
            value = node.target(*args, **node.kwargs)
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.is_complex():
        return None
    return float(value.reshape(()).item())


def structure(node: Any, memo: dict[Any, Any]) -> Any:
    """A hashable description of what ``node`` computes: equal for two chains of the same pure ops
    on the same inputs (T5 builds ``where(mask, position_bias, min)`` anew in every layer, DeBERTa
    ``~mask.bool()``): the passes that compute such a thing once key it by this."""
    if isinstance(node, (list, tuple)):
        return tuple(structure(a, memo) for a in node)
    if isinstance(node, torch.Tensor):  # a repr abbreviates a large tensor: equal only to itself
        return ("tensor", id(node))
    if not isinstance(node, torch.fx.Node):  # scalars, dtypes, devices, symbolic sizes: exact reprs
        return ("value", type(node).__name__, repr(node))
    if node in memo:
        return memo[node]
    if (
        node.op != "call_function"
        or node.is_impure()
        or torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())
    ):
        key: Any = ("node", node)
    else:
        kwargs = tuple(sorted((k, structure(v, memo)) for k, v in node.kwargs.items()))
        key = ("call", node.target, structure(tuple(node.args), memo), kwargs)
    memo[node] = key
    return key


class NodeRewrite(ProgramPass):
    """A pass, in place, that replaces single nodes by one op each: :meth:`rewrite` names the op and
    its arguments for a node it rewrites (None: left as it is); what the old node read and nothing
    else reads any more goes with it."""

    in_place = True

    def rewrite(self, program: ExportedProgram, node: torch.fx.Node) -> tuple[Any, tuple[Any, ...]] | None:
        raise NotImplementedError

    def call(self, program: ExportedProgram) -> ExportedProgram:
        fake_mode = fake_mode_of(program)
        changed = False
        for node in list(program.graph.nodes):
            found = self.rewrite(program, node) if node.op == "call_function" else None
            if found is None:
                continue
            with program.graph.inserting_before(node):
                new = call(program.graph, *found, fake_mode=fake_mode)
            replace_all_uses(program, node, new)
            program.graph.erase_node(node)
            changed = True
        return finish_edit(program) if changed else program


def copy_program(program: ExportedProgram) -> ExportedProgram:
    """A new program with a copy of ``program``'s graph (nodes' metadata shared, the same node
    names) and the same tensors (the same state_dict; a new constants dict holding the same
    tensors). Names are kept as they are: FX's copy renames a node whose name shadows a Python
    builtin (torch.export names the input of ``forward(self, input)`` ``input``; the copy made
    it ``input_1``, and ExecuTorch then refused the program: "Input spec name input does not
    match node name input_1")."""
    gm = program.graph_module
    graph = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    out = graph.graph_copy(gm.graph, copies)
    for old, new in copies.items():
        if new.name != old.name:
            new.name = old.name
            if new.op == "placeholder":
                new.target = old.target
    output = graph.output(out)
    output.meta.update(next(n for n in gm.graph.nodes if n.op == "output").meta)
    new_gm = torch.fx.GraphModule(gm, graph)
    new_gm.meta.update(gm.meta)
    return updated_program(program, new_gm, program.graph_signature, constants=program.constants)
