"""Optimization passes for the shared program, applied once so both targets get them.

Each pass is an ordinary dualexport transform (``ExportedProgram -> ExportedProgram``), so it is
used as ``dx.export(..., transforms=DEFAULT_PASSES)`` or picked one by one. Each is proven by
parity on the zoo (``tests/test_passes.py``): both artifacts still match eager and carry the
state_dict's bytes, and XNNPACK gets fewer subgraphs / a higher delegated share.
"""

from __future__ import annotations

from torch.export import ExportedProgram

from .decompose import REWRITES, attention_as_bmm, decompose_layer_norm, views_for_shape_ops, xnnpack_friendly
from .fold import FOLD_MAX_BYTES, fold_constants

__all__ = [
    "DEFAULT_PASSES",
    "fold_constants",
    "xnnpack_friendly",
    "REWRITES",
    "decompose_layer_norm",
    "attention_as_bmm",
    "views_for_shape_ops",
    "FOLD_MAX_BYTES",
    "optimize",
]


def optimize(program: ExportedProgram) -> ExportedProgram:
    """Every default pass in order, as one transform."""
    for p in DEFAULT_PASSES:
        program = p(program)
    return program


#: Applied in order: fold the input-independent mask/position prologue first (so the rewrites
#: below see constants), then rewrite the ops XNNPACK refuses.
DEFAULT_PASSES = (fold_constants, xnnpack_friendly)
