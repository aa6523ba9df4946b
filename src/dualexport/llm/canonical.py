"""Canonicalizations of a decoder's shared program for its one dynamic size (the new tokens S):
the same values, written in ops XNNPACK delegates with a dynamic dim, so the .pte is one delegate
instead of one or more splits per layer. They run on the shared program (``dx.export``'s
``transforms``), so ONNX, ExecuTorch and the eager reference compute the same graph.

What split a tiny Llama into 25 XNNPACK subgraphs (ExecuTorch 1.4.1's partitioner configs):

* ``view`` with the symbolic size in its shape (``[1, s, -1, 16]``): XNNPACK's static reshape takes
  integer sizes with at most one ``-1``. With one dynamic dim the shape can always say so:
  :func:`views_with_one_dynamic_size` writes the static sizes and ``-1`` for the dynamic one.
* ``mean`` over the last dim (RMSNorm): XNNPACK takes ``mean.dim`` on 4-D over dims (2, 3) only;
  :func:`mean_as_global_pool` reshapes to ``[-1, 1, 1, D]`` around it.
* ``unsqueeze``/``squeeze`` of a tensor with the dynamic dim (rotary's ``cos.unsqueeze(1)``):
  XNNPACK unsqueezes only the last dim; :func:`unsqueeze_as_view` writes them as views.
* rotary's ``rotate_half`` (``cat(-x[..., h:], x[..., :h])``): XNNPACK slices only static shapes;
  :func:`rotate_half_as_linear` writes it as ``linear(x, R)`` with ``R`` the signed permutation
  (one ``±1`` per row: exact), a ``D x D`` buffer.

The cache update and grouped-query attention are written delegable at the source (``cache.py``,
``attention.py``). Every rewrite declines (leaves the node) when its condition does not hold.

(Issue 23 generalizes symbolic reshapes for every model in ``shared_state/passes`` and the XNNPACK
rewrites; these are kept to the decoder program, in this module, until that lands.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument

from ..compat.torch import detect_fake_mode, is_contiguous_or_false, op_schema, set_graph_signature
from ..shared_state.passes.graph_edit import VIEW_OPS, replace_all_uses

__all__ = [
    "views_with_one_dynamic_size",
    "mean_as_global_pool",
    "unsqueeze_as_view",
    "rotate_half_as_linear",
    "distinct_cat_inputs",
    "full_slices_as_identity",
    "true_and_as_identity",
    "DECODER_CANONICALIZATIONS",
]

logger = logging.getLogger(__name__)
aten = torch.ops.aten


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _dynamic_dims(shape: Sequence[Any]) -> list[int]:
    return [i for i, s in enumerate(shape) if not isinstance(s, int)]


def _one_dynamic(shape: Sequence[Any]) -> list[int] | None:
    """``shape`` with ``-1`` at its single dynamic dim; None unless exactly one dim is dynamic."""
    dyn = _dynamic_dims(shape)
    if len(dyn) != 1:
        return None
    return [-1 if i == dyn[0] else int(s) for i, s in enumerate(shape)]


def _fake(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` on the nodes' fake values (the program's own fake mode), for a new node's meta."""
    vals = [_val(a) if isinstance(a, torch.fx.Node) else a for a in args]
    mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if mode is None:
        return None
    with mode:
        return fn(*vals, **kwargs)


def _call(
    graph: torch.fx.Graph, op: Any, args: tuple[Any, ...], like: torch.fx.Node, **kwargs: Any
) -> torch.fx.Node:
    node = graph.call_function(op, args, kwargs)
    node.meta.update({k: v for k, v in like.meta.items() if k in ("stack_trace", "nn_module_stack")})
    node.meta["val"] = _fake(op, *args, **kwargs)
    return node


def _graphs(program: ExportedProgram) -> list[torch.fx.GraphModule]:
    """The program's graph module and those of its higher-order ops (transformers runs the rotary
    embedding under ``torch.no_grad()``, which export keeps as ``wrap_with_set_grad_enabled``)."""
    return [m for m in program.graph_module.modules() if isinstance(m, torch.fx.GraphModule)]


def _finish(program: ExportedProgram, changed: int, what: str) -> ExportedProgram:
    for gm in _graphs(program):
        graph = gm.graph
        for node in list(graph.nodes):  # symbolic sizes the old shapes read
            if node.op == "call_function" and node.target is aten.sym_size.int and not node.users:
                graph.erase_node(node)
        if changed:
            graph.lint()
            gm.recompile()
    if changed:
        logger.info("%s: %d node(s)", what, changed)
    return program


