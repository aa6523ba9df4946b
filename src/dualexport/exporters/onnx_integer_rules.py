"""The ONNX pipeline's exact rules for arithmetic on whole numbers held as floats: what torch.onnx
writes for a per-token int8 activation quantization (``export_llm(quantize=...)``), in fewer nodes.

Why: a quantized decoder's .onnx computes each linear's activation quantization in the graph (the
program's per-token int8 codes, so that the file computes what the .pte computes); torch.onnx
writes it as about 33 nodes, with two ``zeros_like`` (``Shape``, ``Expand``) and two round trips
through int8 (``Cast``, ``Cast``) on values that are already whole numbers in int8's range, and a
reshape whose shape is computed at run time from another value's shape. In a decode step every
node costs ONNX Runtime a few microseconds whatever its size, so those nodes were a fifth of an
int4 step of a decoder of SmolLM2-135M's shape. Each rule here keeps every value bit for bit:

* ``Max(x, Expand(c, Shape(x)))`` (and ``Min``) with a scalar constant ``c`` -> ``Max(x, c)``;
* ``Cast(Cast(x, INT8), FLOAT)`` (through a ``Reshape`` too) -> ``x``, when ``x`` is a ``Clip``
  to bounds inside int8's range of whole numbers (``Round``, sums of whole numbers, whole-number
  constants): the casts change no value;
* ``Reshape(x, Where(c, k, Shape(y)))`` with constant ``c`` and ``k`` -> ``Reshape(x, dims)``
  when ``y``'s shape leaves at most one dim unknown (written ``-1``); ``allowzero=1`` is dropped
  where no dim is zero, so twin reshapes are one.
"""

from __future__ import annotations

from typing import Any

__all__ = ["integer_rules"]

#: how deep ``_whole`` follows sums of whole numbers
_DEPTH = 6


def _scalar(value: Any) -> Any:
    const = value.const_value if value is not None else None
    if const is None:
        return None
    arr = const.numpy()
    return arr if arr.ndim == 0 else None


def _whole(value: Any, depth: int = _DEPTH) -> bool:
    """``value`` holds whole numbers (or their infinities): a Round, a cast from an integer type,
    a whole-number constant, or a sum, difference, Clip, Min or Max of such."""
    import numpy as np

    if value is None or depth == 0:
        return False
    if value.const_value is not None:
        arr = value.const_value.numpy()
        return bool(arr.dtype.kind in "iub" or np.all(np.isinf(arr) | (arr == np.round(arr))))
    node = value.producer()
    if node is None or node.domain != "":
        return False
    if node.op_type == "Round":
        return True
    if node.op_type == "Cast":
        source = node.inputs[0].dtype if node.inputs[0] is not None else None
        return source is not None and source.is_integer()
    if node.op_type in ("Add", "Sub", "Min", "Max", "Clip", "Neg", "Reshape", "Unsqueeze", "Squeeze"):
        operands = node.inputs[:1] if node.op_type in ("Reshape", "Unsqueeze", "Squeeze") else node.inputs
        return all(v is None or _whole(v, depth - 1) for v in operands)
    return False


