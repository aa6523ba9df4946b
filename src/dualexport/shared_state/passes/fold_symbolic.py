"""Fold what depends only on a dynamic size: one constant at the largest size, sliced to the
actual size, once it is checked at every size of the declared range.

Why: with a dynamic sequence, a decoder builds its causal mask and its rotary cos/sin tables from
``arange(seq)`` (transformers' mask: ``arange``, ``index``, ``cumsum``, ``eq``, ``le``, ``&``;
about 30 ops on a Llama), so ``FoldConstants`` cannot fold them (their shape is symbolic), and
every call of either runtime recomputes them; none of those integer ops is taken by XNNPACK. Most
such values are prefixes of their value at the largest size (``mask(s) == mask(max)[:s, :s]``),
and then one constant and a ``slice`` per dynamic dim computes them.

That is checked, not assumed: the subgraph is evaluated at every size of the range (not only the
edges) and the fold happens only when each value equals the slice of the largest one, so it is
exact for every input the program accepts. It applies to a value that depends on one dynamic size
and on constants only (never on an input's values, never on a parameter), when its dims are
static or that size, and when checking the whole range stays within ``CHECK_BUDGET`` elements.

A multiplication by a folded all-ones factor (an attention row factor whose rows are never fully
masked, at any size) is then dropped.
"""

from __future__ import annotations

import operator
from typing import Any, cast

import sympy
import torch
from torch.export import ExportedProgram

from .base import ProgramPass
from .fold import _NEVER_FOLD, FOLD_MAX_BYTES, _constant_inputs, _foldable_op, _written
from .graph_edit import (
    call,
    constant_value,
    drop_dead_constants,
    fake_mode_of,
    lift_constant,
    replace_all_uses,
)

__all__ = ["FoldSymbolic", "CHECK_BUDGET"]

aten = torch.ops.aten
#: Elements computed, summed over the sizes of the range, to check one fold (then it is skipped).
CHECK_BUDGET = 200_000_000

_SYM_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg}
_SIZE_OPS = {aten.sym_size.int}


def _hop(node: torch.fx.Node) -> bool:
    """``wrap_with_set_grad_enabled`` / ``wrap_with_autocast``: a submodule run under a context
    (transformers' rotary embedding), foldable when its body is."""
    return node.op == "call_function" and getattr(node.target, "__name__", "") in (
        "wrap_with_set_grad_enabled",
        "wrap_with_autocast",
    )


def _free_symbols(val: Any) -> set[sympy.Symbol]:
    out: set[sympy.Symbol] = set()
    if isinstance(val, torch.Tensor):
        for s in val.shape:
            if isinstance(s, torch.SymInt):
                out |= s.node.expr.free_symbols
    elif isinstance(val, torch.SymInt):
        out |= val.node.expr.free_symbols
    elif isinstance(val, (tuple, list)):
        for v in val:
            out |= _free_symbols(v)
    return out


class _Evaluator:
    """Runs the shape-only subgraph with the dynamic size set to a value."""

    def __init__(self, program: ExportedProgram, nodes: list[torch.fx.Node], symbol: sympy.Symbol) -> None:
        self.gm = program.graph_module
        self.nodes = nodes
        self.symbol = symbol
        self.constants = {
            n: v
            for n in program.graph.nodes
            if n.op == "placeholder"
            for v in [constant_value(program, n)]
            if v is not None
        }

    def _size(self, expr: Any, value: int) -> int:
        if isinstance(expr, int):
            return expr
        return int(expr.node.expr.subs(self.symbol, value))

    def run(self, value: int, wanted: set[torch.fx.Node]) -> dict[torch.fx.Node, Any]:
        env: dict[torch.fx.Node, Any] = dict(self.constants)
        env.update({n: getattr(self.gm, n.target) for n in self.gm.graph.nodes if n.op == "get_attr"})
        with torch.no_grad():
            for node in self.nodes:
                if node.target in _SIZE_OPS:  # the size of a user input: the value being checked
                    env[node] = self._size(node.meta["val"], value)
                    continue
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
                env[node] = cast(Any, node.target)(*args, **kwargs)
        return {n: env[n] for n in wanted}


