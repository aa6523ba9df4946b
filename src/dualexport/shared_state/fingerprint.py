"""A fingerprint of the shared program: graph, weights and symbolic shape ranges.

Why: lowering must not change the source of truth. Comparing ``range_constraints`` alone misses
changes that a target makes to the program's *shape environment* (the ShapeEnv behind the fake
tensors in node meta), so both are covered. Weights are compared by content (sha256), because an
in-place write through ``.data`` or numpy does not bump a tensor's version counter.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram

from .tensor_bytes import tensor_sha256

__all__ = [
    "ProgramFingerprint",
    "ShapeEnvSnapshot",
    "fingerprint",
    "find_shape_env",
    "snapshot_shape_env",
    "restore_shape_env",
    "narrowed_ranges",
    "ranges_kept",
    "graph_text",
    "graph_digest",
]


@dataclass(frozen=True)
class ShapeEnvSnapshot:
    """The mutable parts of a ShapeEnv that a target could disturb, kept to restore them."""

    var_to_range: dict = field(default_factory=dict, compare=False, repr=False)
    replacements: dict = field(default_factory=dict, compare=False, repr=False)
    digest: str = ""


@dataclass(frozen=True)
class ProgramFingerprint:
    """Digests of the three parts; ``diff`` names the parts that differ."""

    graph: str
    weights: dict[str, str]
    shapes: str

    def diff(self, other: ProgramFingerprint) -> tuple[str, ...]:
        """Human-readable list of what changed between ``self`` (before) and ``other`` (after)."""
        out: list[str] = []
        if self.graph != other.graph:
            out.append("graph")
        for name in sorted(set(self.weights) | set(other.weights)):
            if self.weights.get(name) != other.weights.get(name):
                out.append(f"weight {name}")
        if self.shapes != other.shapes:
            out.append("symbolic shape ranges")
        return tuple(out)


def find_shape_env(program: ExportedProgram) -> Any | None:
    """The ShapeEnv behind the program's fake tensors, or None for a fully static program."""
    for node in program.graph.nodes:
        val = node.meta.get("val")
        fake_mode = getattr(val, "fake_mode", None)
        if fake_mode is not None and getattr(fake_mode, "shape_env", None) is not None:
            return fake_mode.shape_env
    return None


def _render_ranges(mapping: dict) -> str:
    return ";".join(sorted(f"{k}={v}" for k, v in mapping.items()))


def snapshot_shape_env(program: ExportedProgram) -> ShapeEnvSnapshot:
    """Copy the ranges and replacements of the program's ShapeEnv (and its range_constraints)."""
    env = find_shape_env(program)
    var_to_range = dict(env.var_to_range) if env is not None else {}
    replacements = dict(env.replacements) if env is not None else {}
    text = "|".join(
        [
            _render_ranges(program.range_constraints),
            _render_ranges(var_to_range),
            _render_ranges(replacements),
        ]
    )
    return ShapeEnvSnapshot(var_to_range, replacements, hashlib.sha256(text.encode()).hexdigest())


def narrowed_ranges(program: ExportedProgram, snap: ShapeEnvSnapshot) -> tuple[str, ...]:
    """What happened since ``snap`` to the symbols it pinned: a changed range or a new
    replacement (a guard such as ``s0 < 16`` a kernel added), as sentences. Symbols created
    since (a lowering's own unbacked sizes) are not the program's and are not counted."""
    env = find_shape_env(program)
    if env is None:
        return ()
    out = []
    for sym, old in snap.var_to_range.items():
        new = env.var_to_range.get(sym)
        if new != old:
            out.append(
                f"{sym}: [{old.lower}, {old.upper}] -> "
                + (f"[{new.lower}, {new.upper}]" if new is not None else "dropped")
            )
    for sym, expr in env.replacements.items():
        if sym in snap.var_to_range and snap.replacements.get(sym) != expr:
            out.append(f"{sym} replaced by {expr}")
    return tuple(out)


@contextlib.contextmanager
def ranges_kept(program: ExportedProgram) -> Iterator[list[str]]:
    """Put the program's shape environment back after work that is not an artifact (a debug
    lowering for localization); the list receives what had been narrowed."""
    snap = snapshot_shape_env(program)
    narrowed: list[str] = []
    try:
        yield narrowed
    finally:
        narrowed.extend(narrowed_ranges(program, snap))
        if snapshot_shape_env(program).digest != snap.digest:
            restore_shape_env(program, snap)


def restore_shape_env(program: ExportedProgram, snap: ShapeEnvSnapshot) -> None:
    """Put back ranges and replacements a target changed (the repair half of invariant 4)."""
    env = find_shape_env(program)
    if env is None:
        return
    env.var_to_range.clear()
    env.var_to_range.update(snap.var_to_range)
    env.replacements.clear()
    env.replacements.update(snap.replacements)


def _value_text(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{list(value.shape)}{tuple(value.stride())}"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_value_text(v) for v in value) + ")"
    return type(value).__name__ if value is not None else ""


def graph_text(module: torch.fx.GraphModule) -> str:
    """The graph as text: each node's op, target, arguments and value (dtype, symbolic shape,
    strides), sub-graphs included.

    Why not ``print_readable``: it embeds each node's stack trace (file paths and source lines),
    so moving the checkout or editing a comment above ``forward`` would change a program that
    computes exactly the same thing.
    """
    lines = []
    for node in module.graph.nodes:
        # An output's value is its arguments' values (already above); torch.export.load fills it
        # in and a trace does not, so the same program saved and loaded would read as another.
        value = node.meta.get("val") if node.op != "output" else None
        lines.append(f"{node.format_node()} :: {_value_text(value)}")
        if node.op == "get_attr":
            sub = getattr(module, str(node.target), None)
            if isinstance(sub, torch.fx.GraphModule):
                lines.append(f"[{node.target}]\n{graph_text(sub)}")
    return "\n".join(lines)


def graph_digest(program: ExportedProgram) -> str:
    """Digest of the graph plus its signature: what the program computes, not its weights, and
    not where its source lives."""
    text = graph_text(program.graph_module) + "\n" + str(program.graph_signature)
    return hashlib.sha256(text.encode()).hexdigest()


def weight_digests(program: ExportedProgram) -> dict[str, str]:
    """sha256 of every state_dict and constants tensor, by name."""
    out: dict[str, str] = {}
    for source in (program.state_dict, program.constants):
        for name, value in source.items():
            if isinstance(value, torch.Tensor):
                out[name] = tensor_sha256(value)
    return out


def fingerprint(program: ExportedProgram, weights: dict[str, str] | None = None) -> ProgramFingerprint:
    """Fingerprint ``program``; pass precomputed ``weights`` digests to skip rehashing."""
    return ProgramFingerprint(
        graph=graph_digest(program),
        weights=weights if weights is not None else weight_digests(program),
        shapes=snapshot_shape_env(program).digest,
    )
