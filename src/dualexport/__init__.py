"""dualexport: one torch.export trace, two deployment targets (ONNX Runtime and ExecuTorch/XNNPACK),
and proof from the files on disk that both carry the same weights and compute what PyTorch does.

Importing this package is light: torch.onnx, onnxruntime and executorch are imported only by the
module that needs them, when it runs.
"""

from __future__ import annotations

from .api import Artifact, ExportResult, compare, export
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
    RangeNarrowedError,
    RuntimeExecutionError,
    RuntimeLoadError,
    TransformError,
    UnsafeArtifactError,
    UserError,
    WeightMismatchError,
    XnnpackLoweringError,
)
from .exporters import TARGETS, DelegationReport, ExportOptions
from .fleet import BatchRecord, EntryRecord, batch
from .parity import Metrics, OutputParity, ParityReport, Tolerance
from .pipeline import Failed, Lowered, Patched, Proof, Reused
from .shared_state import ProgramTransform, SharedProgram
from .weights import WeightCheck, WeightEntry, WeightLocation, WeightManifest

__version__ = "0.1.0"

__all__ = [
    # export and compare
    "export",
    "compare",
    "ExportResult",
    "Artifact",
    "ExportOptions",
    "TARGETS",
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
