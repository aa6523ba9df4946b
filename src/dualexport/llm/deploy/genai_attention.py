"""The genai .onnx's attention as ONNX Runtime's ``GroupQueryAttention`` (``com.microsoft``), the
op onnxruntime-genai's own model builder writes for decoders.

Why: the proven file attends with ``Concat(past, new)``, two ``MatMul`` over the key/value heads'
rows, an additive mask computed from the positions, and ``Softmax``: per layer and token, a copy of
the past, the mask over all keys and five kernels. ``GroupQueryAttention`` is one kernel that takes
the past and the new rows and returns the present, with the causal mask inside.

How: an onnx-ir rewrite of the genai file (after its renames, so the presents keep their names),
matching the attention :func:`dualexport.llm.attention.dualexport_attention` writes, as the
exporter lays it out: ``Reshape(q)``, ``MatMul(., Transpose(Reshape(Concat(past_k, k))))``,
``Mul(scale)``, ``Add(mask)``, ``Softmax``, ``MatMul(., Reshape(Concat(past_v, v)))``, the heads
back to ``[1, S, H * D]``. Taken only where the op computes exactly that: the causal mask alone
(the model's mask function ``kv <= q``; no window, no chunks), no soft-capping, one head size for
keys and values; all layers or none. The deploy proof holds the result to the shared program.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["fuse_group_query_attention"]

logger = logging.getLogger(__name__)

_PASS = ("Identity", "Cast")


def _producer(value: Any) -> Any:
    node = value.producer() if value is not None else None
    while node is not None and node.op_type in _PASS and node.inputs:
        value = node.inputs[0]
        node = value.producer()
    return node


def _one_user(value: Any) -> Any:
    """The one consumer of ``value`` (graph outputs aside), through Identity/Cast."""
    while True:
        users = [node for node, _ in value.uses()]
        if len(users) != 1:
            return None
        node = users[0]
        if node.op_type in _PASS:
            value = node.outputs[0]
            continue
        return node


def _scalar(value: Any) -> float | None:
    const = value.const_value if value is not None else None
    if const is None:
        node = value.producer() if value is not None else None
        if node is None or node.op_type != "Constant":
            return None
        attr = node.attributes.get("value")
        const = attr.value if attr is not None else None
    if const is None:
        return None
    array = const.numpy()
    return float(array.reshape(-1)[0]) if array.size == 1 else None


def _causal_mask(value: Any) -> bool:
    """``value`` is ``(Cast(kv <= q) - 1) * c`` or such rows concatenated."""
    node = _producer(value)
    parts = list(node.inputs) if node is not None and node.op_type == "Concat" else [value]
    for part in parts:
        mul = _producer(part)
        if mul is None or mul.op_type != "Mul":
            return False
        sub = next(
            (_producer(i) for i in mul.inputs if _producer(i) is not None and _producer(i).op_type == "Sub"),
            None,
        )
        if sub is None:
            return False
        allowed = _producer(sub.inputs[0])
        if allowed is None or allowed.op_type != "LessOrEqual":
            return False
    return bool(parts)


def _match(concat_k: Any, concat_v: Any) -> tuple[str, dict[str, Any] | None]:
    """One layer: the nodes the fused op reads and replaces, or why not."""
    reshape_k = _one_user(concat_k.outputs[0])
    trans_k = (
        _one_user(reshape_k.outputs[0]) if reshape_k is not None and reshape_k.op_type == "Reshape" else None
    )
    scores = _one_user(trans_k.outputs[0]) if trans_k is not None and trans_k.op_type == "Transpose" else None
    if scores is None or scores.op_type != "MatMul":
        return "the keys do not reach a MatMul as [Hkv, D, keys]", None
    q_reshape = _producer(scores.inputs[0])
    if q_reshape is None or q_reshape.op_type != "Reshape":
        return "the query is not reshaped into the key/value heads' rows", None
    query = q_reshape.inputs[0]
    shape = query.shape
    if shape is None or len(shape) != 4 or not isinstance(shape[1], int) or not isinstance(shape[3], int):
        return "the query is not [1, H, S, D] with H and D known", None
    scaled = _one_user(scores.outputs[0])
    scale = None
    if scaled is not None and scaled.op_type == "Mul":
        scale = (
            _scalar(scaled.inputs[1]) if scaled.inputs[0] is scores.outputs[0] else _scalar(scaled.inputs[0])
        )
    elif scaled is not None and scaled.op_type == "Add":  # a scale of 1 (folded away by the exporter)
        scaled, scale = scores, 1.0
    if scale is None or scaled is None:
        return "the scores are not scaled by a constant", None
    masked = _one_user(scaled.outputs[0])
    if masked is None or masked.op_type != "Add":
        return "no additive mask after the scaling (soft-capping or another form)", None
    mask = masked.inputs[1] if _producer(masked.inputs[0]) is scaled else masked.inputs[0]
    if not _causal_mask(mask):
        return "the mask is not the causal mask alone (a window, chunks or padding)", None
    soft = _one_user(masked.outputs[0])
    out = _one_user(soft.outputs[0]) if soft is not None and soft.op_type == "Softmax" else None
    if out is None or out.op_type != "MatMul":
        return "no Softmax then MatMul by the values", None
    reshape_v = _producer(out.inputs[1])
    if reshape_v is None or reshape_v.op_type != "Reshape" or _producer(reshape_v.inputs[0]) is not concat_v:
        return "the weights are not multiplied by the past values and the new ones", None
    chain = [out]
    for op in ("Reshape", "Transpose", "Reshape"):
        nxt = _one_user(chain[-1].outputs[0])
        if nxt is None or nxt.op_type != op:
            return "the output heads are not laid out as [1, S, H * D]", None
        chain.append(nxt)
    perm = chain[2].attributes.get("perm")
    if perm is None or list(perm.as_ints()) != [2, 0, 1, 3]:
        return "the output heads are not laid out as [1, S, H * D]", None
    final = chain[3].outputs[0]
    return "", {"query": query, "scale": scale, "final": final, "heads": int(shape[1])}


def fuse_group_query_attention(
    model: Any, layers: int, kv_heads: int, head_dim: int, max_seq_len: int
) -> list[str]:
    """Rewrite every layer of ``model`` (an onnx-ir model of the genai file: ``position_ids`` in,
    ``present.<l>.key/.value`` out as each layer's ``Concat``) to ``GroupQueryAttention``. All or
    none; returns why not (empty when done)."""
    import numpy as np
    import onnx_ir as ir

    graph = model.graph
    plans, why = _plan_layers(graph, layers)
    if why:
        return why
    heads = {plan["heads"] for _, _, _, plan in plans}
    if len(heads) != 1:
        return ["layers of different head counts"]
    heads_n = heads.pop()
    position_ids = next((v for v in graph.inputs if v.name == "position_ids"), None)
    if position_ids is None:
        return ["the file has no position_ids input"]

    def const(name: str, array: Any) -> Any:
        out = ir.Value(name=name)
        graph.insert_before(graph[0], ir.node("Constant", [], {"value": ir.tensor(array)}, outputs=[out]))
        return out

    lengths = _sequence_lengths(ir, np, graph, position_ids, const)
    flat_q = const("dx_gqa_q_shape", np.array([1, -1, heads_n * head_dim], dtype=np.int64))
    flat_kv = const("dx_gqa_kv_shape", np.array([1, -1, kv_heads * head_dim], dtype=np.int64))
    rotary = _rotary_plan(plans, position_ids, head_dim, max_seq_len)
    attrs: dict[str, Any] = {"num_heads": heads_n, "kv_num_heads": kv_heads}
    extra: list[Any] = []
    if rotary is not None:  # the model's rotary embedding, as GQA's (rotate-half, cos/sin tables)
        for n, table in zip(("cos", "sin"), rotary["tables"], strict=True):
            value = ir.Value(name=f"dx_gqa_{n}_cache", const_value=ir.tensor(table, name=f"dx_gqa_{n}_cache"))
            graph.register_initializer(value)
            extra.append(value)
        attrs.update(do_rotary=1, rotary_interleaved=0)
    for layer, ck, cv, plan in plans:
        if rotary is not None:
            q_in, k_in = rotary["q"][layer], rotary["k"][layer]
        else:
            q_in, k_in = plan["query"], ck.inputs[1]
        _rewrite_layer(
            ir, graph, layer, ck, cv, plan, (q_in, k_in), (flat_q, flat_kv), [*lengths, *extra], attrs
        )
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    RemoveUnusedNodesPass()(model)
    model.opset_imports.setdefault("com.microsoft", 1)
    return []


def _plan_layers(graph: Any, layers: int) -> tuple[list[Any], list[str]]:
    """Each layer's match (its index, both concatenations, :func:`_match`'s plan), or why not."""
    outputs = {v.name: v for v in graph.outputs}
    plans = []
    for layer in range(layers):
        k, v = outputs.get(f"present.{layer}.key"), outputs.get(f"present.{layer}.value")
        ck, cv = (k.producer() if k is not None else None), (v.producer() if v is not None else None)
        if ck is None or cv is None or ck.op_type != "Concat" or cv.op_type != "Concat":
            return [], [f"layer {layer}: the presents are not the attention's concatenations"]
        why, plan = _match(ck, cv)
        if plan is None:
            return [], [f"layer {layer}: {why}"]
        plans.append((layer, ck, cv, plan))
    return plans, []


def _sequence_lengths(ir: Any, np: Any, graph: Any, position_ids: Any, const: Any) -> list[Any]:
    """GQA's ``seqlens_k`` (``[1]``, the keys seen after this call minus one) and
    ``total_sequence_length`` (a scalar): from the last position (positions run on from the past)."""
    last_index = const("dx_gqa_last", np.array([-1], dtype=np.int64))
    scalar_shape = const("dx_gqa_scalar", np.array([], dtype=np.int64))
    one = const("dx_gqa_one", np.array(1, dtype=np.int32))
    batch = const("dx_gqa_batch", np.array([1], dtype=np.int64))
    last, last32, seqlens_k, total_1d, total = (
        ir.Value(name=f"dx_gqa_{n}") for n in ("last_pos", "last32", "seqlens_k", "total_1d", "total")
    )
    graph.insert_before(
        _first_user(graph, position_ids),
        [
            ir.node("Gather", [position_ids, last_index], {"axis": 1}, outputs=[last]),  # [1, 1]
            ir.node("Cast", [last], {"to": ir.DataType.INT32}, outputs=[last32]),
            ir.node("Reshape", [last32, batch], outputs=[seqlens_k]),
            ir.node("Add", [seqlens_k, one], outputs=[total_1d]),
            ir.node("Reshape", [total_1d, scalar_shape], outputs=[total]),
        ],
    )
    return [seqlens_k, total]


def _rewrite_layer(
    ir: Any,
    graph: Any,
    layer: int,
    ck: Any,
    cv: Any,
    plan: dict[str, Any],
    qk: tuple[Any, Any],
    shapes: tuple[Any, Any],
    tail: list[Any],
    attrs: dict[str, Any],
) -> None:
    """One layer's attention as ``GroupQueryAttention``: its output replaces the attention's, its
    presents the concatenations among the graph's outputs."""
    present_k = ir.Value(name=f"present.{layer}.key")
    present_v = ir.Value(name=f"present.{layer}.value")
    out = ir.Value(name=f"dx_gqa{layer}_out")
    past_k, past_v, new_v = ck.inputs[0], cv.inputs[0], cv.inputs[1]
    nodes: list[Any] = []
    q = _flat(ir, nodes, qk[0], shapes[0], f"dx_gqa{layer}_q")
    k = _flat(ir, nodes, qk[1], shapes[1], f"dx_gqa{layer}_k")
    v = _flat(ir, nodes, new_v, shapes[1], f"dx_gqa{layer}_v")
    nodes.append(
        ir.node(
            "GroupQueryAttention",
            [q, k, v, past_k, past_v, *tail],
            {**attrs, "scale": float(plan["scale"])},
            domain="com.microsoft",
            outputs=[out, present_k, present_v],
        )
    )
    final = plan["final"]
    graph.insert_before(final.producer(), nodes)
    final.replace_all_uses_with(out)
    for i, value in enumerate(graph.outputs):
        if value is ck.outputs[0]:
            graph.outputs[i] = present_k
        elif value is cv.outputs[0]:
            graph.outputs[i] = present_v