def views_with_one_dynamic_size(program: ExportedProgram) -> ExportedProgram:
    """``view(x, [1, s, -1, 16])`` -> ``view(x, [1, -1, 4, 16])`` where the result has one dynamic
    dim: the same view, with the shape written as XNNPACK's static reshape takes it."""
    changed = 0
    for node in [n for gm in _graphs(program) for n in gm.graph.nodes]:
        if node.op != "call_function" or node.target not in VIEW_OPS:
            continue
        shape = list(node.args[1])
        val = _val(node)
        if all(isinstance(s, int) for s in shape) or not isinstance(val, torch.Tensor):
            continue
        new = _one_dynamic(val.shape)
        if new is None or new == shape:
            continue
        node.args = (node.args[0], new, *node.args[2:])
        changed += 1
    return _finish(program, changed, "views with one dynamic size")


def mean_as_global_pool(program: ExportedProgram) -> ExportedProgram:
    """``mean(x, [-1], keepdim)`` of a float32 ``x`` with one dynamic dim and a static last dim ->
    ``view(mean(view(x, [-1, 1, 1, D]), [2, 3], True), shape)``: the same mean, as the 4-D global
    average pooling XNNPACK takes (a transposed ``x``, as q/k norms see, is copied first: a
    ``reshape`` would decompose to a view with the symbolic size written out)."""
    changed = 0
    for node in [n for gm in _graphs(program) for n in gm.graph.nodes]:
        graph = node.graph
        if node.op != "call_function" or node.target is not aten.mean.dim or node.kwargs.get("dtype"):
            continue
        x = node.args[0]
        xv, out = _val(x), _val(node)
        if not isinstance(xv, torch.Tensor) or not isinstance(out, torch.Tensor) or xv.dtype != torch.float32:
            continue
        rank = xv.dim()
        dims = sorted({d % rank for d in node.args[1]}) if node.args[1] else []
        out_shape = _one_dynamic(out.shape)
        if dims != [rank - 1] or rank < 2 or out_shape is None or not isinstance(xv.shape[-1], int):
            continue
        with graph.inserting_before(node):
            if not is_contiguous_or_false(xv):  # q/k norms of a transposed x: copy, then view
                x = _call(graph, aten.clone.default, (x,), node, memory_format=torch.contiguous_format)
            flat = _call(graph, aten.view.default, (x, [-1, 1, 1, int(xv.shape[-1])]), node)
            pooled = _call(graph, aten.mean.dim, (flat, [2, 3], True), node)
            back = _call(graph, aten.view.default, (pooled, out_shape), node)
        replace_all_uses(program, node, back)
        graph.erase_node(node)
        changed += 1
    return _finish(program, changed, "mean as global pooling")


def unsqueeze_as_view(program: ExportedProgram) -> ExportedProgram:
    """``unsqueeze``/``squeeze`` whose result has one dynamic dim -> a ``view`` to that shape."""
    ops = {aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default}
    changed = 0
    for node in [n for gm in _graphs(program) for n in gm.graph.nodes]:
        if node.op != "call_function" or node.target not in ops:
            continue
        xv, out = _val(node.args[0]), _val(node)
        if not isinstance(xv, torch.Tensor) or not isinstance(out, torch.Tensor):
            continue
        shape = _one_dynamic(out.shape)
        if shape is None or len(_dynamic_dims(xv.shape)) != 1:
            continue
        node.target, node.args, node.kwargs = aten.view.default, (node.args[0], shape), {}
        changed += 1
    return _finish(program, changed, "unsqueeze/squeeze as views")


def _slice_of(node: Any, x: Any, start: int, end: int, dim: int) -> bool:
    if not (isinstance(node, torch.fx.Node) and node.target is aten.slice.Tensor and node.args[0] is x):
        return False
    args: list[Any] = list(node.args) + [None] * (5 - len(node.args))
    xv = _val(x)
    n = xv.shape[-1]
    d, s, e, step = args[1], args[2] or 0, args[3], args[4] or 1
    e = n if e is None or e > n else e
    return bool(d % xv.dim() == dim and s == start and e == end and step == 1)


