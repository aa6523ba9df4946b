"""What one target job ended with: a typed outcome instead of a bag of details.

Every outcome but ``Failed`` names files that passed the same proof (ranges read back from the
file; runs from disk on the example and at the edges of every declared range, each output
judged against the shared program's) and were staged for the set's commit; ``Failed`` staged
nothing.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from ..errors import DualExportError
from ..exporters import DelegationReport

__all__ = [
    "SHARED_PROGRAM",
    "Proof",
    "ValueCheck",
    "Lowered",
    "Reused",
    "Patched",
    "Failed",
    "Outcome",
    "Published",
]


#: what a file's proof judges it against unless its target computes a deliberate approximation
SHARED_PROGRAM = "the shared program"


@dataclass(frozen=True)
class ValueCheck:
    """One input set of the proof: the file's outputs against the shared program's, all within
    the target's tolerance; the worst output's max |diff| and SNR."""

    label: str
    outputs: int
    max_abs: float
    snr_db: float

    def to_dict(self) -> dict[str, Any]:
        snr = self.snr_db if math.isfinite(self.snr_db) else "inf"
        return {"label": self.label, "outputs": self.outputs, "max_abs": self.max_abs, "snr_db": snr}


@dataclass(frozen=True)
class Proof:
    """What the job proved from the file on disk before staging it: the ranges the file
    records (and, for a .pte, its memory plan) equal the declared ones, and the file computed the
    shared program's outputs within the target's tolerance on the example and at each edge of
    the declared ranges (``edges``: ``min``, ``max-1``, ``max``; ``values``: each set's worst
    output)."""

    ranges: str
    edges: tuple[str, ...] = ()
    values: tuple[ValueCheck, ...] = ()
    #: what the outputs were judged against: the shared program, or the approximation the
    #: options asked the target to compute (``Exporter.proof_program``)
    against: str = SHARED_PROGRAM

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranges": self.ranges,
            "edges": list(self.edges),
            "values": [v.to_dict() for v in self.values],
            "against": self.against,
        }


@dataclass(frozen=True)
class _Published:
    target: str
    files: tuple[pathlib.Path, ...]
    ops: tuple[str, ...]
    delegation: DelegationReport | None
    seconds: float
    proof: Proof
    #: why the target keeps some weights otherwise than as-is, by weight name (fused, folded...)
    weight_notes: Mapping[str, str] = field(default_factory=dict)
    #: stored tensors computed from weights (an ONNX constant folded from them): name -> weights
    derived_copies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def path(self) -> pathlib.Path:
        return self.files[0]

    def with_files(self, files: tuple[pathlib.Path, ...]) -> Self:
        """The same outcome, its files moved (staged into the set, then committed)."""
        return dataclasses.replace(self, files=files)


@dataclass(frozen=True)
class Lowered(_Published):
    """The target was decomposed and lowered from the shared program in this export;
    ``because`` says why no previous file served (a patch that could not write every copy, a
    reused or patched file that failed its proof), None for a first export or a changed program."""

    because: str | None = None
    #: tensors the lowered program keeps, and those among them that are not the holder's objects
    #: (0-dim ones aside: scalars of the graph that a lowering lifts into tensors, e.g. an
    #: RMSNorm's eps or a clamp bound beside quantized linears, hold no weight)
    kept_tensors: int = 0
    kept_not_shared: tuple[str, ...] = ()
    #: lowered in a forked worker while the other target exported
    forked: bool = False
    backend_passes: object = None
    opset: int | None = None


@dataclass(frozen=True)
class Reused(_Published):
    """A cache hit: the previous set's files for the very same program, options and code."""

    cache_key: str = ""


@dataclass(frozen=True)
class Patched(_Published):
    """A weights-only change written into copies of the previous files (same structure key):
    ``patched`` weights, every stored copy of each (``copies`` places in all)."""

    patched: int = 0
    copies: int = 0


@dataclass(frozen=True)
class Failed:
    """The target was refused; ``error`` says why. Nothing of it was staged."""

    target: str
    error: DualExportError
    seconds: float


Published = Lowered | Reused | Patched
Outcome = Lowered | Reused | Patched | Failed