class FoldSymbolic(ProgramPass):
    """Values that depend on one dynamic size only: a constant at the largest size, sliced."""

    serves = "shared"
    in_place = True

    def call(self, program: ExportedProgram) -> ExportedProgram:
        graph = program.graph
        constants = set(_constant_inputs(program))
        user = {
            s.arg.name
            for s in program.graph_signature.input_specs
            if s.kind == torch.export.graph_signature.InputKind.USER_INPUT
        }
        shape_only: set[torch.fx.Node] = set()
        order: list[torch.fx.Node] = []
        for node in graph.nodes:
            if node.op == "placeholder":
                if node.name in constants:
                    shape_only.add(node)
                continue
            if node.op != "call_function":
                continue
            inputs = node.all_input_nodes
            if node.target in _SIZE_OPS:
                ok = inputs[0].op == "placeholder" and inputs[0].name in user
            elif node.target in _SYM_OPS:
                ok = all(i in shape_only for i in inputs)
            elif _hop(node):
                ok = all(i in shape_only for i in inputs if i.op != "get_attr")
            elif _foldable_op(node):
                ok = all(i in shape_only for i in inputs)
            else:
                ok = False
            if ok:
                shape_only.add(node)
                order.append(node)
        # a metadata assert (dtype, device, layout: not the size) on a shape-only value passed
        # at trace time and would keep the value computed: dropped, as FoldConstants does
        for node in list(graph.nodes):
            if (
                node.op == "call_function"
                and node.target in _NEVER_FOLD
                and all(i in shape_only for i in node.all_input_nodes)
            ):
                graph.erase_node(node)
        # the values this would fold: tensors with a symbolic shape that an input-dependent node reads
        frontier = [
            n
            for n in order
            if isinstance(n.meta.get("val"), torch.Tensor)
            and _free_symbols(n.meta["val"])
            and any(u not in shape_only for u in n.users)
            and not _folded_form(n, constants)
        ]
        changed = False
        fake_mode = fake_mode_of(program)
        sizes: dict[sympy.Symbol, torch.fx.Node] = {}
        written = _written(graph)
        for node in frontier:
            folded = self._fold(program, node, order, fake_mode, sizes, user, node in written)
            changed = changed or folded
        changed = _drop_unit_factors(program) or changed
        if changed:
            graph.eliminate_dead_code()
            drop_dead_constants(program)
            graph.lint()
            program.graph_module.recompile()
        return program

    def _fold(
        self,
        program: ExportedProgram,
        node: torch.fx.Node,
        order: list[torch.fx.Node],
        fake_mode: Any,
        sizes: dict[sympy.Symbol, torch.fx.Node],
        user: set[str],
        written: bool,
    ) -> bool:
        """``node`` as a slice of its value at the range's maximum, when checked at every size. A
        value an in-place op then writes (T5's ``relative_buckets += ...``) is read through a
        copy: writing into the slice would change the constant, and every later call with it."""
        val = node.meta["val"]
        symbols = _free_symbols(val)
        if len(symbols) != 1:
            return False
        (symbol,) = symbols
        dims = [d for d, s in enumerate(val.shape) if not isinstance(s, int)]
        if any(val.shape[d].node.expr != symbol for d in dims):
            return False
        rng = program.range_constraints.get(symbol)
        lo, hi = (_as_int(rng.lower), _as_int(rng.upper)) if rng is not None else (None, None)
        if lo is None or hi is None or hi < lo:
            return False
        per_size = 1
        for s in val.shape:
            per_size *= s if isinstance(s, int) else hi
        if per_size * val.element_size() > FOLD_MAX_BYTES or per_size * (hi - lo + 1) * 4 > CHECK_BUDGET:
            return False
        deps = _ancestors(node, order)
        evaluator = _Evaluator(program, deps, symbol)
        try:
            top = evaluator.run(hi, {node})[node]
            for value in range(lo, hi + 1):
                got = evaluator.run(value, {node})[node]
                want = top[tuple(slice(0, value) if d in dims else slice(None) for d in range(top.dim()))]
                if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
                    return False
        except Exception:  # an op we cannot evaluate eagerly: leave the value computed
            return False
        size = sizes.get(symbol) or _size_node(program, symbol, user, fake_mode)
        if size is None:
            return False
        sizes[symbol] = size
        graph = program.graph
        const = lift_constant(program, top.detach().contiguous().clone(), meta_from=node, fake_mode=fake_mode)
        out: torch.fx.Node = const
        with graph.inserting_before(node):
            for d in dims:
                out = call(graph, aten.slice.Tensor, (out, d, 0, size), fake_mode=fake_mode)
            if written:
                out = call(graph, aten.clone.default, (out,), fake_mode=fake_mode)
        out.meta["val"] = val  # the same symbolic shape as the value it replaces
        replace_all_uses(program, node, out)
        return True


