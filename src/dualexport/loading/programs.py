"""Programs from files: a ``.pt2`` written by ``torch.export.save`` as the source of an export.

Why refuse early and by name: ``torch.export.load`` on a file that is not its archive (an
AOTInductor package also ends in ``.pt2``, a ``torch.save``d model in ``.pt``) fails deep inside
its deserializer; the user should read which file it was and what to save instead.
"""

from __future__ import annotations

import os
import pathlib
import zipfile
from typing import Any

from ..errors import InputError

__all__ = ["load_program", "is_program_ref", "PROGRAM_SUFFIX"]

PROGRAM_SUFFIX = ".pt2"

_SAVE_HINT = "save a program with torch.export.save(torch.export.export(model.eval(), args), 'model.pt2')"


def is_program_ref(ref: str) -> bool:
    """Whether a CLI model reference names a file (a ``.pt2``, or any existing file) rather
    than ``MODULE:ATTR``."""
    if ref.lower().endswith(PROGRAM_SUFFIX):
        return True
    path = pathlib.Path(ref)
    return ":" not in ref and (
        path.is_file() or path.suffix.lower() in (".pt", ".pth", ".onnx", ".pte", ".bin")
    )


def load_program(path: str | os.PathLike[str]) -> Any:
    """The ExportedProgram in ``path`` (``torch.export.load``, no pickle), or InputError naming
    the file and what is wrong with it."""
    p = pathlib.Path(path)
    if p.suffix.lower() != PROGRAM_SUFFIX:
        raise InputError(
            f"{str(p)!r} is not a .pt2 file: dualexport takes a program saved by torch.export.save "
            "(or an nn.Module as MODULE:ATTR)",
            hint=_SAVE_HINT,
        )
    if not p.is_file():
        raise InputError(f"no such file: {str(p)!r}", hint="check the path (relative to the current folder)")
    if not zipfile.is_zipfile(p):
        raise InputError(f"{str(p)!r} is not a torch.export archive (not a zip file)", hint=_SAVE_HINT)
    import torch
    from torch.export import ExportedProgram

    try:
        program = torch.export.load(p)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(
            f"torch.export.load could not read {str(p)!r}: {type(exc).__name__}: {first}",
            hint="pass a file written by torch.export.save with torch "
            f"{torch.__version__.split('+')[0]} (an AOTInductor package is not a program); " + _SAVE_HINT,
        ) from exc
    if not isinstance(program, ExportedProgram):
        raise InputError(
            f"{str(p)!r} holds a {type(program).__name__}, not an ExportedProgram", hint=_SAVE_HINT
        )
    return program
