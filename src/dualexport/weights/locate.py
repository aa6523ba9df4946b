"""Build manifest entries from the shared program and find each one in an artifact on disk."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping

import torch
from torch.export import ExportedProgram

from ..shared_state.tensor_bytes import storage_key, tensor_bytes, tensor_sha256
from .manifest import WeightEntry, WeightLocation
from .readers import OnnxTensors, PteTensors

__all__ = ["holder_tensors", "build_entries", "locate_onnx", "locate_pte", "permuted_sha256"]

PARITY_CHECK = "outputs compared with eager by dx.compare"


def holder_tensors(program: ExportedProgram) -> dict[str, torch.Tensor]:
    """Every tensor the shared program owns, by name: state_dict, then constants."""
    out: dict[str, torch.Tensor] = {}
    for source in (program.state_dict, program.constants):
        for name, value in source.items():
            if isinstance(value, torch.Tensor) and name not in out:
                out[name] = value
    return out


def _kind(program: ExportedProgram, name: str) -> str:
    sig = program.graph_signature
    if name in sig.parameters:
        return "parameter"
    if name in sig.buffers:
        return "buffer" if name in program.state_dict else "buffer (non-persistent)"
    return "constant"


def build_entries(program: ExportedProgram, digests: Mapping[str, str] | None = None) -> list[WeightEntry]:
    """One entry per distinct tensor; tied names become aliases of the first name."""
    groups: dict[tuple, list[str]] = {}
    tensors = holder_tensors(program)
    for name, t in tensors.items():
        groups.setdefault(storage_key(t), []).append(name)
    entries = []
    for names in groups.values():
        t = tensors[names[0]]
        sha = (digests or {}).get(names[0]) or tensor_sha256(t)
        entries.append(
            WeightEntry(
                name=names[0],
                kind=_kind(program, names[0]),
                dtype=str(t.dtype).replace("torch.", ""),
                shape=tuple(t.shape),
                nbytes=t.numel() * t.element_size(),
                sha256=sha,
                aliases=tuple(names[1:]),
            )
        )
    return entries


def _not_found(entry: WeightEntry, notes: Mapping[str, str], target: str) -> WeightLocation:
    for n in entry.names:
        if n in notes:
            return WeightLocation(status="not_stored", reason=notes[n], checked=PARITY_CHECK)
    return WeightLocation(
        status="missing",
        reason=f"used by the {target} program but not found bit for bit in the artifact, and no "
        "known transform (layout, fusion, quantization) explains it",
    )


def locate_onnx(
    entry: WeightEntry, store: OnnxTensors, notes: Mapping[str, str], tensor: torch.Tensor | None = None
) -> WeightLocation:
    for n in entry.names:
        if n in store.sha256:
            if store.sha256[n] == entry.sha256:
                return WeightLocation(
                    status="exact",
                    where=f"initializer:{n}@{store.where[n]}",
                    checked="sha256 of the initializer bytes",
                )
            return WeightLocation(
                status="mismatch",
                where=f"initializer:{n}@{store.where[n]}",
                stored_sha256=store.sha256[n],
                reason="an initializer carries this weight's name but not its bytes (a folded or "
                "rewritten value under the original name)",
            )
    for init_name, sha in store.sha256.items():
        if sha == entry.sha256 and store.nbytes.get(init_name) == entry.nbytes:
            return WeightLocation(
                status="exact",
                where=f"initializer:{init_name}@{store.where[init_name]}",
                checked="sha256 of the initializer bytes (stored under another name)",
            )
    if tensor is not None and any(n in notes for n in entry.names):
        # Folded by the ONNX pipeline: a MatMul's weight becomes its transposed copy.
        by_sha = {sha: name for name, sha in store.sha256.items() if store.nbytes.get(name) == entry.nbytes}
        for perm in _permutations(tensor.dim()):
            sha = permuted_sha256(tensor, perm)
            if sha in by_sha:
                init = by_sha[sha]
                return WeightLocation(
                    status="transformed",
                    where=f"initializer:{init}@{store.where[init]}",
                    stored_sha256=sha,
                    permutation=perm,
                    reason=f"the ONNX pipeline folded it into a permute{perm} copy (a MatMul's weight)",
                    checked=f"sha256 of the state_dict tensor after permute{perm} equals the stored bytes",
                )
    return _not_found(entry, notes, "onnx")


def permuted_sha256(tensor: torch.Tensor, perm: tuple[int, ...]) -> str:
    return hashlib.sha256(tensor_bytes(tensor.permute(*perm).contiguous())).hexdigest()


def _permutations(ndim: int) -> list[tuple[int, ...]]:
    if ndim < 2 or ndim > 5:
        return []
    known: dict[int, list[tuple[int, ...]]] = {4: [(0, 2, 3, 1), (1, 2, 3, 0)], 3: [(0, 2, 1)], 2: [(1, 0)]}
    preferred = known.get(ndim, [])
    rest = [p for p in itertools.permutations(range(ndim)) if p != tuple(range(ndim)) and p not in preferred]
    return preferred + rest


def locate_pte(
    entry: WeightEntry, tensor: torch.Tensor | None, store: PteTensors, notes: Mapping[str, str]
) -> WeightLocation:
    if entry.sha256 in store.named:
        return WeightLocation(
            status="exact",
            where=f"named_data:{entry.sha256}",
            checked="sha256 of the XNNPACK named data (its key)",
        )
    idx = store.find_constant(entry.sha256, entry.nbytes)
    if idx is not None:
        return WeightLocation(
            status="exact", where=f"constant_buffer:{idx}", checked="sha256 of the constant buffer bytes"
        )
    blob = bytes(tensor_bytes(tensor)) if tensor is not None and entry.nbytes >= 8 else b""
    if blob and len(set(blob)) > 1 and store.raw:
        # Small per-channel tensors (quantization scales) live inside the delegate's own payload.
        # Constant byte patterns (all zeros) would match anywhere, so they are never searched.
        offset = store.raw.find(blob)
        if offset >= 0:
            return WeightLocation(
                status="exact",
                where=f"delegate_payload:{offset}",
                checked="bytes found verbatim in the XNNPACK delegate payload",
            )
    if tensor is not None and store.named:
        for perm in _permutations(tensor.dim()):
            sha = permuted_sha256(tensor, perm)
            if sha in store.named:
                layout = "NHWC (channels last)" if perm == (0, 2, 3, 1) else f"permute{perm}"
                return WeightLocation(
                    status="transformed",
                    where=f"named_data:{sha}",
                    stored_sha256=sha,
                    permutation=perm,
                    reason=f"XNNPACK stores it in {layout} layout",
                    checked=f"sha256 of the state_dict tensor after permute{perm} equals the stored bytes",
                )
    return _not_found(entry, notes, "xnnpack")
