"""A lock per ``out_dir/name`` so two exports never write the same artifacts at once."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
from collections.abc import Iterator

from ..errors import ArtifactIOError

__all__ = ["export_lock"]


@contextlib.contextmanager
def export_lock(out_dir: pathlib.Path, name: str) -> Iterator[None]:
    path = out_dir / f".{name}.lock"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ArtifactIOError(
                f"another export is writing {name!r} in {str(out_dir)!r}",
                hint="wait for it to finish, or export under another name or folder") from None
        yield
    finally:
        os.close(fd)
