"""Write files completely or not at all: temp file in the same folder, fsync, rename.

Why the same folder: ``os.replace`` is atomic only within one filesystem, and a temp file in /tmp
would also be a write outside the output folder. Temp files and staging folders carry the host
and the pid of their writer in their name, so a later run can tell the leftovers of a killed
process (safe to delete) from the work of a live one (left alone).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pathlib
import re
import shutil
import socket
import tempfile
from collections.abc import Collection, Iterator, Sequence

from ..errors import ArtifactIOError, DiskSpaceError

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "staging_dir",
    "commit_files",
    "STAGING_PREFIX",
    "remove_dead_leftovers",
    "pending_staging",
    "io_error",
]

STAGING_PREFIX = ".dualexport-staging-"
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
# .<file>.<host>-<pid>.<random>.tmp  and  .dualexport-staging-<host>-<pid>-<random>
_TMP_RE = re.compile(r"^\..+\.(?P<host>[0-9a-f]{8})-(?P<pid>\d+)\.[^.]+\.tmp$")
_STAGING_RE = re.compile(re.escape(STAGING_PREFIX) + r"(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[^/]+$")


def _umask() -> int:
    """The process umask, read without changing it (os.umask would race with other threads)."""
    with contextlib.suppress(OSError, ValueError):
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def _owner_tag() -> str:
    return f"{_HOST}-{os.getpid()}"


def io_error(exc: OSError, what: str) -> ArtifactIOError:
    """Turn an OSError into the error a user can act on (a full disk says so)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskSpaceError(
            f"no space left while writing {what}",
            hint="free disk space in the output folder's file system, or choose "
            "another out_dir; the previous artifacts were left as they were",
        )
    return ArtifactIOError(
        f"cannot write {what}: {exc.strerror or exc}", hint="check the folder's permissions and free space"
    )


def _fsync_dir(path: pathlib.Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the whole new one."""
    path = pathlib.Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_owner_tag()}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise io_error(exc, path.name) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; match what open() would make
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise io_error(exc, path.name) from exc
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: pathlib.Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def staging_dir(out_dir: pathlib.Path) -> Iterator[pathlib.Path]:
    """A private folder inside ``out_dir`` where a target writes; removed whatever happens
    (and, after a SIGKILL, by the next run: its name says which process made it)."""
    try:
        path = pathlib.Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{_owner_tag()}-", dir=out_dir))
    except OSError as exc:
        raise io_error(exc, f"a staging folder in {str(out_dir)!r}") from exc
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def commit_files(files: Sequence[pathlib.Path], out_dir: pathlib.Path) -> tuple[pathlib.Path, ...]:
    """Move staged files into ``out_dir`` (side files first, the main file last), each atomically.

    Each file is atomic on its own; a set of files is atomic only through ``artifact_set``.
    """
    moved = []
    try:
        for src in list(files[1:]) + list(files[:1]):
            with open(src, "rb") as f:
                os.fsync(f.fileno())
            dst = out_dir / src.name
            os.replace(src, dst)
            moved.append(dst)
    except OSError as exc:
        raise io_error(exc, f"artifacts into {str(out_dir)!r}") from exc
    _fsync_dir(out_dir)
    return tuple(sorted(moved, key=lambda p: p != out_dir / files[0].name))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_dead_leftovers(out_dir: pathlib.Path, *, keep: Collection[str] = ()) -> list[str]:
    """Delete temp files and staging folders whose writer (this host, that pid) is gone.

    Why only dead writers: the lock is per name, so another name's export may be staging in the
    same folder right now; its files carry a live pid and are left alone. ``keep`` names staging
    folders an unfinished commit journal still needs.
    """
    removed: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(out_dir):
            m = _STAGING_RE.match(entry.name) or _TMP_RE.match(entry.name)
            if m is None or entry.name in keep or m["host"] != _HOST or _pid_alive(int(m["pid"])):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
            removed.append(entry.name)
    return removed


def pending_staging(out_dir: pathlib.Path) -> set[str]:
    """Staging folders that unfinished commit journals (any name) still need: never deleted."""
    import json

    keep: set[str] = set()
    for j in pathlib.Path(out_dir).glob(".*.commit.json"):
        with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
            keep.add(str(json.loads(j.read_text()).get("staging", "")))
    return keep
