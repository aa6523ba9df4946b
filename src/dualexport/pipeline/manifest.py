"""The set's weight manifest, built from the files the jobs staged (never from memory)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._versions import library_versions
from ..shared_state import ProgramFingerprint, SharedProgram
from ..weights import WeightManifest
from ..weights.locate import build_entries, holder_tensors, locate_onnx, locate_pte
from ..weights.readers import read_onnx, read_pte
from .job import JobKeys, Previous
from .outcome import Published, Reused

__all__ = ["build_manifest"]


def _artifact_record(out: Published, keys: JobKeys) -> dict[str, Any]:
    return {
        "file": out.path.name,
        "files": [f.name for f in out.files],
        "cache_key": keys.cache,
        "structure_key": keys.structure,
        "ops": list(out.ops),
        "delegation": out.delegation.to_dict() if out.delegation is not None else None,
        "proof": {"ranges": out.proof.ranges, "edges": list(out.proof.edges)},
    }


def build_manifest(
    shared: SharedProgram,
    published: Mapping[str, Published],
    keys: Mapping[str, JobKeys],
    previous: Previous | None,
    name: str,
    fp: ProgramFingerprint,
    bundles: Mapping[str, Any] | None = None,
) -> WeightManifest:
    """Every weight of the shared program, located in each published file read back from disk;
    a reused file keeps the previous manifest's locations (same program, same key, and its
    files were re-verified from disk when they were linked in)."""
    program = shared.exported_program
    entries = build_entries(program, shared.weight_digests())
    tensors = holder_tensors(program)
    stores: dict[str, Any] = {}
    for target, out in published.items():
        if not isinstance(out, Reused):
            stores[target] = read_onnx(out.path) if target == "onnx" else read_pte(out.path)
    located = []
    for e in entries:
        locs = {}
        for target, out in published.items():
            if isinstance(out, Reused):
                assert previous is not None
                locs[target] = previous.manifest.entry(e.name).locations[target]
                continue
            notes = out.weight_notes
            if target == "onnx":
                locs[target] = locate_onnx(e, stores[target], notes, tensors.get(e.name))
            else:
                locs[target] = locate_pte(e, tensors.get(e.name), stores[target], notes)
        located.append(type(e)(**{**e.__dict__, "locations": locs}))
    return WeightManifest(
        entries=tuple(located),
        artifacts={
            t: {
                **_artifact_record(out, keys[t]),
                **({"bundle": {**bundles[t], "sets": bundles["sets"]}} if bundles and t in bundles else {}),
            }
            for t, out in published.items()
        },
        versions=library_versions(),
        program={"graph_sha256": fp.graph, "shapes_sha256": fp.shapes, "file": f"{name}.pt2"},
    )