def _rotate_half(node: torch.fx.Node) -> Any:
    """The ``x`` of ``cat([neg(x[..., h:]), x[..., :h]], -1)``, or None."""
    args: list[Any] = list(node.args)
    if node.target is not aten.cat.default or len(args[0]) != 2:
        return None
    first, second = args[0]
    if not (isinstance(first, torch.fx.Node) and first.target is aten.neg.default):
        return None
    sliced: Any = first.args[0]
    x = sliced.args[0] if isinstance(sliced, torch.fx.Node) and sliced.target is aten.slice.Tensor else None
    xv = _val(x)
    if not isinstance(xv, torch.Tensor) or not isinstance(xv.shape[-1], int) or xv.shape[-1] % 2:
        return None
    rank, n = xv.dim(), int(xv.shape[-1])
    dim = int(args[1] if len(args) > 1 else 0) % rank
    if (
        dim != rank - 1
        or not _slice_of(sliced, x, n // 2, n, dim)
        or not _slice_of(second, x, 0, n // 2, dim)
    ):
        return None
    return x


def _rotation(n: int, dtype: torch.dtype) -> torch.Tensor:
    """``R`` with ``x @ R.T == cat(-x[..., h:], x[..., :h])``."""
    h = n // 2
    r = torch.zeros(n, n, dtype=dtype)
    r[torch.arange(h), torch.arange(h) + h] = -1.0
    r[torch.arange(h) + h, torch.arange(h)] = 1.0
    return r


def _add_buffer(
    program: ExportedProgram, name: str, tensor: torch.Tensor, like: torch.fx.Node
) -> torch.fx.Node:
    """A new persistent buffer of the program (a placeholder before the user inputs, in the
    signature and the state_dict).

    Why a buffer and not a lifted constant: ExecuTorch 1.4.1 pops the lifted constants a delegate
    consumes from the program's ``_constants`` after lowering, and the XNNPACK program shares that
    dict with the shared program (``shared_state/links.py``); its state_dict it does not share."""
    graph = program.graph_module.graph
    sig = program.graph_signature
    specs = list(sig.input_specs)
    user_idx = next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT), len(specs))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    taken = set(program.constants) | set(program.state_dict) | {n.name for n in graph.nodes}
    base, i = name, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    ctx = (
        graph.inserting_before(placeholders[user_idx])
        if user_idx < len(placeholders)
        else graph.inserting_after(placeholders[-1])
    )
    with ctx:
        ph = graph.placeholder(f"b_{name}")
    mode = detect_fake_mode([_val(like)])
    ph.meta["val"] = mode.from_tensor(tensor, static_shapes=True) if mode is not None else tensor
    program.state_dict[name] = tensor
    spec = InputSpec(kind=InputKind.BUFFER, arg=TensorArgument(name=ph.name), target=name, persistent=True)
    set_graph_signature(
        program,
        ExportGraphSignature(
            input_specs=specs[:user_idx] + [spec] + specs[user_idx:], output_specs=list(sig.output_specs)
        ),
    )
    return ph


def _erase_dead(graph: torch.fx.Graph, nodes: Sequence[Any]) -> None:
    for node in nodes:
        if isinstance(node, torch.fx.Node) and node.op == "call_function" and not node.users:
            graph.erase_node(node)


def rotate_half_as_linear(program: ExportedProgram) -> ExportedProgram:
    """Rotary's ``rotate_half(x)`` of a float ``x`` -> ``linear(x, R)``, one ``R`` per size."""
    graph = program.graph_module.graph
    constants: dict[tuple[int, torch.dtype], torch.fx.Node] = {}
    changed = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        x = _rotate_half(node)
        xv = _val(x)
        if x is None or not xv.dtype.is_floating_point:
            continue
        key = (int(xv.shape[-1]), xv.dtype)
        if key not in constants:
            constants[key] = _add_buffer(program, f"rotate_half_{key[0]}", _rotation(*key), node)
        with graph.inserting_before(node):
            linear = _call(graph, aten.linear.default, (x, constants[key]), node)
        replace_all_uses(program, node, linear)
        _erase_dead(graph, [node, *node.args[0], *(a.args[0] for a in node.args[0])])
        changed += 1
    return _finish(program, changed, "rotate_half as linear")


