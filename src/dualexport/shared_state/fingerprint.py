"""A fingerprint of the shared program: graph, weights and symbolic shape ranges.

Why: lowering must not change the source of truth. Comparing ``range_constraints`` alone misses
changes that a target makes to the program's *shape environment* (the ShapeEnv behind the fake
tensors in node meta), so both are covered. Weights are compared by content (sha256), because an
in-place write through ``.data`` or numpy does not bump a tensor's version counter.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram

from .tensor_bytes import tensor_sha256

__all__ = ["ProgramFingerprint", "ShapeEnvSnapshot", "fingerprint", "find_shape_env",
           "snapshot_shape_env", "restore_shape_env"]


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
    text = "|".join([
        _render_ranges(program.range_constraints),
        _render_ranges(var_to_range),
        _render_ranges(replacements),
    ])
    return ShapeEnvSnapshot(var_to_range, replacements, hashlib.sha256(text.encode()).hexdigest())


def restore_shape_env(program: ExportedProgram, snap: ShapeEnvSnapshot) -> None:
    """Put back ranges and replacements a target changed (the repair half of invariant 4)."""
    env = find_shape_env(program)
    if env is None:
        return
    env.var_to_range.clear()
    env.var_to_range.update(snap.var_to_range)
    env.replacements.clear()
    env.replacements.update(snap.replacements)


def graph_digest(program: ExportedProgram) -> str:
    """Digest of the graph code plus its signature: what the program computes, not its weights."""
    text = program.graph_module.print_readable(print_output=False, include_stride=True)
    text += "\n" + str(program.graph_signature)
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
