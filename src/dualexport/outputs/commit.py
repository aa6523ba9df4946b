"""Set-level atomic output: the files of one export appear together or not at all.

Why: each artifact is written atomically, but an export produces a set (``.onnx``, ``.onnx.data``,
``.pte``, manifest, reference program, inputs, delegation report). A run killed between two renames
would leave a new ``.onnx`` beside an old ``.pte`` and a manifest that describes neither.

How (a redo journal, as databases do):
1. the export writes every file into one staging folder inside ``out_dir`` (same file system);
2. ``commit`` writes ``.<name>.commit.json`` atomically, naming the files to move in and the
   files of the previous set to remove: this rename is the commit point;
3. it moves the files, removes the old ones, writes ``.<name>.set.json`` (what the current set
   is), then deletes the journal and the staging folder.
A run killed before step 2 leaves the previous set (plus a staging folder the next run deletes);
killed after it, the next ``artifact_set`` or ``recover`` (``compare DIR`` calls it) rolls the
journal forward. Every step of the roll-forward can be repeated, so a kill during recovery is fine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
from collections.abc import Iterator

from ..errors import ArtifactIOError, UnsafeArtifactError
from .atomic import (
    STAGING_PREFIX,
    _fsync_dir,
    atomic_write_text,
    io_error,
    pending_staging,
    remove_dead_leftovers,
    staging_dir,
)
from .interrupts import interrupt_latch, raise_if_interrupted
from .lock import export_lock
from .paths import safe_child
from .space import check_free_space

__all__ = ["ArtifactSet", "artifact_set", "recover", "current_set", "journal_path", "KNOWN_SUFFIXES"]

logger = logging.getLogger(__name__)

SCHEMA = "dualexport.commit/1"
# Files an export (or the CLI or a fleet worker after it) writes for ``name``; used to find the
# previous set in a folder written before set records existed, and to drop stale ones: a commit
# removes the previous set's parity report, export page and fleet record with the set they
# describe, so a crash before the new ones are written leaves none rather than a wrong one.
KNOWN_SUFFIXES = (
    ".onnx",
    ".onnx.data",
    ".pte",
    ".weights.json",
    ".pt2",
    ".float.pt2",
    ".inputs.npz",
    ".delegation.json",
    ".delegation.md",
    ".parity.json",
    ".parity.html",
    ".report.html",
    ".entry.json",
    ".ptd",
    ".bpte",
)
#: Folders an export writes for ``name`` (ONNX test data sets with their model): moved as a whole.
KNOWN_FOLDER_SUFFIXES = ("_onnx_tests",)


def journal_path(out_dir: pathlib.Path, name: str) -> pathlib.Path:
    return pathlib.Path(out_dir) / f".{name}.commit.json"


def _record_path(out_dir: pathlib.Path, name: str) -> pathlib.Path:
    return pathlib.Path(out_dir) / f".{name}.set.json"


def current_set(out_dir: pathlib.Path, name: str) -> tuple[str, ...]:
    """File names of the committed set for ``name`` (from the set record, else by known suffix)."""
    out_dir = pathlib.Path(out_dir)
    names: set[str] = {name + s for s in KNOWN_SUFFIXES if (out_dir / (name + s)).is_file()}
    names |= {name + s for s in KNOWN_FOLDER_SUFFIXES if (out_dir / (name + s)).is_dir()}
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        record = json.loads(_record_path(out_dir, name).read_text())
        names.update(f for f in record.get("files", []) if isinstance(f, str))
    return tuple(sorted(names))


def _files_under(path: pathlib.Path) -> list[pathlib.Path]:
    """``path`` itself, or every file inside the folder ``path``."""
    return [p for p in sorted(path.rglob("*")) if p.is_file()] if path.is_dir() else [path]


def _move(src: pathlib.Path, dst: pathlib.Path) -> None:
    """One rename of the roll-forward (a seam the kill test uses to land between two renames).
    A folder replaces the previous one of its name: that one is removed first (repeating the
    roll-forward after a kill in between finds it gone and the staged folder still there)."""
    if src.is_dir() and dst.is_dir() and not dst.is_symlink():
        import shutil

        shutil.rmtree(dst)
    os.replace(src, dst)


def _roll_forward(out_dir: pathlib.Path, name: str, journal: dict) -> None:
    staging = safe_child(out_dir, str(journal.get("staging", "")), what="commit journal staging folder")
    if not staging.name.startswith(STAGING_PREFIX):
        raise UnsafeArtifactError(
            f"{journal_path(out_dir, name).name} names {staging.name!r}, "
            "which is not a dualexport staging folder",
            hint="delete the journal file; the folder then keeps the files it has",
        )
    files = [safe_child(out_dir, f, what="commit journal entry").name for f in journal.get("files", [])]
    remove = [safe_child(out_dir, f, what="commit journal entry").name for f in journal.get("remove", [])]
    try:
        for f in files:
            src = staging / f
            if src.exists():  # else moved before a kill: the roll-forward repeats safely
                _move(src, out_dir / f)
        for f in remove:
            with contextlib.suppress(FileNotFoundError):
                if (out_dir / f).is_dir() and not (out_dir / f).is_symlink():
                    import shutil

                    shutil.rmtree(out_dir / f)
                else:
                    os.unlink(out_dir / f)
        _fsync_dir(out_dir)
        sizes = {f: (out_dir / f).stat().st_size for f in files if (out_dir / f).is_file()}
        expected = journal.get("sizes") or {}
        wrong = [f for f in files if f in expected and sizes.get(f) != expected[f]]
        if wrong:  # the staging folder vanished before its files were moved in
            raise ArtifactIOError(
                f"the interrupted commit of {name!r} in {str(out_dir)!r} cannot be finished: "
                f"{', '.join(wrong)} are not the files it staged",
                hint=f"re-export {name!r}; the folder holds a mix of two exports until then",
            )
        atomic_write_text(
            _record_path(out_dir, name),
            json.dumps({"schema": SCHEMA, "name": name, "files": files, "sizes": sizes}, indent=1) + "\n",
        )
        os.unlink(journal_path(out_dir, name))
        _fsync_dir(out_dir)
    except OSError as exc:
        raise io_error(exc, f"the artifacts of {name!r} into {str(out_dir)!r}") from exc


def recover(out_dir: pathlib.Path, name: str) -> bool:
    """Finish a commit that a killed run left half done; remove dead runs' leftovers.

    The caller holds the lock. Returns True when a journal was rolled forward.
    """
    out_dir = pathlib.Path(out_dir)
    path = journal_path(out_dir, name)
    rolled = False
    if path.exists():
        try:
            journal = json.loads(path.read_text())
            if not isinstance(journal, dict) or journal.get("schema") != SCHEMA:
                raise ValueError(f"schema is not {SCHEMA}")
        except (OSError, ValueError) as exc:
            raise ArtifactIOError(
                f"{path.name} in {str(out_dir)!r} is not a readable commit journal: {exc}",
                hint="delete it and re-export",
            ) from exc
        logger.warning("finishing the interrupted commit of %r in %s", name, out_dir)
        _roll_forward(out_dir, name, journal)
        rolled = True
    remove_dead_leftovers(out_dir, keep=pending_staging(out_dir))
    return rolled


class ArtifactSet:
    """One export's files, staged in ``dir`` until ``commit`` moves them in as a set."""

    def __init__(self, out_dir: pathlib.Path, name: str, staging: pathlib.Path) -> None:
        self.out_dir = pathlib.Path(out_dir)
        self.name = name
        self.dir = staging
        self.committed: tuple[pathlib.Path, ...] | None = None

    def final(self, path: pathlib.Path) -> pathlib.Path:
        """Where a file staged at ``path`` lives once committed."""
        return self.out_dir / pathlib.Path(path).name

    def staged_files(self) -> list[str]:
        return sorted(
            e.name
            for e in os.scandir(self.dir)
            if (e.is_file(follow_symlinks=False) or e.is_dir(follow_symlinks=False))
            and not e.name.startswith(".")
        )

    def commit(self) -> tuple[pathlib.Path, ...]:
        """Replace the previous set by the staged files, all or nothing (see the module doc).

        Nothing staged (every target failed) keeps the previous set: a folder is never emptied
        by a failed run.
        """
        if self.committed is not None:
            return self.committed
        files = self.staged_files()
        if not files:
            logger.warning(
                "nothing to commit for %r: the previous artifacts in %s are kept", self.name, self.out_dir
            )
            self.committed = ()
            return ()
        for f in files:
            for path in _files_under(self.dir / f):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        _fsync_dir(self.dir)
        remove = sorted(set(current_set(self.out_dir, self.name)) - set(files))
        journal = {
            "schema": SCHEMA,
            "name": self.name,
            "staging": self.dir.name,
            "files": files,
            "sizes": {f: (self.dir / f).stat().st_size for f in files if (self.dir / f).is_file()},
            "remove": remove,
        }
        atomic_write_text(journal_path(self.out_dir, self.name), json.dumps(journal, indent=1) + "\n")
        _roll_forward(self.out_dir, self.name, journal)  # the journal is the commit point
        self.committed = tuple(self.out_dir / f for f in files)
        return self.committed


@contextlib.contextmanager
def artifact_set(out_dir: pathlib.Path, name: str, *, need_bytes: int = 0) -> Iterator[ArtifactSet]:
    """Lock ``out_dir``/``name``, finish any interrupted commit, check free space, and stage.

    The block writes into ``tx.dir``; a clean exit commits the set, an exception (or a kill)
    leaves the previous set untouched. A SIGINT during the block prevents the commit even when
    the ``KeyboardInterrupt`` it raised was swallowed on the way (``interrupts``).
    """
    out_dir = pathlib.Path(out_dir)
    with interrupt_latch(), export_lock(out_dir, name):
        recover(out_dir, name)
        check_free_space(out_dir, need_bytes)
        with staging_dir(out_dir) as staging:
            tx = ArtifactSet(out_dir, name, staging)
            yield tx
            raise_if_interrupted()  # a Ctrl-C that library code swallowed: no commit
            tx.commit()