def distinct_cat_inputs(program: ExportedProgram) -> ExportedProgram:
    """``cat([x, x])`` (rotary's ``cat((freqs, freqs))``) of a tensor with one dynamic dim -> the
    second occurrence through a same-shape ``view``: XNNPACK refuses a concatenation that names an
    input twice, and the one where it sits (between the rotary's matmul and its cos/sin) splits
    the delegate."""
    changed = 0
    for node in [n for gm in _graphs(program) for n in gm.graph.nodes]:
        graph = node.graph
        if node.op != "call_function" or node.target is not aten.cat.default:
            continue
        inputs = list(node.args[0])
        if len({id(t) for t in inputs}) == len(inputs):
            continue
        seen: set[int] = set()
        for i, t in enumerate(inputs):
            shape = _one_dynamic(_val(t).shape) if isinstance(_val(t), torch.Tensor) else None
            if id(t) in seen and shape is not None:
                with graph.inserting_before(node):
                    inputs[i] = _call(graph, aten.view.default, (t, shape), node)
            seen.add(id(t))
        node.args = (inputs, *node.args[1:])
        changed += 1
    return _finish(program, changed, "distinct cat inputs")


def full_slices_as_identity(program: ExportedProgram) -> ExportedProgram:
    """A ``slice`` that keeps the whole dim, or an ``alias`` (the logits' ``hidden[:, -0:]``, all
    positions), is its input: XNNPACK refuses both on a dynamic dim, and the lm_head after them
    split off."""
    changed = 0
    for node in [n for gm in _graphs(program) for n in gm.graph.nodes]:
        graph = node.graph
        if node.op != "call_function" or node.target not in (aten.slice.Tensor, aten.alias.default):
            continue
        x = node.args[0]
        xv, out = _val(x), _val(node)
        args = list(node.args) + [None] * (5 - len(node.args))
        if (
            not isinstance(xv, torch.Tensor)
            or not isinstance(out, torch.Tensor)
            or (args[4] or 1) != 1
            or (args[2] or 0) != 0
            or len(_dynamic_dims(xv.shape)) != 1
            or xv.shape != out.shape
            or _mutated(node)
        ):
            continue
        replace_all_uses(program, node, x)
        graph.erase_node(node)
        changed += 1
    return _finish(program, changed, "full slices as identity")


def _all_true(node: Any) -> bool:
    """A ``new_ones``/``ones``/``full(True)`` bool tensor (transformers' ``and_masks`` starts from
    ``q_idx.new_ones((), dtype=bool)``)."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    val = _val(node)
    if not isinstance(val, torch.Tensor) or val.dtype != torch.bool:
        return False
    if node.target in (aten.new_ones.default, aten.ones.default):
        return True
    fill = node.args[1] if node.target is aten.full.default and len(node.args) > 1 else None
    return isinstance(fill, (int, float)) and fill != 0  # a bool is an int


def true_and_as_identity(program: ExportedProgram) -> ExportedProgram:
    """``True & m`` -> ``m`` for a bool ``m`` of the result's shape: transformers' ``and_masks``
    (every sliding-window and chunked mask) starts from an all-true scalar, an op outside the
    XNNPACK delegate (it takes no bool op) once per call."""
    changed = 0
    for node in [n for gm in _graphs(program) for n in gm.graph.nodes]:
        if node.op != "call_function" or node.target not in (aten.__and__.Tensor, aten.bitwise_and.Tensor):
            continue
        out = _val(node)
        for mine, other in ((node.args[0], node.args[1]), (node.args[1], node.args[0])):
            ov = _val(other)
            if (
                _all_true(mine)
                and isinstance(ov, torch.Tensor)
                and isinstance(out, torch.Tensor)
                and ov.dtype == torch.bool
                and ov.shape == out.shape
            ):
                replace_all_uses(program, node, other)
                node.graph.erase_node(node)
                _erase_dead(other.graph, [mine])
                changed += 1
                break
    return _finish(program, changed, "True & mask as the mask")


def _mutated(node: torch.fx.Node) -> bool:
    for user in node.users:
        schema = op_schema(user.target)
        if schema is not None and schema.is_mutable:
            return True
    return False


#: In order: the rotary and the mean make views that the last pass writes in the -1 form.
DECODER_CANONICALIZATIONS: tuple[Callable[[ExportedProgram], ExportedProgram], ...] = (
    true_and_as_identity,
    full_slices_as_identity,
    distinct_cat_inputs,
    rotate_half_as_linear,
    mean_as_global_pool,
    unsqueeze_as_view,
    views_with_one_dynamic_size,
)
