"""A lock per ``out_dir/name`` so two exports never write the same artifacts at once.

Why flock: the kernel drops it when the holder dies (SIGKILL included), so a crashed export never
leaves a stale lock behind and a rerun succeeds without manual cleanup; the writer that takes it
also deletes what killed runs left (temp files, staging folders). Readers (``compare DIR``)
take it shared, so they never read a set while an export is committing it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pathlib
from collections.abc import Iterator

from ..errors import ArtifactIOError, ExportLockedError
from .atomic import pending_staging, remove_dead_leftovers

__all__ = ["export_lock", "lock_path"]


def lock_path(out_dir: pathlib.Path, name: str) -> pathlib.Path:
    return pathlib.Path(out_dir) / f".{name}.lock"


@contextlib.contextmanager
def export_lock(out_dir: pathlib.Path, name: str, *, shared: bool = False) -> Iterator[bool]:
    """Hold the lock for ``name`` in ``out_dir``; raise ExportLockedError at once if it is taken.

    ``shared=True`` is for readers; in a folder the reader may not write (a read-only deployment
    copy) no export can run either, so the reader goes on unlocked and gets ``False``.
    """
    path = lock_path(out_dir, name)
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR if not shared else os.O_CREAT | os.O_RDONLY, 0o644)
    except OSError as exc:
        if shared and exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            yield False
            return
        raise ArtifactIOError(
            f"cannot create the lock file {path.name} in {str(out_dir)!r}: {exc.strerror}",
            hint="choose a writable out_dir",
        ) from exc
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExportLockedError(
                f"another export is writing {name!r} in {str(out_dir)!r}",
                hint="wait for it to finish, or export under another name or folder",
            ) from None
        if not shared:  # a killed run's temp files and staging folders go now
            remove_dead_leftovers(out_dir, keep=pending_staging(out_dir))
        yield True
    finally:
        # Unlocked explicitly, not by the close alone: a child forked meanwhile (a forked
        # lowering, an isolated runtime kept for the next run) shares the open file description,
        # and a close would leave the lock held by it: the same process's next export (a
        # fallback that exports again) was then told another export was writing.
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