def _folded_form(node: torch.fx.Node, constants: set[str]) -> bool:
    """Whether ``node`` is already what this pass writes (slices of a lifted constant, maybe
    copied): the pass runs twice in the shared pipeline and must not check and fold it again."""
    while node.op == "call_function" and node.target in (aten.slice.Tensor, aten.clone.default):
        first = node.args[0]
        if not isinstance(first, torch.fx.Node):
            return False
        node = first
    return node.op == "placeholder" and node.name in constants


def _as_int(bound: Any) -> int | None:
    try:
        return int(bound)
    except (TypeError, ValueError, OverflowError):
        return None


def _ancestors(node: torch.fx.Node, order: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """The shape-only nodes ``node`` depends on (itself included), in graph order."""
    needed: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in needed or n.op == "placeholder":
            continue
        needed.add(n)
        stack.extend(n.all_input_nodes)
    return [n for n in order if n in needed]


def _size_node(
    program: ExportedProgram, symbol: sympy.Symbol, user: set[str], fake_mode: Any
) -> torch.fx.Node | None:
    """A node that holds the dynamic size ``symbol``: an existing ``sym_size`` or a new one."""
    graph = program.graph
    for n in graph.nodes:
        v = n.meta.get("val")
        if (
            n.op == "call_function"
            and n.target in _SIZE_OPS
            and isinstance(v, torch.SymInt)
            and v.node.expr == symbol
        ):
            return n
    for n in graph.nodes:
        v = n.meta.get("val")
        if n.op != "placeholder" or n.name not in user or not isinstance(v, torch.Tensor):
            continue
        for d, s in enumerate(v.shape):
            if isinstance(s, torch.SymInt) and s.node.expr == symbol:
                last = [p for p in graph.nodes if p.op == "placeholder"][-1]
                with graph.inserting_after(last):
                    node = graph.call_function(aten.sym_size.int, (n, d))
                node.meta["val"] = s
                return node
    return None


def _ones(program: ExportedProgram, node: Any) -> bool:
    """``node`` is (a slice of) a constant whose every value is 1."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is aten.slice.Tensor:
        node = node.args[0]
    value = constant_value(program, node)
    return value is not None and value.is_floating_point() and bool((value == 1).all())


def _drop_unit_factors(program: ExportedProgram) -> bool:
    """``x * ones`` (broadcast not widening ``x``) -> ``x``."""
    changed = False
    for node in list(program.graph.nodes):
        if node.op != "call_function" or node.target is not aten.mul.Tensor or len(node.args) != 2:
            continue
        x, factor = node.args
        if not isinstance(x, torch.fx.Node) or not _ones(program, factor):
            continue
        xv, out = x.meta.get("val"), node.meta.get("val")
        if not isinstance(xv, torch.Tensor) or not isinstance(out, torch.Tensor):
            continue
        if xv.dtype != out.dtype or len(xv.shape) != len(out.shape):
            continue
        if any(str(a) != str(b) for a, b in zip(xv.shape, out.shape, strict=True)):
            continue
        replace_all_uses(program, node, x)
        changed = True
    return changed
