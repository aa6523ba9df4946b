"""The weight manifest: where each state_dict entry lives in each artifact, checked from disk."""

from __future__ import annotations

from .manifest import WeightEntry, WeightLocation, WeightManifest
from .verify import WeightCheck, verify_manifest

__all__ = ["WeightEntry", "WeightLocation", "WeightManifest", "WeightCheck", "verify_manifest"]