def _first_user(graph: Any, value: Any) -> Any:
    users = {id(node) for node, _ in value.uses()}
    return next(node for node in graph if id(node) in users)


def _heads(value: Any) -> Any:
    """``value = Transpose(x, [0, 2, 1, 3])`` ([1, H, S, D] from [1, S, H, D]) -> ``x``."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type != "Transpose":
        return None
    perm = node.attributes.get("perm")
    return node.inputs[0] if perm is not None and list(perm.as_ints()) == [0, 2, 1, 3] else None


def _flat(ir: Any, nodes: list[Any], heads_first: Any, shape: Any, name: str) -> Any:
    """``[1, H, S, D]`` as GQA takes it, ``[1, S, H * D]``: the tensor before the model's own
    transpose (and before its reshape, when that was of a ``[1, S, H * D]`` value), else a
    transpose and a reshape written here."""
    x = _heads(heads_first)
    if x is None:
        t = ir.Value(name=f"{name}_t")
        nodes.append(ir.node("Transpose", [heads_first], {"perm": [0, 2, 1, 3]}, outputs=[t]))
        x = t
    node = x.producer()
    if node is not None and node.op_type == "Reshape":
        src = node.inputs[0]
        if src.shape is not None and len(src.shape) == 3 and src.shape[2] == _last(shape):
            return src
    out = ir.Value(name=name)
    nodes.append(ir.node("Reshape", [x, shape], outputs=[out]))
    return out


def _last(shape_value: Any) -> int:
    const = shape_value.producer().attributes["value"].value
    return int(const.numpy()[-1])


def _rotate_half(d: int) -> Any:
    """``R`` with ``x @ R = concat(-x[d/2:], x[:d/2])``: transformers' ``rotate_half``."""
    import numpy as np

    r = np.zeros((d, d), dtype=np.float32)
    h = d // 2
    for i in range(h):
        r[i + h, i] = -1.0
        r[i, i + h] = 1.0
    return r


