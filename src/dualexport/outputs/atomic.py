"""Write files completely or not at all: temp file in the same folder, fsync, rename.

Why the same folder: ``os.replace`` is atomic only within one filesystem, and a temp file in /tmp
would also be a write outside the output folder.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence

__all__ = ["atomic_write_bytes", "atomic_write_text", "staging_dir", "commit_files", "STAGING_PREFIX"]

STAGING_PREFIX = ".dualexport-staging-"


def _fsync_dir(path: pathlib.Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: pathlib.Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def staging_dir(out_dir: pathlib.Path) -> Iterator[pathlib.Path]:
    """A private folder inside ``out_dir`` where a target writes; removed whatever happens."""
    path = pathlib.Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out_dir))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def commit_files(files: Sequence[pathlib.Path], out_dir: pathlib.Path) -> tuple[pathlib.Path, ...]:
    """Move staged files into ``out_dir`` (side files first, the main file last), each atomically."""
    moved = []
    for src in list(files[1:]) + list(files[:1]):
        with open(src, "rb") as f:
            os.fsync(f.fileno())
        dst = out_dir / src.name
        os.replace(src, dst)
        moved.append(dst)
    _fsync_dir(out_dir)
    return tuple(sorted(moved, key=lambda p: p != out_dir / files[0].name))
