"""Re-open an export folder from disk (``dualexport compare DIR``): manifest, reference program,
example inputs and artifacts, treating every file as untrusted.

Why untrusted: a folder may come from a download or a CI artifact store. So, before any runtime
parses a file: names recorded in the manifest and ONNX external-data locations must be plain
file names inside the folder (no absolute path, no ``..``, no symlink out); a ``.pte`` must carry
the ExecuTorch file identifier; a file shorter than the set record says is truncated; and the
reference ``.pt2`` is loaded with ``torch.export.load`` only after refusing archives that hold
pickled objects, and with every ``torch.load`` inside forced to ``weights_only`` (torch's own
loader otherwise falls back to full pickle). Inputs are read from ``.npz`` without pickle.
Nothing is written here; the CLI writes its report inside the folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import threading
import zipfile
from collections.abc import Iterator
from typing import Any

from ..errors import (
    ArtifactFormatError,
    ArtifactIOError,
    InputError,
    UnsafeArtifactError,
    WeightMismatchError,
)
from ..outputs.commit import journal_path, recover
from ..outputs.lock import export_lock
from ..outputs.paths import check_name, safe_child
from ..shared_state.contract import DATA_SUFFIX, unflatten_inputs
from ..weights import WeightCheck, WeightManifest, verify_manifest
from ..weights.locate import holder_tensors
from ..weights.readers import check_pte_header, read_onnx
from .compare import run_parity
from .inputs import edge_input_sets, extra_input_sets, load_inputs
from .report import ParityReport

__all__ = ["find_name", "load_manifest", "artifact_paths", "load_program", "check_artifacts", "compare_dir"]

_FORCE_LOCK = threading.Lock()


def find_name(folder: pathlib.Path, name: str | None) -> str:
    if not folder.is_dir():
        raise InputError(f"{str(folder)!r} is not a folder", hint="pass the out_dir of an export")
    if name is not None:
        return check_name(name)
    found = sorted(
        p.name[: -len(".weights.json")] for p in folder.glob("*.weights.json") if not p.name.startswith(".")
    )
    if len(found) != 1:
        raise InputError(
            f"{str(folder)!r} holds {len(found)} exports ({found})",
            hint="pass --name to choose one" if found else "export into it first",
        )
    return found[0]


def load_manifest(folder: pathlib.Path, name: str) -> WeightManifest:
    path = safe_child(folder, f"{name}.weights.json", what="the manifest")
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"top level is a {type(data).__name__}, not an object")
        manifest = WeightManifest.from_dict(data)
    except FileNotFoundError as exc:
        raise ArtifactIOError(
            f"{path.name} is missing from {str(folder)!r}", hint="export into the folder first"
        ) from exc
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ArtifactFormatError(
            f"{path.name} is not a readable dualexport manifest: {exc}",
            hint="re-export into the folder; the file is truncated or foreign",
        ) from exc
    if not isinstance(manifest.artifacts, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("file"), str) for v in manifest.artifacts.values()
    ):
        raise ArtifactFormatError(
            f"{path.name} does not list its artifacts as {{target: {{'file': name}}}}",
            hint="re-export into the folder",
        )
    return manifest


def artifact_paths(folder: pathlib.Path, manifest: WeightManifest) -> dict[str, pathlib.Path]:
    """target -> artifact path, each name checked to be a plain file inside ``folder``."""
    out = {}
    for target, info in manifest.artifacts.items():
        if target not in ("onnx", "xnnpack"):
            raise ArtifactFormatError(
                f"the manifest lists an unknown target {target!r}", hint="re-export into the folder"
            )
        out[target] = safe_child(folder, info["file"], what=f"the manifest's {target} artifact")
        for side in info.get("files", []) or []:
            safe_child(folder, side, what=f"the manifest's {target} side file")
    return out


def _check_sizes(folder: pathlib.Path, name: str) -> None:
    """Files shorter or longer than the set record says were cut or replaced after the export."""
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
        record = json.loads((folder / f".{name}.set.json").read_text())
        for fname, size in (record.get("sizes") or {}).items():
            path = safe_child(folder, fname, what="the set record")
            if path.is_file() and path.stat().st_size != size:
                raise ArtifactFormatError(
                    f"{fname} is {path.stat().st_size} bytes, but the export wrote {size}",
                    hint="the file was truncated or replaced; re-export into the folder",
                )


def check_artifacts(folder: pathlib.Path, name: str, paths: dict[str, pathlib.Path]) -> None:
    """Refuse truncated, foreign or escaping artifacts before any runtime parses them."""
    _check_sizes(folder, name)
    for target, path in paths.items():
        if not path.is_file():
            raise ArtifactIOError(
                f"{path.name} ({target}) is missing from {str(folder)!r}",
                hint="re-export into the folder; the set is incomplete",
            )
        if target == "onnx":
            read_onnx(path)  # checks every external-data location and length
        else:
            with open(path, "rb") as f:
                check_pte_header(path, f.read(8))
            data = path.with_suffix(DATA_SUFFIX)
            if data.exists() or data.is_symlink():
                safe_child(folder, data.name, what=f"the data file of {path.name}")
                if not data.is_file():
                    raise ArtifactFormatError(
                        f"{data.name} beside {path.name} is not a regular file",
                        hint="keep the real .ptd file next to the .pte file",
                    )


def _refuse_pickles(path: pathlib.Path) -> None:
    """A .pt2 whose archive carries pickled objects (legacy weights, custom or opaque objects)
    would run code from the file when loaded; refuse it up front."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        raise ArtifactFormatError(
            f"{path.name} is not a torch.export archive: {exc}",
            hint="re-export; the file is truncated or foreign",
        ) from exc
    from torch.export.pt2_archive.constants import CUSTOM_OBJ_FILENAME_PREFIX, OPAQUE_OBJ_FILENAME_PREFIX

    for n in names:
        base = n.rsplit("/", 1)[-1]
        legacy = n.endswith(".pt") and ("/weights/" in n or "/constants/" in n)
        if legacy or base.startswith((CUSTOM_OBJ_FILENAME_PREFIX, OPAQUE_OBJ_FILENAME_PREFIX)):
            raise UnsafeArtifactError(
                f"{path.name} holds a pickled object ({n}); loading it could run code from the file",
                hint="re-export with dualexport; never load reference programs from untrusted sources",
            )


