"""Example inputs and dynamic dimensions from text: the grammar of the CLI's ``--input`` and
``--dynamic`` and of a batch manifest's ``inputs`` and ``dynamic`` (one grammar, one parser).

``SHAPE:DTYPE[:LOW..HIGH]``: ``1x3x224x224:float32``; ``2x8:int64:0..999`` (integers drawn from
LOW..HIGH inclusive: token ids below the vocabulary size; ``1..1`` gives an all-ones mask).
``INPUT.DIM=[NAME:]MIN..MAX``: ``0.1=1..64`` makes dim 1 of input 0 dynamic; dims given the same
NAME share one ``torch.export.Dim`` (a sequence length that two inputs carry).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError

__all__ = [
    "InputSpec",
    "DynamicDim",
    "parse_input",
    "parse_input_spec",
    "make_input",
    "parse_dynamic",
    "build_dynamic_shapes",
    "fit_to_signature",
]

_DTYPES = {
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "int64": "int64",
    "long": "int64",
    "int32": "int32",
    "int": "int32",
    "bool": "bool",
    "uint8": "uint8",
    "int8": "int8",
}
_INTEGER_LIMITS = {"int64": (-(2**63), 2**63 - 1), "int32": (-(2**31), 2**31 - 1), "uint8": (0, 255)}
_INTEGER_LIMITS["int8"] = (-128, 127)


@dataclass(frozen=True)
class InputSpec:
    """One example input: its shape, dtype and (integers only) the range values are drawn from."""

    shape: tuple[int, ...]
    dtype: str
    low: int | None = None
    high: int | None = None

    def make(self, seed: int) -> Any:
        return make_input(self.shape, self.dtype, seed, low=self.low, high=self.high)


@dataclass(frozen=True)
class DynamicDim:
    """Dim ``dim`` of input ``input`` ranges over ``min..max``; equal ``name``s share one Dim."""

    input: int
    dim: int
    min: int
    max: int
    name: str | None = None


def _range(text: str, what: str, hint: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("..")
    try:
        if not sep:
            raise ValueError
        return int(lo), int(hi)
    except ValueError:
        raise InputError(f"{what}: {text!r} is not a range LOW..HIGH", hint=hint) from None


def parse_input(spec: str) -> InputSpec:
    """``'2x8:int64:0..999'`` -> ``InputSpec((2, 8), 'int64', 0, 999)``."""
    hint = "e.g. 1x3x224x224:float32, or 2x8:int64:0..999 for token ids"
    parts = spec.split(":")
    if len(parts) > 3:
        raise InputError(f"input {spec!r}: expected SHAPE:DTYPE[:LOW..HIGH]", hint=hint)
    shape_text = parts[0].strip()
    dtype = _DTYPES.get((parts[1] if len(parts) > 1 and parts[1].strip() else "float32").strip().lower())
    if dtype is None:
        raise InputError(f"input {spec!r}: unknown dtype", hint=f"use one of {sorted(set(_DTYPES.values()))}")
    try:
        shape = tuple(int(d) for d in shape_text.lower().split("x")) if shape_text else ()
    except ValueError:
        raise InputError(f"input {spec!r}: shape must be dims joined by 'x'", hint=hint) from None
    if any(d <= 0 for d in shape):
        raise InputError(f"input {spec!r}: every dimension must be positive", hint=hint)
    low = high = None
    if len(parts) == 3:
        if dtype not in _INTEGER_LIMITS and dtype != "bool":
            raise InputError(
                f"input {spec!r}: a value range applies to integer inputs only",
                hint="floating inputs are drawn from a standard normal distribution",
            )
        low, high = _range(parts[2].strip(), f"input {spec!r}", hint)
        lim = _INTEGER_LIMITS.get(dtype, (0, 1))
        if not lim[0] <= low <= high <= lim[1]:
            raise InputError(
                f"input {spec!r}: range {low}..{high} is empty or outside {dtype} ({lim[0]}..{lim[1]})",
                hint="LOW..HIGH is inclusive and LOW <= HIGH",
            )
    return InputSpec(shape, dtype, low, high)


def parse_input_spec(spec: str) -> tuple[tuple[int, ...], str]:
    """'1x3x224x224:float32' -> ((1, 3, 224, 224), 'float32')."""
    parsed = parse_input(spec)
    return parsed.shape, parsed.dtype


def make_input(
    shape: tuple[int, ...], dtype: str, seed: int, *, low: int | None = None, high: int | None = None
) -> Any:
    """A seeded example: floats from N(0, 1); integers from LOW..HIGH (default 0..99); bools 0/1."""
    import torch

    g = torch.Generator().manual_seed(seed)
    td = getattr(torch, dtype)
    if td.is_floating_point:
        return torch.randn(shape, generator=g).to(td)
    lo = 0 if low is None else low
    hi = (1 if td == torch.bool else 99) if high is None else high
    values = torch.randint(lo, hi + 1, shape, generator=g)
    return values.bool() if td == torch.bool else values.to(td)


_DYN = re.compile(r"^\s*(\d+)\.(\d+)\s*=\s*(?:([A-Za-z_][A-Za-z0-9_]*)\s*:)?\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")


def parse_dynamic(spec: str) -> DynamicDim:
    """``'0.1=seq:1..64'`` -> ``DynamicDim(0, 1, 1, 64, 'seq')``."""
    m = _DYN.match(spec)
    if m is None:
        raise InputError(
            f"dynamic dim {spec!r}: expected INPUT.DIM=[NAME:]MIN..MAX",
            hint="e.g. 0.1=1..64, or 0.1=seq:1..64 and 1.1=seq:1..64 for one shared length",
        )
    i, d, name, lo, hi = int(m[1]), int(m[2]), m[3], int(m[4]), int(m[5])
    if not 0 <= lo <= hi:
        raise InputError(f"dynamic dim {spec!r}: range {lo}..{hi} is empty or negative")
    return DynamicDim(i, d, lo, hi, name)


def build_dynamic_shapes(
    dims: Sequence[DynamicDim], inputs: Sequence[InputSpec], *, model: Any = None
) -> tuple[Any, ...] | None:
    """The ``torch.export`` spec for ``dims``, checked against the example inputs: each dim
    exists and the example's size lies inside its range. One entry per positional input; with
    ``model``, grouped the way its ``forward`` takes them (``forward(self, *inputs)`` takes one
    tuple, as torch.export's spec must say)."""
    if not dims:
        return None
    from torch.export import Dim

    shared: dict[str, DynamicDim] = {}
    made: dict[str, Any] = {}
    spec: list[dict[int, Any] | None] = [None] * len(inputs)
    for dd in dims:
        where = f"dynamic dim {dd.input}.{dd.dim}"
        if dd.input >= len(inputs):
            raise InputError(f"{where}: there are only {len(inputs)} inputs", hint="inputs count from 0")
        shape = inputs[dd.input].shape
        if dd.dim >= len(shape):
            raise InputError(f"{where}: input {dd.input} has rank {len(shape)}", hint="dims count from 0")
        if not dd.min <= shape[dd.dim] <= dd.max:
            raise InputError(
                f"{where}: the example's size {shape[dd.dim]} is outside {dd.min}..{dd.max}",
                hint="make the example input's size lie inside the declared range",
            )
        key = dd.name or f"d{dd.input}_{dd.dim}"
        if dd.name is not None and key in shared and (shared[key].min, shared[key].max) != (dd.min, dd.max):
            raise InputError(f"{where}: {key!r} is declared with two different ranges")
        shared.setdefault(key, dd)
        if key not in made:
            made[key] = Dim(key, min=dd.min, max=dd.max)
        entry = spec[dd.input] if spec[dd.input] is not None else {}
        assert entry is not None
        entry[dd.dim] = made[key]
        spec[dd.input] = entry
    return fit_to_signature(model, tuple(spec)) if model is not None else tuple(spec)


def fit_to_signature(model: Any, per_input: tuple[Any, ...]) -> tuple[Any, ...]:
    """Per-input specs grouped by ``model.forward``'s parameters: one per named positional
    parameter, and the rest as one tuple for a ``*args`` parameter."""
    import inspect

    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return per_input
    out: list[Any] = []
    i = 0
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and i < len(per_input):
            out.append(per_input[i])
            i += 1
        elif p.kind == p.VAR_POSITIONAL:
            out.append(tuple(per_input[i:]))
            i = len(per_input)
    return tuple(out) if i == len(per_input) else per_input
