"""Output files: atomic writes, set-level commits, locks, free-space and path safety."""

from __future__ import annotations

from .atomic import atomic_write_bytes, atomic_write_text, commit_files, remove_dead_leftovers, staging_dir
from .commit import ArtifactSet, artifact_set, current_set, recover
from .interrupts import raise_if_interrupted
from .lock import export_lock
from .paths import check_name, prepare_out_dir, safe_child
from .space import check_free_space, needed_bytes

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "commit_files",
    "staging_dir",
    "remove_dead_leftovers",
    "ArtifactSet",
    "artifact_set",
    "current_set",
    "recover",
    "export_lock",
    "raise_if_interrupted",
    "check_name",
    "prepare_out_dir",
    "safe_child",
    "check_free_space",
    "needed_bytes",
]