@contextlib.contextmanager
def _weights_only_loads() -> Iterator[None]:
    """Force every torch.load in this block to weights_only=True (torch.export.load otherwise
    retries sample inputs with full pickle). Process-wide, so serialized by a lock."""
    with _FORCE_LOCK:
        old = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
        os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
            else:
                os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = old


def load_program(path: pathlib.Path) -> Any:
    """torch.export.load without pickle: refuse pickled members, force weights_only loads."""
    import torch

    path = pathlib.Path(path)
    if not path.is_file():
        raise ArtifactIOError(
            f"the reference program {path.name} is missing",
            hint="re-export; the .pt2 keeps what is needed to rebuild eager",
        )
    _refuse_pickles(path)
    try:
        with _weights_only_loads():
            return torch.export.load(str(path))
    except Exception as exc:
        raise ArtifactFormatError(
            f"cannot load the reference program {path.name}: {exc}",
            hint="re-export; the .pt2 keeps what is needed to rebuild eager",
        ) from exc


@contextlib.contextmanager
def _reading(folder: pathlib.Path, name: str) -> Iterator[None]:
    """Finish an interrupted commit (exclusive lock), then read under a shared lock so no export
    commits this name while we read it."""
    if journal_path(folder, name).exists():
        with export_lock(folder, name):
            recover(folder, name)
    with export_lock(folder, name, shared=True):
        yield


def compare_dir(
    folder: pathlib.Path,
    *,
    name: str | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    steps: int = 1,
    inputs: pathlib.Path | None = None,
    generate: int = 0,
    edges: bool = True,
) -> tuple[ParityReport, WeightCheck | None, WeightMismatchError | None, str]:
    folder = pathlib.Path(folder).resolve()
    name = find_name(folder, name)
    with _reading(folder, name):
        manifest = load_manifest(folder, name)
        artifacts = artifact_paths(folder, manifest)
        check_artifacts(folder, name, artifacts)
        program = load_program(safe_child(folder, f"{name}.pt2", what="the reference program"))
        check, werr = None, None
        try:
            check = verify_manifest(manifest, folder, holder_tensors(program))
        except WeightMismatchError as exc:
            werr = exc
        flat = load_inputs(safe_child(folder, f"{name}.inputs.npz", what="the example inputs"))
        try:
            args, kwargs = unflatten_inputs(program, flat)
        except InputError as exc:
            raise ArtifactFormatError(
                f"{name}.inputs.npz does not fit the program's inputs: {exc}",
                hint="re-export; the inputs file belongs to another export",
            ) from exc
        sets = [("example", args, kwargs)]
        sets += extra_input_sets(program, flat, inputs, generate)
        if edges:
            sets += edge_input_sets(program, flat)
        float_path = folder / f"{name}.float.pt2"  # an int8 export's float model (its noise yardstick)
        float_program = (
            load_program(safe_child(folder, float_path.name, what="the float reference"))
            if float_path.is_file()
            else None
        )
        from ..exporters import ExportOptions

        options = {t: ExportOptions.from_dict(manifest.artifacts[t].get("options")) for t in artifacts}
        report = run_parity(
            program,
            artifacts,
            sets,
            rtol=rtol,
            atol=atol,
            steps=steps,
            float_program=float_program,
            decompose_options=options,
        )
    return report, check, werr, name