def _rotary_of(value: Any, d: int) -> tuple[Any, Any, Any] | None:
    """``value = x * cos + (x @ R) * sin`` with ``R`` :func:`_rotate_half` -> (x, cos, sin)."""
    import numpy as np

    add = value.producer() if value is not None else None
    if add is None or add.op_type != "Add" or len(add.inputs) != 2:
        return None
    for first, second in (add.inputs, add.inputs[::-1]):
        m1, m2 = first.producer(), second.producer()
        if m1 is None or m2 is None or m1.op_type != "Mul" or m2.op_type != "Mul":
            continue
        for a, cos in (m1.inputs, m1.inputs[::-1]):
            for b, sin in (m2.inputs, m2.inputs[::-1]):
                mm = b.producer()
                if mm is None or mm.op_type != "MatMul" or mm.inputs[0] is not a:
                    continue
                r = mm.inputs[1].const_value
                if r is None or tuple(r.shape) != (d, d):
                    continue
                if np.array_equal(r.numpy(), _rotate_half(d)):
                    return a, cos, sin
    return None


def _rotary_plan(plans: list[Any], position_ids: Any, d: int, t: int) -> dict[str, Any] | None:
    """Every layer's query and new keys rotated by the same cos/sin of rotate-half form: the
    tensors before rotation and GQA's cos/sin tables (the model's own values at positions
    ``0..T-1``, evaluated here), else None."""
    q_in: list[Any] = []
    k_in: list[Any] = []
    tables: set[tuple[Any, Any]] = set()
    for _, ck, _, plan in plans:
        for value, into in ((plan["query"], q_in), (ck.inputs[1], k_in)):
            found = _rotary_of(value, d)
            if found is None:
                return None
            into.append(found[0])
            tables.add((found[1], found[2]))
    if len(tables) != 1:
        return None
    cos, sin = tables.pop()
    values = _evaluate([cos, sin], position_ids, t)
    if values is None:
        return None
    import numpy as np

    half = d // 2
    out = []
    for table in values:
        flat = table.reshape(t, d)  # [1, 1, T, D] or [1, T, D]: one row per position
        if not np.array_equal(flat[:, :half], flat[:, half:]):
            return None  # not the rotate-half layout of one frequency per pair
        out.append(np.ascontiguousarray(flat[:, :half]))
    return {"q": q_in, "k": k_in, "tables": out}


