"""Output files: atomic writes, staging folders, and path safety."""

from __future__ import annotations

from .atomic import atomic_write_bytes, atomic_write_text, commit_files, staging_dir
from .paths import check_name, prepare_out_dir, safe_child

__all__ = ["atomic_write_bytes", "atomic_write_text", "commit_files", "staging_dir",
           "check_name", "prepare_out_dir", "safe_child"]
