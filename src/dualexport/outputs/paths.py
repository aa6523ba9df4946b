"""Checks on names and paths: nothing is written or read outside the output folder."""

from __future__ import annotations

import os
import pathlib

from ..errors import InputError, UnsafeArtifactError

__all__ = ["check_name", "prepare_out_dir", "safe_child"]

_MAX_NAME = 200  # leaves room for the longest suffix (".delegation.json") and temp-file tags


def check_name(name: str) -> str:
    """The artifact stem must be one plain file name, so every file lands inside out_dir."""
    if (
        not isinstance(name, str)
        or not name
        or name in {".", ".."}
        or "/" in name
        or "\\" in name
        or os.sep in name
        or name.startswith(".")
        or any(ord(c) < 32 for c in name)
    ):
        raise InputError(
            f"name {name!r} is not a plain file name",
            hint="use a name without path separators, control characters or a leading dot, "
            "e.g. name='resnet18'",
        )
    if len(name.encode("utf-8")) > _MAX_NAME:
        raise InputError(
            f"name is {len(name.encode('utf-8'))} bytes long; file names allow at most {_MAX_NAME}",
            hint="use a shorter name",
        )
    return name


def prepare_out_dir(out_dir: str | os.PathLike) -> pathlib.Path:
    """Create ``out_dir`` if needed and prove it is a writable folder, before any work."""
    if not isinstance(out_dir, (str, os.PathLike)):
        raise InputError(
            f"out_dir must be a path, got {type(out_dir).__name__}", hint="pass a str or pathlib.Path"
        )
    path = pathlib.Path(out_dir)
    if path.exists() and not path.is_dir():
        raise InputError(
            f"out_dir {str(path)!r} exists and is not a directory", hint="choose a folder path for out_dir"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"cannot create out_dir {str(path)!r}: {exc.strerror}", hint="choose a writable folder"
        ) from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"out_dir {str(path)!r} is not writable", hint="choose a writable folder")
    return path.resolve()


def safe_child(folder: pathlib.Path, location: str, *, what: str) -> pathlib.Path:
    """Resolve a file name recorded inside an artifact; refuse anything that leaves ``folder``.

    Only a plain name is accepted (no absolute path, no ``..``, no sub-folder, no backslash that
    Windows would read as a separator), and a symlink must resolve inside the folder.
    """
    if (
        not isinstance(location, str)
        or not location
        or os.path.isabs(location)
        or pathlib.PurePath(location).name != location
        or location in {".", ".."}
        or "\\" in location
        or "\x00" in location
    ):
        raise UnsafeArtifactError(
            f"{what} refers to {location!r}, which is not a plain file name in the artifact's folder",
            hint="re-export the artifact; never load files that point outside their folder",
        )
    folder = pathlib.Path(folder).resolve()
    path = folder / location
    if path.is_symlink() and not path.resolve().is_relative_to(folder):
        raise UnsafeArtifactError(
            f"{what} {location!r} is a symlink that leaves the artifact's folder",
            hint="replace the symlink with the real file",
        )
    return path
