"""Build manifest entries from the shared program and find *every* copy of each one in an
artifact on disk.

The search runs from the file's side as much as from the weight's: every initializer of an
ONNX file and every named blob and constant buffer of a .pte is accounted to the weights whose
bytes it holds (as-is, or after a layout permutation), so a second copy (a tied head's
transposed initializer, a weight kept both in the portable constant buffer and in XNNPACK named
data) is recorded beside the first instead of hiding behind it. Copies that are a function of a
weight but not its bytes (an ONNX constant folded from it, a convolution fused with BatchNorm)
are recorded as ``derived`` with the reason.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch.export import ExportedProgram

from ..shared_state.tensor_bytes import storage_key, tensor_bytes, tensor_sha256
from .manifest import WeightEntry, WeightLocation
from .readers import OnnxTensors, PteTensors

__all__ = [
    "holder_tensors",
    "build_entries",
    "locate_onnx",
    "locate_pte",
    "permuted_sha256",
    "encoded_bytes",
    "encoded_sha256",
    "ENCODINGS",
    "PARITY_CHECK",
]

PARITY_CHECK = "outputs compared with the shared program when the file was proven, and by dx.compare"
Copies = dict[str, tuple[WeightLocation, ...]]


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


def permuted_sha256(tensor: torch.Tensor, perm: tuple[int, ...]) -> str:
    return hashlib.sha256(tensor_bytes(tensor.permute(*perm).contiguous())).hexdigest()


#: How a file may write a quantized weight's values (the holder keeps int4 codes in int8 and
#: group scales as float32 values of bfloat16):
#: ``int4_packed``: ONNX INT4, two's complement nibbles, two per byte, low nibble first;
#: ``uint4_packed_offset8``: XNNPACK's qc4w/qb4w, code + 8 as a nibble, low nibble first
#: (``node_visitor.convert_to_qc4w``); ``bfloat16``: XNNPACK's group scales.
ENCODINGS = ("int4_packed", "uint4_packed_offset8", "bfloat16")


def encoded_bytes(tensor: torch.Tensor, perm: tuple[int, ...] | None, encoding: str | None) -> bytes:
    """The bytes a file stores for ``tensor`` permuted by ``perm`` and written in ``encoding``."""
    t = tensor.detach()
    if encoding is not None and encoding.startswith(REPEATED):  # a per-row [N, 1] scale per block
        t = t.reshape(-1, 1).expand(-1, int(encoding[len(REPEATED) :]))
    if perm:
        t = t.permute(*perm)
    t = t.contiguous()
    if encoding is None or encoding.startswith(REPEATED):
        return bytes(tensor_bytes(t))
    if encoding == "bfloat16":
        return bytes(tensor_bytes(t.to(torch.bfloat16)))
    if encoding in ("int4_packed", "uint4_packed_offset8"):
        # ONNX packs the flattened tensor; XNNPACK packs each row (padding an odd row)
        if t.numel() % 2 or (encoding == "uint4_packed_offset8" and t.dim() and t.shape[-1] % 2):
            raise ValueError(f"{encoding} of an odd number of codes")
        offset = 8 if encoding == "uint4_packed_offset8" else 0
        nib = ((t.to(torch.int16) + offset) & 0xF).to(torch.uint8).reshape(-1)
        return bytes(tensor_bytes((nib[0::2] | (nib[1::2] << 4)).contiguous()))
    raise ValueError(f"unknown encoding {encoding!r}")


#: the encoding of a per-row scale repeated R times (``rows_repeated:R``): an 8-bit weight's
#: per-channel scale as ``MatMulNBits``' per-block scales (exporters/onnx_quant.py)
REPEATED = "rows_repeated:"


def encoded_sha256(tensor: torch.Tensor, perm: tuple[int, ...] | None, encoding: str | None) -> str:
    return hashlib.sha256(encoded_bytes(tensor, perm, encoding)).hexdigest()


def _encodings(tensor: torch.Tensor, target: str) -> list[tuple[tuple[int, ...], str]]:
    """The (permutation, encoding) pairs ``target`` is known to write a quantized weight's
    tensor in: int4 codes (int8 storage, values in [-8, 7], even rows), bfloat16-valued scales.
    A constant tensor (all one value) matches anything of its size and is never tried."""
    if tensor.dim() != 2 or tensor.numel() < 2:
        return []
    lo, hi = tensor.min(), tensor.max()
    if bool(lo == hi):
        return []
    if tensor.dtype == torch.int8 and int(lo) >= -8 and int(hi) <= 7 and tensor.shape[1] % 2 == 0:
        if target == "onnx":  # MatMulNBits' B: the transposed codes (see exporters/onnx_quant.py)
            return [((1, 0), "int4_packed"), ((), "int4_packed")]
        return [((), "uint4_packed_offset8")]
    if (
        target == "xnnpack"
        and tensor.dtype == torch.float32
        and bool((tensor.to(torch.bfloat16).float() == tensor).all())
    ):
        return [((), "bfloat16")]
    return []


#: The layouts the targets are known to store (XNNPACK: NHWC convolutions, its transposed
#: convolutions; ONNX: a MatMul's transposed weight); others are tried only for a weight found
#: nowhere else.
_PREFERRED: dict[int, list[tuple[int, ...]]] = {4: [(0, 2, 3, 1), (1, 2, 3, 0)], 3: [(0, 2, 1)], 2: [(1, 0)]}


def _permutations(ndim: int, *, all_of_them: bool = True) -> list[tuple[int, ...]]:
    if ndim < 2 or ndim > 5:
        return []
    preferred = _PREFERRED.get(ndim, [])
    if not all_of_them:
        return list(preferred)
    rest = [p for p in itertools.permutations(range(ndim)) if p != tuple(range(ndim)) and p not in preferred]
    return preferred + rest


def _not_found(entry: WeightEntry, notes: Mapping[str, str], target: str) -> WeightLocation:
    for n in entry.names:
        if n in notes:
            return WeightLocation(status="not_stored", reason=notes[n], checked=PARITY_CHECK)
    if entry.nbytes == 0:  # XLM's torch.tensor([]) constants: no bytes to carry, none to patch
        return WeightLocation(
            status="not_stored", reason="holds no values (0 elements): nothing to store", checked=PARITY_CHECK
        )
    return WeightLocation(
        status="missing",
        reason=f"used by the {target} program but not found bit for bit in the artifact, and no "
        "known transform (layout, fusion, quantization) explains it",
    )


def _note(entry: WeightEntry, notes: Mapping[str, str]) -> str | None:
    return next((notes[n] for n in entry.names if n in notes), None)


def _transformed(
    where: str, sha: str, perm: tuple[int, ...], reason: str, encoding: str | None = None
) -> WeightLocation:
    how = f"permute{perm}" + (f" and {encoding} encoding" if encoding else "")
    return WeightLocation(
        status="transformed",
        where=where,
        stored_sha256=sha,
        permutation=perm,
        reason=reason,
        checked=f"sha256 of the state_dict tensor after {how} equals the stored bytes",
        encoding=encoding,
    )


# ---------------------------------------------------------------------------------- ONNX
def _onnx_place(store: OnnxTensors, init: str) -> str:
    return f"initializer:{init}@{store.where[init]}"


def _repeats(
    tensor: torch.Tensor, orphan_sha: Mapping[str, list[str]], store: OnnxTensors
) -> list[tuple[tuple[int, ...], str]]:
    """The ``rows_repeated:R`` encodings (transposed, ``[R, N]``) an unclaimed initializer's dims
    allow for a float ``[N, 1]`` tensor (a per-channel scale)."""
    if tensor.dim() != 2 or tensor.shape[1] != 1 or not tensor.is_floating_point():
        return []
    n = int(tensor.shape[0])
    reps = {
        d[0]
        for i in (x for names in orphan_sha.values() for x in names)
        if len(d := store.dims.get(i, ())) == 2 and d[1] == n and d[0] > 1
    }
    return [((1, 0), f"{REPEATED}{r}") for r in sorted(reps)]


def locate_onnx(
    entries: Sequence[WeightEntry],
    tensors: Mapping[str, torch.Tensor],
    store: OnnxTensors,
    notes: Mapping[str, str],
    derived: Mapping[str, Sequence[str]] | None = None,
) -> Copies:
    """Every initializer that holds each entry: by name (exact, or a name carrying other bytes:
    mismatch), by bytes under another name, as a permutation of the weight (the ONNX pipeline
    folds a MatMul's transpose into its weight), or folded from it (``derived``: the pipeline's
    constant folding recorded which weights each new initializer came from)."""
    copies: dict[str, list[WeightLocation]] = {e.name: [] for e in entries}
    claimed: set[str] = set()
    named = {n for e in entries for n in e.names}
    _onnx_as_is(entries, store, copies, claimed)
    _onnx_permuted(entries, tensors, store, named, copies, claimed)
    _onnx_encoded(entries, tensors, store, named, copies, claimed)
    _onnx_derived(entries, store, derived, copies, claimed)
    return {
        e.name: tuple(copies[e.name]) if copies[e.name] else (_not_found(e, notes, "onnx"),) for e in entries
    }


def _onnx_as_is(
    entries: Sequence[WeightEntry],
    store: OnnxTensors,
    copies: dict[str, list[WeightLocation]],
    claimed: set[str],
) -> None:
    """Initializers under each entry's names (exact or mismatch) and with its bytes under another
    name: the copies found without transforming the weight, claimed before any other search."""
    by_sha: dict[tuple[str, int], list[str]] = {}
    for init, sha in store.sha256.items():
        by_sha.setdefault((sha, store.nbytes.get(init, -1)), []).append(init)
    for e in entries:
        for n in e.names:
            if n not in store.sha256:
                continue
            claimed.add(n)
            if store.sha256[n] == e.sha256:
                copies[e.name].append(
                    WeightLocation("exact", _onnx_place(store, n), checked="sha256 of the initializer bytes")
                )
            else:
                copies[e.name].append(
                    WeightLocation(
                        "mismatch",
                        _onnx_place(store, n),
                        stored_sha256=store.sha256[n],
                        reason="an initializer carries this weight's name but not its bytes (a folded "
                        "or rewritten value under the original name)",
                    )
                )
        for init in by_sha.get((e.sha256, e.nbytes), ()):
            if init in e.names:
                continue
            claimed.add(init)
            copies[e.name].append(
                WeightLocation(
                    "exact",
                    _onnx_place(store, init),
                    checked="sha256 of the initializer bytes (stored under another name, or shared "
                    "with an equal weight)",
                )
            )


def _orphans(store: OnnxTensors, named: set[str], claimed: set[str]) -> list[str]:
    """Initializers no weight has claimed yet and that are not stored under a weight's name."""
    return [i for i in store.sha256 if i not in claimed and i not in named]


