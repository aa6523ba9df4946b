"""The range a dynamic dimension can take, when torch.export says the declared one is too wide.

Why: torch.export refuses a range in which some size makes the model take another path
("Not all values of seq ... satisfy the generated guard (-1 + seq) != 1": MobileBERT's trigram
embedding slices ``[:, 1:]``, and a length of 1 specializes). Its message names the guard but not
the range that satisfies it, and a user reads "Constraints violated" as a bug in their model. We
evaluate the guard over the declared range and name the widest range that satisfies it, which the
user can pass as is; we never narrow a range silently.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..compat.torch import size_functions

__all__ = ["RangeGuard", "range_guards"]

#: one guard line of torch.export's constraint violation message
_LINE = re.compile(
    r"Not all values of (?P<name>\w+) = (?P<source>\S+) in the specified range (?P<range>.+?) "
    r"satisfy the generated guard (?P<guard>.+?)\.?\s*$"
)
#: above this many sizes, a range is searched at both ends and bisected in between
_SCAN = 512


@dataclass(frozen=True)
class RangeGuard:
    """One dimension whose declared range admits sizes the model cannot take."""

    name: str
    guard: str
    declared: tuple[int, int]
    #: the range inside ``declared`` where the guard holds
    widest: tuple[int, int]
    #: the first sizes (at most 8) where the guard fails
    excluded: tuple[int, ...]

    def describe(self) -> str:
        lo, hi = self.declared
        shown = ", ".join(map(str, self.excluded[:5])) + (", ..." if len(self.excluded) > 5 else "")
        text = f"{self.name} in {lo}..{hi}: the model needs {self.guard}, false at {self.name} = {shown}"
        return text + f"; Dim({self.name!r}, min={self.widest[0]}, max={self.widest[1]}) satisfies it"


def range_guards(message: str, dynamic_shapes: Any) -> list[RangeGuard]:
    """The guards of a constraint violation ``message``, each evaluated over its declared range."""
    found = []
    for line in message.splitlines():
        match = _LINE.search(line.strip().lstrip("- "))
        if match is None:
            continue
        name = match["name"]
        declared = _declared(name, match["range"], dynamic_shapes)
        guard = match["guard"].replace(match["source"], name)
        holds = _predicate(guard, name)
        if declared is None or holds is None:
            continue
        segments = _segments(*declared, holds)
        good = [(start, end) for start, end, ok in segments if ok]
        if len(good) != 1 or len(segments) == 1:
            continue  # nothing excluded, or no one range (a divisibility guard: torch suggests a Dim)
        bad = [v for start, end, ok in segments if not ok for v in range(start, min(end, start + 8) + 1)]
        found.append(RangeGuard(name, guard, declared, good[0], tuple(bad[:8])))
    return found


def _declared(name: str, text: str, dynamic_shapes: Any) -> tuple[int, int] | None:
    """The range the user declared for ``name``: the Dim object, else the message's own bounds."""
    for dim in _dims(dynamic_shapes):
        if getattr(dim, "__name__", None) == name:
            lo, hi = getattr(dim, "min", None), getattr(dim, "max", None)
            if isinstance(lo, int) and isinstance(hi, int):
                return max(lo, 2), hi  # torch.export specializes sizes 0 and 1
    low = re.search(rf"(\d+) <= {name}\b", text)
    high = re.search(rf"\b{name} <= (\d+)", text)
    if high is None:
        return None
    return (int(low[1]) if low else 2), int(high[1])


def _dims(spec: Any) -> Iterator[Any]:
    if isinstance(spec, dict):
        for value in spec.values():
            yield from _dims(value)
    elif isinstance(spec, (list, tuple)):
        for value in spec:
            yield from _dims(value)
    elif spec is not None and hasattr(spec, "__name__") and hasattr(spec, "max"):
        yield spec


def _predicate(guard: str, name: str) -> Any:
    """``guard`` as a function of one integer, or None when it is not a guard on ``name`` alone."""
    import sympy

    symbol = sympy.Symbol(name, integer=True)
    names = size_functions()
    try:
        expr = sympy.sympify(_relational(guard), locals={name: symbol, **names})
    except (sympy.SympifyError, SyntaxError, TypeError, ValueError):
        return None
    if not isinstance(expr, sympy.Basic) or expr.free_symbols != {symbol}:
        return None

    def holds(value: int) -> bool:
        return bool(expr.subs(symbol, value))

    return holds


def _relational(text: str) -> str:
    """``a != b`` and ``a == b`` at the top level as ``Ne(a, b)`` / ``Eq(a, b)`` (sympify would
    evaluate Python's ``!=`` on symbols to a plain bool)."""
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and text[i : i + 2] in ("!=", "=="):
            fn = "Ne" if text[i] == "!" else "Eq"
            return f"{fn}({text[:i].strip()}, {text[i + 2 :].strip()})"
    return text


def _segments(lo: int, hi: int, holds: Callable[[int], bool]) -> list[tuple[int, int, bool]]:
    """``[lo, hi]`` as runs ``(start, end, holds)``: every size of a short range; of a long one,
    both ends, and the middle taken as monotone (one change, found by bisection: a guard
    ``seq <= 512`` against a declared 100000)."""
    if hi - lo < _SCAN:
        points = [(v, holds(v)) for v in range(lo, hi + 1)]
    else:
        a, b = lo + _SCAN // 2 - 1, hi - _SCAN // 2 + 1
        points = [(v, holds(v)) for v in range(lo, a + 1)]
        left, right = points[-1][1], holds(b)
        if left != right:
            x, y = a, b
            while y - x > 1:
                m = (x + y) // 2
                x, y = (m, y) if holds(m) == left else (x, m)
            points += [(x, left), (y, right)]  # the middle up to x as its left end, from y as its right
        points += [(v, holds(v)) for v in range(b, hi + 1)]
    segments: list[tuple[int, int, bool]] = []
    for v, good in points:
        if segments and segments[-1][2] == good:
            segments[-1] = (segments[-1][0], v, good)
        else:
            segments.append((v, v, good))
    return segments
