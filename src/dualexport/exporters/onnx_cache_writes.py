"""The ONNX pipeline's rule for a decoder's cache write: the one-hot product that writes new rows
into a fixed-length cache becomes one ``ScatterElements``.

Why: ``export_llm``'s shared program writes the new keys and values as dense ops
(``llm/cache.py``'s ``_Scatter``: ``past * keep + transpose(onehot @ rows)``), the form XNNPACK
takes whole. In ONNX Runtime that form reads and writes every layer's whole cache four times per
step (the product, its transpose, the product with ``keep``, the sum): on a decoder of
SmolLM2-135M's shape it was about 40% of an int4 decode step. ``ScatterElements`` copies the cache
once and writes the ``S`` rows.

Exact: the rule applies only when ``onehot`` and ``keep`` are the ones this form builds from the
positions (``onehot[t, s] = (arange(T)[t] == p[s])``, ``keep[t] = 1 - sum_s onehot[t, s]``,
checked node by node and the ``arange`` by value). For distinct positions and finite values the
dense form gives each written slot ``new`` and every other slot ``past``, which is what
``ScatterElements`` writes (only the sign of a zero can differ: ``past * 0 + new``). Repeated
positions are undefined in both (the program's contract: prefill and decode feed distinct ones).
"""

from __future__ import annotations

from typing import Any

__all__ = ["one_hot_writes_as_scatter"]


def _producer(value: Any, op_type: str) -> Any:
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type and node.domain == "" else None


def _ints(value: Any) -> list[int] | None:
    const = value.const_value if value is not None else None
    if const is None:
        return None
    arr = const.numpy()
    return [int(v) for v in arr.reshape(-1)] if arr.dtype.kind in "iu" else None


def _hits(onehot: Any, slots: int) -> tuple[Any, Any] | None:
    """``onehot`` as ``Reshape(Cast(Equal(arange(T)[T, 1], p)), [1, T, -1])`` (or its
    ``Unsqueeze(.., 0)``): the hit matrix (the Cast's output) and the positions ``p``, or None."""
    import numpy as np

    view = _producer(onehot, "Reshape")
    if view is not None and _ints(view.inputs[1]) != [1, slots, -1]:
        return None
    if view is None:  # hit.unsqueeze(0) as torch.onnx writes it without dualexport's passes
        view = _producer(onehot, "Unsqueeze")
        if view is None or _ints(view.inputs[1]) != [0]:
            return None
    cast = _producer(view.inputs[0], "Cast")
    equal = _producer(cast.inputs[0], "Equal") if cast is not None else None
    if equal is None:
        return None
    table, positions = equal.inputs
    arr = table.const_value.numpy() if table.const_value is not None else None
    if arr is None or arr.shape != (slots, 1) or not np.array_equal(arr.reshape(-1), np.arange(slots)):
        return None
    if positions.shape is None or len(positions.shape) not in (1, 2) or positions.dtype is None:
        return None
    if len(positions.shape) == 2 and positions.shape[0] != 1:
        return None
    return cast.outputs[0], positions


def _is_keep(keep: Any, hits: Any, slots: int) -> bool:
    """``keep`` is ``Reshape(Sub(1, ReduceSum(hits, [-1])), [1, 1, T, 1])`` over the same hits."""
    import numpy as np

    reshape = _producer(keep, "Reshape")
    sub = _producer(reshape.inputs[0], "Sub") if reshape is not None else None
    total = _producer(sub.inputs[1], "ReduceSum") if sub is not None else None
    if total is None or sub is None or reshape is None or _ints(reshape.inputs[1]) != [1, 1, slots, 1]:
        return False
    one = sub.inputs[0].const_value
    if one is None or one.numpy().size != 1 or float(np.asarray(one.numpy()).reshape(-1)[0]) != 1.0:
        return False
    axes = _ints(total.inputs[1]) if len(total.inputs) > 1 else None
    return (
        total.inputs[0] is hits
        and axes in ([-1], [1])
        and not total.attributes.get_int("keepdims", 1)
        and not total.attributes.get_int("noop_with_empty_axes", 0)
    )


def one_hot_writes_as_scatter() -> Any:
    """``Add(Mul(past, keep), Transpose(Reshape(MatMul(onehot, rows), [1, T, H, D]), [0, 2, 1, 3]))``
    -> ``ScatterElements(past, positions as [1, H, S, D], rows as [1, H, S, D], axis=2)``."""
    from onnxscript.rewriter import pattern

    def target(op: Any, past: Any, keep: Any, onehot: Any, rows: Any, shape: Any) -> Any:
        placed = op.Transpose(op.Reshape(op.MatMul(onehot, rows), shape), perm=[0, 2, 1, 3])
        return op.Add(op.Mul(past, keep), placed)

    def replacement(op: Any, past: Any, keep: Any, onehot: Any, rows: Any, shape: Any) -> Any:
        _, heads, _, dim = (int(d) for d in past.shape)
        _, positions = _hits(onehot, int(past.shape[2])) or (None, None)
        updates = op.Transpose(
            op.Reshape(rows, op.Constant(value_ints=[1, -1, heads, dim])), perm=[0, 2, 1, 3]
        )
        column = op.Reshape(positions, op.Constant(value_ints=[1, 1, -1, 1]))
        index = op.Expand(column, op.Constant(value_ints=[1, heads, 1, dim]))
        return op.ScatterElements(past, index, updates, axis=2)

    def condition(context: Any, past: Any, keep: Any, onehot: Any, rows: Any, shape: Any) -> bool:
        import onnx_ir as ir

        dims = past.shape
        if dims is None or len(dims) != 4 or not all(isinstance(d, int) for d in dims) or dims[0] != 1:
            return False
        slots = int(dims[2])
        if _ints(shape) != [1, slots, int(dims[1]), int(dims[3])] or rows.dtype != past.dtype:
            return False
        found = _hits(onehot, slots)
        if found is None or found[1].dtype not in (ir.DataType.INT64, ir.DataType.INT32):
            return False
        return _is_keep(keep, found[0], slots)

    return pattern.RewriteRuleSet(
        [pattern.RewriteRule(target, replacement, condition, name="OneHotWriteAsScatter")], commute=True
    )