def _onnx_permuted(
    entries: Sequence[WeightEntry],
    tensors: Mapping[str, torch.Tensor],
    store: OnnxTensors,
    named: set[str],
    copies: dict[str, list[WeightLocation]],
    claimed: set[str],
) -> None:
    """Unclaimed initializers holding a permutation of a weight: the ONNX pipeline folds a
    MatMul's transpose into its weight."""
    orphans = _orphans(store, named, claimed)
    for e, init, sha, perm in _permuted_matches(entries, tensors, orphans, store.dims, store.nbytes, copies):
        if store.sha256[init] == sha:
            claimed.add(init)
            copies[e.name].append(
                _transformed(
                    _onnx_place(store, init),
                    sha,
                    perm,
                    f"the ONNX pipeline folded it into a permute{perm} copy (a MatMul's weight)",
                )
            )


def _onnx_encoded(
    entries: Sequence[WeightEntry],
    tensors: Mapping[str, torch.Tensor],
    store: OnnxTensors,
    named: set[str],
    copies: dict[str, list[WeightLocation]],
    claimed: set[str],
) -> None:
    """Unclaimed initializers holding a weight found nowhere else in a quantized encoding: the
    codes MatMulNBits reads as packed INT4."""
    orphan_sha: dict[str, list[str]] = {}
    for init in _orphans(store, named, claimed):
        orphan_sha.setdefault(store.sha256[init], []).append(init)
    for e in entries:
        tensor = tensors.get(e.name)
        if tensor is None or copies[e.name]:
            continue
        for perm, enc in _encodings(tensor, "onnx") + _repeats(tensor, orphan_sha, store):
            sha = encoded_sha256(tensor, perm, enc)
            for init in orphan_sha.get(sha, ()):
                claimed.add(init)
                copies[e.name].append(
                    _transformed(
                        _onnx_place(store, init),
                        sha,
                        perm,
                        f"quantized codes written as ONNX INT4 (two per byte) after permute{perm}: "
                        "MatMulNBits' weight layout"
                        if not enc.startswith(REPEATED)
                        else f"a per-row scale repeated per block ({enc}) after permute{perm}: "
                        "MatMulNBits' 8-bit scales",
                        enc,
                    )
                )