def _int8_whole(value: Any) -> bool:
    """``value`` is a Clip of whole numbers to bounds within int8's range."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type != "Clip" or node.domain != "" or len(node.inputs) != 3:
        return False
    lo, hi = _scalar(node.inputs[1]), _scalar(node.inputs[2])
    if lo is None or hi is None or not (-128 <= float(lo) <= float(hi) <= 127):
        return False
    return _whole(node.inputs[0])


def _zeros_like_operand() -> Any:
    from onnxscript.rewriter import pattern

    def rule(op_type: str) -> Any:
        def target(op: Any, x: Any, c: Any) -> Any:
            return getattr(op, op_type)(x, op.Expand(c, op.Shape(x)))

        def replacement(op: Any, x: Any, c: Any) -> Any:
            return getattr(op, op_type)(x, c)

        def condition(context: Any, x: Any, c: Any) -> bool:
            return _scalar(c) is not None and c.dtype == x.dtype

        return pattern.RewriteRule(target, replacement, condition, name=f"{op_type}WithBroadcastConstant")

    return pattern.RewriteRuleSet([rule("Min"), rule("Max")], commute=True)


def _int8_source(value: Any) -> tuple[Any, Any] | None:
    """``value`` as ``Cast(x, INT8)`` or ``Reshape(Cast(x, INT8), shape)`` of an ``x`` that holds
    whole numbers within int8's range: ``(x, shape or None)``, or None. Matched by looking at the
    producers (their outputs may have other uses: the rule replaces only its own node)."""
    import onnx_ir as ir

    node = value.producer() if value is not None else None
    shape = None
    if node is not None and node.op_type == "Reshape" and node.domain == "":
        if len(node.inputs) < 2 or not _constant_without_zeros(node.inputs[1]):  # allowzero cannot matter
            return None
        shape, node = node.inputs[1], node.inputs[0].producer()
    if node is None or node.op_type != "Cast" or node.domain != "":
        return None
    if node.attributes.get_int("to", 0) != ir.DataType.INT8.value or not _int8_whole(node.inputs[0]):
        return None
    return node.inputs[0], shape


def _int8_round_trip() -> Any:
    from onnxscript.rewriter import pattern

    def target(op: Any, v: Any) -> Any:
        return op.Cast(v, _allow_other_attributes=True, _outputs=["y"])

    def replacement(op: Any, v: Any, y: Any) -> Any:
        x, shape = _int8_source(v) or (None, None)
        return op.Identity(x) if shape is None else op.Reshape(x, shape)

    def condition(context: Any, v: Any, y: Any) -> bool:
        found = _int8_source(v)
        return found is not None and found[0].dtype is not None and found[0].dtype == y.dtype

    return pattern.RewriteRule(target, replacement, condition, name="WholeInt8RoundTrip")


def _shape_from_where() -> Any:
    from onnxscript.rewriter import pattern

    def target(op: Any, x: Any, s: Any) -> Any:
        return op.Reshape(x, s, _allow_other_attributes=True)

    def replacement(op: Any, x: Any, s: Any) -> Any:
        return op.Reshape(x, op.Constant(value_ints=_where_dims(s) or []))

    def condition(context: Any, x: Any, s: Any) -> bool:
        return _where_dims(s) is not None

    return pattern.RewriteRule(target, replacement, condition, name="ReshapeToKnownDims")


def _plain_reshape() -> Any:
    """``Reshape(x, dims, allowzero=1)`` with constant dims and no zero among them is the same
    reshape without the attribute (so common subexpressions find it equal to its twin)."""
    from onnxscript.rewriter import pattern

    def target(op: Any, x: Any, s: Any) -> Any:
        return op.Reshape(x, s, allowzero=1)

    def replacement(op: Any, x: Any, s: Any) -> Any:
        return op.Reshape(x, s)

    def condition(context: Any, x: Any, s: Any) -> bool:
        return _constant_without_zeros(s)

    return pattern.RewriteRule(target, replacement, condition, name="ReshapeWithoutZeros")


def _constant_without_zeros(dims: Any) -> bool:
    """``dims`` is a constant shape with no zero (where ``Reshape``'s ``allowzero`` changes nothing)."""
    const = dims.const_value if dims is not None else None
    return const is not None and 0 not in const.numpy().reshape(-1).tolist()


def _where_dims(s: Any) -> list[int] | None:
    node = s.producer() if s is not None else None
    if node is None or node.op_type != "Where" or node.domain != "":
        return None
    c, k, shape = node.inputs
    of = shape.producer() if shape is not None else None
    if of is None or of.op_type != "Shape" or of.domain != "":
        return None
    if of.attributes.get_int("start", 0) != 0 or "end" in of.attributes:
        return None
    return _dims(c, k, of.inputs[0])


def _dims(c: Any, k: Any, y: Any) -> list[int] | None:
    """The dims ``Where(c, k, Shape(y))`` computes, one unknown as ``-1``; None if not known."""
    if c.const_value is None or k.const_value is None or y.shape is None:
        return None
    cond, known = c.const_value.numpy().reshape(-1), k.const_value.numpy().reshape(-1)
    rank = len(y.shape)
    if cond.dtype.kind != "b" or known.dtype.kind not in "iu" or len(cond) != rank or len(known) != rank:
        return None
    dims = [int(known[i]) if cond[i] else y.shape[i] for i in range(rank)]
    unknown = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    if len(unknown) > 1 or any(isinstance(d, int) and d <= 0 for d in dims):
        return None
    return [d if isinstance(d, int) else -1 for d in dims]


def integer_rules() -> tuple[Any, ...]:
    """The rules, for the pipeline's rewrite pass."""
    return (*_zeros_like_operand().rules, _int8_round_trip(), _shape_from_where(), _plain_reshape())
