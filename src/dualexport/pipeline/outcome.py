"""What one target job ended with: a typed outcome instead of a bag of details.

Every outcome but ``Failed`` names files that passed the same proof (ranges read back from the
file, smoke runs from disk at the edges of every declared range) and were staged for the set's
commit; ``Failed`` staged nothing.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Self

from ..errors import DualExportError
from ..exporters import DelegationReport

__all__ = ["Proof", "Lowered", "Reused", "Patched", "Failed", "Outcome", "Published"]


@dataclass(frozen=True)
class Proof:
    """What the job proved from the file on disk before staging it: the ranges the file
    records (and, for a .pte, its memory plan) equal the declared ones, and the file ran at the
    example and at each edge (``edges``: ``min``, ``max-1``, ``max``)."""

    ranges: str
    edges: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Published:
    target: str
    files: tuple[pathlib.Path, ...]
    ops: tuple[str, ...]
    delegation: DelegationReport | None
    seconds: float
    proof: Proof

    @property
    def path(self) -> pathlib.Path:
        return self.files[0]

    def with_files(self, files: tuple[pathlib.Path, ...]) -> Self:
        """The same outcome, its files moved (staged into the set, then committed)."""
        return dataclasses.replace(self, files=files)


@dataclass(frozen=True)
class Lowered(_Published):
    """The target was decomposed and lowered from the shared program in this export."""

    weight_notes: Mapping[str, str] = field(default_factory=dict)
    #: tensors the lowered program keeps, and those among them that are not the holder's objects
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
    """A weights-only change written into copies of the previous files (same structure key)."""

    weight_notes: Mapping[str, str] = field(default_factory=dict)
    patched: int = 0


@dataclass(frozen=True)
class Failed:
    """The target was refused; ``error`` says why. Nothing of it was staged."""

    target: str
    error: DualExportError
    seconds: float


Published = Lowered | Reused | Patched
Outcome = Lowered | Reused | Patched | Failed