def _onnx_derived(
    entries: Sequence[WeightEntry],
    store: OnnxTensors,
    derived: Mapping[str, Sequence[str]] | None,
    copies: dict[str, list[WeightLocation]],
    claimed: set[str],
) -> None:
    """Unclaimed initializers the pipeline's constant folding made from weights: recorded as
    derived copies of each source, since their bytes are a function of the weight."""
    by_name = {n: e for e in entries for n in e.names}
    for init, sources in (derived or {}).items():
        if init in claimed or init not in store.sha256:
            continue
        for w in dict.fromkeys(sources):
            owner = by_name.get(w)
            if owner is None:
                continue
            copies[owner.name].append(
                WeightLocation(
                    "derived",
                    _onnx_place(store, init),
                    reason="the ONNX pipeline folded it with other constants into this initializer "
                    f"(from {', '.join(sorted(sources))}): a function of the weight, not its bytes",
                    checked=PARITY_CHECK,
                )
            )


def _permuted_matches(
    entries: Sequence[WeightEntry],
    tensors: Mapping[str, torch.Tensor],
    orphans: Iterable[str],
    dims: Mapping[str, tuple[int, ...]],
    nbytes: Mapping[str, int],
    found: Mapping[str, list[WeightLocation]],
) -> Iterable[tuple[WeightEntry, str, str, tuple[int, ...]]]:
    """(entry, initializer, the entry's sha256 after ``perm``, perm) for every orphan
    initializer whose dims are a permutation of an entry's shape; each permuted digest is
    computed once."""
    by_size: dict[int, list[str]] = {}
    for o in orphans:
        by_size.setdefault(nbytes.get(o, -1), []).append(o)
    for e in entries:
        tensor = tensors.get(e.name)
        if tensor is None or e.nbytes not in by_size or len(e.shape) < 2:
            continue
        shas: dict[tuple[int, ...], str] = {}
        for init in by_size[e.nbytes]:
            d = dims.get(init)
            if d is None or len(d) != len(e.shape) or sorted(d) != sorted(e.shape):
                continue
            for perm in _permutations(len(e.shape), all_of_them=not found[e.name]):
                if tuple(e.shape[p] for p in perm) != d:
                    continue
                if perm not in shas:
                    shas[perm] = permuted_sha256(tensor, perm)
                yield e, init, shas[perm], perm


