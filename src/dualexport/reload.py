"""Re-open an export folder from disk (``dualexport compare DIR``): manifest, reference program
(torch.export.load, no pickle of code), example inputs (.npz without pickle) and artifacts."""

from __future__ import annotations

import json
import pathlib

from .errors import ArtifactIOError, InputError, WeightMismatchError
from .parity.compare import run_parity
from .parity.inputs import load_inputs
from .parity.report import ParityReport
from .weights import WeightCheck, WeightManifest, verify_manifest
from .weights.locate import holder_tensors

__all__ = ["find_name", "load_manifest", "compare_dir"]


def find_name(folder: pathlib.Path, name: str | None) -> str:
    if not folder.is_dir():
        raise InputError(f"{str(folder)!r} is not a folder", hint="pass the out_dir of an export")
    if name is not None:
        return name
    found = sorted(p.name[: -len(".weights.json")] for p in folder.glob("*.weights.json"))
    if len(found) != 1:
        raise InputError(f"{str(folder)!r} holds {len(found)} exports ({found})",
                         hint="pass --name to choose one" if found else "export into it first")
    return found[0]


def load_manifest(folder: pathlib.Path, name: str) -> WeightManifest:
    path = folder / f"{name}.weights.json"
    try:
        return WeightManifest.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactIOError(f"{path.name} is not a readable dualexport manifest: {exc}",
                              hint="re-export into the folder") from exc


def compare_dir(folder: pathlib.Path, *, name: str | None = None, rtol: float | None = None,
                atol: float | None = None, steps: int = 1
                ) -> tuple[ParityReport, WeightCheck | None, WeightMismatchError | None, str]:
    import torch
    from torch.utils import _pytree as pytree

    folder = pathlib.Path(folder)
    name = find_name(folder, name)
    manifest = load_manifest(folder, name)
    pt2 = folder / f"{name}.pt2"
    try:
        program = torch.export.load(str(pt2))
    except Exception as exc:
        raise ArtifactIOError(f"cannot load the reference program {pt2.name}: {exc}",
                              hint="re-export; the .pt2 keeps what is needed to rebuild eager") from exc
    check, werr = None, None
    try:
        check = verify_manifest(manifest, folder, holder_tensors(program))
    except WeightMismatchError as exc:
        werr = exc
    flat = load_inputs(folder / f"{name}.inputs.npz")
    spec = program.call_spec.in_spec
    args, kwargs = pytree.tree_unflatten(flat, spec) if spec is not None else (tuple(flat), {})
    artifacts = {t: folder / info["file"] for t, info in manifest.artifacts.items()}
    report = run_parity(program, artifacts, [("example", tuple(args), dict(kwargs))],
                        rtol=rtol, atol=atol, steps=steps)
    return report, check, werr, name
