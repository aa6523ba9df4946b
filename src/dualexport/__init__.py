"""dualexport: one torch.export trace, two deployment targets (ONNX Runtime and ExecuTorch/XNNPACK),
and proof from the files on disk that both carry the same weights and compute what PyTorch does.

Importing this package is light: its names are imported on first use (``dx.export`` imports
torch), and torch.onnx, onnxruntime and executorch only by the module that needs them, when it runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    ArtifactFormatError,
    ArtifactIOError,
    CaptureError,
    DecompositionError,
    DelegationError,
    DiskSpaceError,
    DualExportError,
    ExportLockedError,
    InputError,
    InternalError,
    LoweringError,
    OnnxLoweringError,
    ParityError,
    ProgramMutatedError,
    ProofMismatchError,
    RangeNarrowedError,
    RuntimeExecutionError,
    RuntimeLoadError,
    TransformError,
    UnsafeArtifactError,
    UserError,
    WeightMismatchError,
    XnnpackLoweringError,
)

if TYPE_CHECKING:
    from .api import Artifact, ExportResult, compare, export
    from .exporters import TARGETS, DelegationReport, ExportOptions
    from .fleet import BatchRecord, EntryRecord
    from .fleet.batch import batch
    from .llm import export_llm, generate
    from .parity import Metrics, OutputParity, ParityReport, Tolerance
    from .pipeline import Failed, Lowered, Patched, Proof, Reused
    from .shared_state import ProgramTransform, SharedProgram
    from .weights import WeightCheck, WeightEntry, WeightLocation, WeightManifest

#: Names imported on first use (PEP 562), so that ``import dualexport`` does not import torch:
#: ``dualexport batch`` starts its fork server (which imports the whole stack) first, and the
#: driver's own imports then overlap with it.
_LAZY = {
    **dict.fromkeys(("Artifact", "ExportResult", "compare", "export"), ".api"),
    **dict.fromkeys(("TARGETS", "DelegationReport", "ExportOptions"), ".exporters"),
    **dict.fromkeys(("BatchRecord", "EntryRecord", "batch"), ".fleet"),
    **dict.fromkeys(("export_llm", "generate"), ".llm"),
    **dict.fromkeys(("Metrics", "OutputParity", "ParityReport", "Tolerance"), ".parity"),
    **dict.fromkeys(("Failed", "Lowered", "Patched", "Proof", "Reused"), ".pipeline"),
    **dict.fromkeys(("ProgramTransform", "SharedProgram"), ".shared_state"),
    **dict.fromkeys(("WeightCheck", "WeightEntry", "WeightLocation", "WeightManifest"), ".weights"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    # export and compare
    "export",
    "compare",
    "ExportResult",
    "Artifact",
    "ExportOptions",
    "TARGETS",
    # generative decoders
    "export_llm",
    "generate",
    # a zoo at once
    "batch",
    "BatchRecord",
    "EntryRecord",
    # the shared program
    "SharedProgram",
    "ProgramTransform",
    # how each target's files were made
    "Lowered",
    "Reused",
    "Patched",
    "Failed",
    "Proof",
    # results
    "DelegationReport",
    "WeightManifest",
    "WeightEntry",
    "WeightLocation",
    "WeightCheck",
    "ParityReport",
    "OutputParity",
    "Metrics",
    "Tolerance",
    # errors: the base, the user's and ours
    "DualExportError",
    "UserError",
    "InternalError",
    # errors by phase
    "InputError",
    "CaptureError",
    "TransformError",
    "DecompositionError",
    "LoweringError",
    "OnnxLoweringError",
    "XnnpackLoweringError",
    "DelegationError",
    "RangeNarrowedError",
    "RuntimeLoadError",
    "RuntimeExecutionError",
    "ProofMismatchError",
    "ParityError",
    "WeightMismatchError",
    "ProgramMutatedError",
    # errors of files and folders
    "ArtifactIOError",
    "ArtifactFormatError",
    "UnsafeArtifactError",
    "ExportLockedError",
    "DiskSpaceError",
]
