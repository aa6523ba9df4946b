"""The set's weight manifest, built from the files the jobs staged (never from memory)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .._versions import library_versions
from ..exporters import ExportOptions
from ..shared_state import ProgramFingerprint, SharedProgram
from ..weights import WeightLocation, WeightManifest
from ..weights.locate import build_entries, holder_tensors, locate_onnx, locate_pte
from ..weights.readers import read_onnx, read_pte
from .job import JobKeys, Previous
from .outcome import Lowered, Published, Reused

__all__ = ["build_manifest"]


def _artifact_record(out: Published, keys: JobKeys, options: ExportOptions) -> dict[str, Any]:
    return {
        "file": out.path.name,
        "files": [f.name for f in out.files],
        "cache_key": keys.cache,
        "structure_key": keys.structure,
        "ops": list(out.ops),
        "delegation": out.delegation.to_dict() if out.delegation is not None else None,
        "proof": out.proof.to_dict(),
        "strategy": type(out).__name__.lower(),
        **({"lowered_because": out.because} if isinstance(out, Lowered) and out.because else {}),
        "derived": {k: list(v) for k, v in out.derived_copies.items()},
        # what the target's decomposition was made with (``dualexport compare DIR`` localizes
        # against the same decomposition)
        "options": options.to_dict(),
    }


def build_manifest(
    shared: SharedProgram,
    published: Mapping[str, Published],
    keys: Mapping[str, JobKeys],
    previous: Previous | None,
    name: str,
    fp: ProgramFingerprint,
    options: ExportOptions,
    bundles: Mapping[str, Any] | None = None,
) -> WeightManifest:
    """Every weight of the shared program, with every copy each published file keeps, read back
    from disk; a reused file keeps the previous manifest's copies (same program, same key, and
    its files were re-verified from disk when they were linked in)."""
    program = shared.exported_program
    entries = build_entries(program, shared.weight_digests())
    tensors = holder_tensors(program)
    copies: dict[str, Mapping[str, tuple[WeightLocation, ...]]] = {}
    for target, out in published.items():
        if isinstance(out, Reused):
            assert previous is not None
            copies[target] = {e.name: previous.manifest.entry(e.name).copies[target] for e in entries}
        elif target == "onnx":
            copies[target] = locate_onnx(
                entries, tensors, read_onnx(out.path), out.weight_notes, out.derived_copies
            )
        else:
            copies[target] = locate_pte(
                entries, tensors, read_pte(out.path), out.weight_notes, out.derived_copies
            )
    located = [dataclasses.replace(e, copies={t: copies[t][e.name] for t in published}) for e in entries]
    return WeightManifest(
        entries=tuple(located),
        artifacts={
            t: {
                **_artifact_record(out, keys[t], options),
                **({"bundle": {**bundles[t], "sets": bundles["sets"]}} if bundles and t in bundles else {}),
            }
            for t, out in published.items()
        },
        versions=library_versions(),
        program={
            "graph_sha256": fp.graph,
            "shapes_sha256": fp.shapes,
            "file": f"{name}.pt2",
            # int8: the scheme, and what the quantizer left in float and why (issue: listed)
            **({"quantization": dict(shared.quantization)} if shared.quantization else {}),
        },
    )