# ---------------------------------------------------------------------------- ExecuTorch
def locate_pte(
    entries: Sequence[WeightEntry],
    tensors: Mapping[str, torch.Tensor],
    store: PteTensors,
    notes: Mapping[str, str],
    derived: Mapping[str, Sequence[str]] | None = None,
) -> Copies:
    """Every place of a .pte (and its .ptd) that holds each entry: XNNPACK named data keyed by
    its sha256 (as-is or permuted), constant buffers read by a tensor of its size, and, for a
    small tensor found nowhere else, one unique offset inside the delegate payload."""
    copies: dict[str, list[WeightLocation]] = {e.name: [] for e in entries}
    claimed: set[str] = set()
    for e in entries:
        key = store.named_key(e.sha256)
        if key is not None:
            claimed.add(key)
            copies[e.name].append(
                WeightLocation(
                    "exact", f"named_data:{key}", checked="sha256 of the XNNPACK named data (its key)"
                )
            )
        for idx in store.constants_holding(e.sha256, e.nbytes):
            copies[e.name].append(
                WeightLocation(
                    "exact",
                    f"constant_buffer:{idx}",
                    checked="sha256 of the constant buffer bytes (read by a tensor of this size)",
                )
            )
    orphan_sizes = {n for k, n in store.named_sizes.items() if k not in claimed}
    fused = {w for sources in (derived or {}).values() for w in sources}
    for e in entries:
        tensor = tensors.get(e.name)
        if tensor is None or e.nbytes not in orphan_sizes or fused.intersection(e.names):
            continue
        for perm in _permutations(tensor.dim(), all_of_them=not copies[e.name]):
            sha = permuted_sha256(tensor, perm)
            if sha in store.named and sha != e.sha256:
                layout = "NHWC (channels last)" if perm == (0, 2, 3, 1) else f"permute{perm}"
                copies[e.name].append(
                    _transformed(f"named_data:{sha}", sha, perm, f"XNNPACK stores it in {layout} layout")
                )
    for e in entries:
        tensor = tensors.get(e.name)
        if tensor is None or copies[e.name]:
            continue
        for perm, enc in _encodings(tensor, "xnnpack"):
            sha = encoded_sha256(tensor, perm, enc)
            key = store.named_key(sha)
            if key is not None:
                copies[e.name].append(
                    _transformed(
                        f"named_data:{key}",
                        sha,
                        perm,
                        "XNNPACK writes 4-bit codes two per byte (code + 8) and group scales as bfloat16",
                        enc,
                    )
                )
    for e in entries:
        tensor = tensors.get(e.name)
        if not copies[e.name] and tensor is not None:
            found = _in_payload(e, tensor, store)
            if found is not None:
                copies[e.name].append(found)
        if copies[e.name] and fused.intersection(e.names):
            # Stored as-is somewhere and, by the graph, also used in a form the file keeps as a
            # function of it (fused, requantized): that copy cannot be checked or patched.
            reason = _note(e, notes) or "stored as a function of the weight by XNNPACK"
            copies[e.name].append(WeightLocation("derived", reason=reason, checked=PARITY_CHECK))
    return {
        e.name: tuple(copies[e.name]) if copies[e.name] else (_not_found(e, notes, "xnnpack"),)
        for e in entries
    }


def _in_payload(e: WeightEntry, tensor: torch.Tensor, store: PteTensors) -> WeightLocation | None:
    """Small per-channel tensors (quantization scales) live inside the delegate's own payload.
    Bound to one offset only when their bytes occur exactly once in the payloads; a constant
    byte pattern (all zeros) would match anywhere and is never searched."""
    if e.nbytes < 8 or e.nbytes > (1 << 20):
        return None
    blob = bytes(tensor_bytes(tensor))
    if len(set(blob)) <= 1:
        return None
    offsets = store.payload_offsets(blob)
    if len(offsets) != 1:
        return None
    return WeightLocation(
        "exact",
        f"delegate_payload:{offsets[0]}",
        checked="bytes at this offset of the XNNPACK delegate payload (found there once)",
    )
