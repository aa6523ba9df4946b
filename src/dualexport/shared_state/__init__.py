"""The shared program: capture, transforms, decompositions, state_dict links, fingerprint."""

from __future__ import annotations

from .fingerprint import ProgramFingerprint, fingerprint
from .links import LinkReport, link_state_dict
from .program import SharedProgram
from .tensor_bytes import storage_key, tensor_bytes, tensor_sha256
from .transforms import ProgramTransform, TransformRecord

__all__ = [
    "SharedProgram",
    "ProgramTransform",
    "TransformRecord",
    "LinkReport",
    "link_state_dict",
    "ProgramFingerprint",
    "fingerprint",
    "storage_key",
    "tensor_bytes",
    "tensor_sha256",
]
