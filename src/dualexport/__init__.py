"""dualexport: one torch.export trace, two deployment targets (ONNX Runtime and ExecuTorch/XNNPACK),
and proof from the files on disk that both carry the same weights and compute what PyTorch does.

Importing this package is light: torch.onnx, onnxruntime and executorch are imported only by the
module that needs them, when it runs.
"""

from __future__ import annotations

from .api import Artifact, ExportResult, compare, export
from .errors import (
    ArtifactIOError,
    CaptureError,
    DecompositionError,
    DualExportError,
    InputError,
    InternalError,
    LoweringError,
    OnnxLoweringError,
    ParityError,
    ProgramMutatedError,
    RuntimeExecutionError,
    RuntimeLoadError,
    TransformError,
    UserError,
    WeightMismatchError,
    XnnpackLoweringError,
)
from .exporters import TARGETS, DelegationReport, ExportOptions
from .parity import Metrics, OutputParity, ParityReport, Tolerance
from .shared_state import ProgramTransform, SharedProgram
from .weights import WeightCheck, WeightEntry, WeightLocation, WeightManifest

__version__ = "0.1.0"

__all__ = [
    # export and compare
    "export", "compare", "ExportResult", "Artifact", "ExportOptions", "TARGETS",
    # the shared program
    "SharedProgram", "ProgramTransform",
    # results
    "DelegationReport", "WeightManifest", "WeightEntry", "WeightLocation", "WeightCheck",
    "ParityReport", "OutputParity", "Metrics", "Tolerance",
    # errors
    "DualExportError", "UserError", "InternalError", "InputError", "CaptureError",
    "TransformError", "DecompositionError", "LoweringError", "OnnxLoweringError",
    "XnnpackLoweringError", "RuntimeLoadError", "RuntimeExecutionError", "ParityError",
    "WeightMismatchError", "ArtifactIOError", "ProgramMutatedError",
]
