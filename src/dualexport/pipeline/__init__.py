"""The export pipeline: one job per target in a fixed order (pin, reuse/patch/lower, prove from
disk, unpin, stage), and the set that holds the jobs' files, the manifest and the side files."""

from __future__ import annotations

from .export import SetResult, cache_keys, export_set
from .job import JobKeys, Previous, TargetJob
from .outcome import Failed, Lowered, Outcome, Patched, Proof, Published, Reused

__all__ = [
    # the set
    "export_set",
    "SetResult",
    "cache_keys",
    # one target
    "TargetJob",
    "JobKeys",
    "Previous",
    # outcomes
    "Outcome",
    "Published",
    "Lowered",
    "Reused",
    "Patched",
    "Failed",
    "Proof",
]
