"""Passes over the shared program (both targets get them) and the pass protocol every target's
own pipeline follows (``base.ProgramPass``: it declares what it serves and whether it edits its
input).

Shared by default (``ExportOptions.canonicalize`` / ``fold_constants``): the canonicalizations
(semantics-preserving rewrites that keep a library from failing on an ordinary model) and the
folding of input-independent subgraphs. Target-specific rewrites live with their target
(``exporters/xnnpack_rewrites.py``) and run on that target's decomposed program only.
"""

from __future__ import annotations

from .attention import ExplicitMaskedRows
from .base import PassContractError, PassRecord, PassResult, ProgramPass
from .broadcasts import BroadcastOperands, SlicedConstants
from .canonical import (
    CANONICALIZATIONS,
    ContiguousAsCopy,
    ExplicitPoolArgs,
    IndexAsView,
    ReshapeForView,
    SqueezeOnlyUnitDims,
)
from .fold import FOLD_MAX_BYTES, FoldConstants, fold_constants
from .fold_symbolic import FoldSymbolic
from .lookups import IntegerIdentities, UniformLookup
from .scalars import AssertOnlyScalars

#: Canonicalizations that read folded constants: run after ``FoldConstants`` (with
#: ExportOptions.canonicalize).
AFTER_FOLDING: tuple[ProgramPass, ...] = (
    IntegerIdentities(),
    UniformLookup(),
    IndexAsView(),
    FoldSymbolic(),
    SlicedConstants(),
    BroadcastOperands(),
    ExplicitMaskedRows(),
    FoldSymbolic(),
)

__all__ = [
    # the protocol
    "ProgramPass",
    "PassResult",
    "PassRecord",
    "PassContractError",
    # canonicalizations
    "CANONICALIZATIONS",
    "ReshapeForView",
    "ContiguousAsCopy",
    "ExplicitPoolArgs",
    "AssertOnlyScalars",
    "IndexAsView",
    "SqueezeOnlyUnitDims",
    "IntegerIdentities",
    "UniformLookup",
    "SlicedConstants",
    "BroadcastOperands",
    "AFTER_FOLDING",
    "ExplicitMaskedRows",
    # folding
    "FoldConstants",
    "fold_constants",
    "FOLD_MAX_BYTES",
    "FoldSymbolic",
]