def _evaluate(values: list[Any], position_ids: Any, t: int) -> list[Any] | None:
    """``values`` computed from ``position_ids = [[0 .. t-1]]`` alone (None when they read any
    other input): the graph's nodes on their path, copied into a model of their own and run."""
    import numpy as np
    import onnx_ir as ir
    import onnxruntime as ort

    order: list[Any] = []
    seen: set[int] = set()

    def visit(value: Any) -> bool:
        if value is position_ids or value.const_value is not None:
            return True
        node = value.producer()
        if node is None:
            return False
        if id(node) in seen:
            return True
        for i in node.inputs:
            if i is not None and not visit(i):
                return False
        seen.add(id(node))
        order.append(node)
        return True

    if not all(visit(v) for v in values):
        return None
    pos = ir.Value(name=position_ids.name, type=position_ids.type, shape=ir.Shape([1, t]))
    mapping: dict[int, Any] = {id(position_ids): pos}
    initializers: list[Any] = []

    def get(value: Any) -> Any:
        if value is None:
            return None
        if id(value) not in mapping:
            const = value.const_value
            copy = ir.Value(
                name=value.name,
                const_value=const,
                type=ir.TensorType(const.dtype),
                shape=ir.Shape(const.shape),
            )
            initializers.append(copy)
            mapping[id(value)] = copy
        return mapping[id(value)]

    nodes = []
    for node in order:
        outs = [ir.Value(name=o.name) for o in node.outputs]
        nodes.append(
            ir.Node(
                node.domain,
                node.op_type,
                [get(i) for i in node.inputs],
                attributes=list(node.attributes.values()),
                outputs=outs,
                version=node.version,
            )
        )
        for o, new in zip(node.outputs, outs, strict=True):
            mapping[id(o)] = new
    owner = position_ids.graph
    graph = ir.Graph(
        [pos],
        [mapping[id(v)] for v in values],
        nodes=nodes,
        initializers=initializers,
        opset_imports=dict(owner.opset_imports),
    )
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=10))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {pos.name: np.arange(t, dtype=np.int64).reshape(1, t)}
    return [np.asarray(o) for o in session.run(None, feed)]
