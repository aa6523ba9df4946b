"""User transforms, applied once to the shared program itself.

Why: ExecuTorch's XNNPACK path once dropped every transform applied to a separately kept graph
module, because lowering takes an ExportedProgram. Here there is nothing separate to keep: a
transform either edits the shared program's own ``graph_module`` in place (an FX pass) or returns
a new ExportedProgram that replaces the shared one. Either way both targets are fed from the result.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram

from ..compat.torch import set_graph_module
from ..errors import TransformError

__all__ = ["ProgramTransform", "TransformRecord", "transform_kind", "transform_name"]


@dataclass(frozen=True)
class ProgramTransform:
    """Marks ``fn`` as taking and returning an ExportedProgram (when no annotation says so)."""

    fn: Callable[[ExportedProgram], ExportedProgram]
    name: str | None = None

    def __call__(self, program: ExportedProgram) -> ExportedProgram:
        return self.fn(program)


@dataclass(frozen=True)
class TransformRecord:
    """One applied transform: its name, kind ("graph" or "program"), whether the graph changed."""

    name: str
    kind: str
    changed: bool
    seconds: float


def transform_name(fn: Any) -> str:
    if isinstance(fn, ProgramTransform) and fn.name:
        return fn.name
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def _annotation_is_program(annotation: Any) -> bool:
    if annotation is ExportedProgram:
        return True
    return isinstance(annotation, str) and annotation.split(".")[-1] == "ExportedProgram"


def transform_kind(fn: Any) -> str:
    """ "program" for ExportedProgram -> ExportedProgram callables, "graph" for FX passes.

    Decided by an explicit :class:`ProgramTransform` wrapper, an FX ``PassBase``, or the
    annotation of the first parameter; an unannotated callable is taken as an FX pass.
    """
    if isinstance(fn, ProgramTransform):
        return "program"
    from torch.fx.passes.infra.pass_base import PassBase

    if isinstance(fn, PassBase):
        return "graph"
    if not callable(fn):
        raise TransformError(
            f"transform {fn!r} is not callable",
            hint="pass functions that take a torch.fx.GraphModule (and edit it in place) or an "
            "ExportedProgram (and return one)",
        )
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return "graph"
    if params and _annotation_is_program(params[0].annotation):
        return "program"
    return "graph"


def apply_graph_pass(program: ExportedProgram, fn: Any) -> None:
    """Run an FX pass on the program's own graph module; adopt a returned new module."""
    gm = program.graph_module
    result = fn(gm)
    new_gm = None
    if isinstance(result, torch.fx.GraphModule):
        new_gm = result
    elif result is not None and hasattr(result, "graph_module"):
        new_gm = result.graph_module
    if new_gm is not None and new_gm is not gm:
        set_graph_module(program, new_gm)
        gm = new_gm
    gm.graph.lint()
    gm.recompile()


def run_transform(program: ExportedProgram, fn: Any) -> ExportedProgram:
    """Apply one transform; return the program that is now the shared one."""
    kind = transform_kind(fn)
    if kind == "graph":
        apply_graph_pass(program, fn)
        out = program
    else:
        out = fn(program)
        if not isinstance(out, ExportedProgram):
            raise TransformError(
                f"transform {transform_name(fn)} returned {type(out).__name__}, not an ExportedProgram",
                hint="an ExportedProgram transform must return the (new or same) program; an FX "
                "pass should take the GraphModule instead",
            )
    try:
        out.validate()
    except Exception as exc:  # the verifier's own error types vary by torch version
        raise TransformError(
            f"transform {transform_name(fn)} left the shared program invalid: {exc}",
            hint="keep the graph signature consistent: do not remove placeholders or outputs, "
            "and give new nodes a 'val' meta (run the pass on a copy to debug it)",
        ) from exc
    return out
