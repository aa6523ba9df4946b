"""Weights-only re-export: patch the previous set's files instead of lowering again.

Why: when only weight values changed (same graph, shapes, options and library versions: the
target's structure key matches), lowering again recomputes everything to move a few tensors'
bytes. A weight the previous manifest proved stored *exactly* (the same bytes, by sha256) sits at
a known place: an ONNX initializer (external data offset, or inline in the proto) or an XNNPACK
named-data segment of the .pte, whose key is the sha256 of its bytes and is repeated in the
delegate payload. Patching writes the new bytes there and renames the key. Anything else changed
(a folded, quantized or shared value; a permuted one other than the recorded transposition of
an ONNX MatMul weight) makes :func:`plan_patch` return ``None`` and the
caller lowers normally. The patched files are copies (never the previous set's hard-linked
files), and the caller proves them like any lowering: manifest re-read from disk, smoke run.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import pathlib
import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ..shared_state.tensor_bytes import tensor_bytes
from ..weights.manifest import WeightEntry

__all__ = ["Change", "plan_patch", "patch_files"]

logger = logging.getLogger(__name__)


#: Where a weight must sit for a target's patcher to rewrite it.
_PATCHABLE = {"onnx": "initializer:", "xnnpack": "named_data:"}


@dataclass(frozen=True)
class Change:
    """One weight to rewrite: where the previous file holds it, its old digest, the new bytes."""

    name: str
    where: str
    old_sha256: str
    new_sha256: str
    data: bytes


def _rewritable(target: str, e: WeightEntry) -> bool:
    """Stored exactly, or (ONNX) stored as a recorded permutation of the weight."""
    loc = e.locations[target]
    if loc.status == "exact":
        return True
    return (
        target == "onnx"
        and loc.status == "transformed"
        and loc.permutation is not None
        and loc.stored_sha256 is not None
    )


def plan_patch(
    target: str,
    entries: Sequence[WeightEntry],
    digests: Mapping[str, str],
    tensors: Mapping[str, torch.Tensor],
) -> list[Change] | None:
    """The rewrites that turn the previous ``target`` file into this program's, or ``None``.

    ``entries`` are the previous manifest's; ``digests``/``tensors`` the holder's, by name.
    """
    if target not in _PATCHABLE:
        return None
    changes: list[Change] = []
    where_count = Counter(
        e.locations[target].where for e in entries if target in e.locations and _rewritable(target, e)
    )
    # XNNPACK keys its named data by content: a value held by two entries is stored once.
    now = Counter(digests[e.name] for e in entries if e.name in digests)
    for e in entries:
        if e.name not in digests or e.name not in tensors:
            return None  # the program's weights are not the previous set's
        if digests[e.name] == e.sha256:
            continue
        loc = e.locations.get(target)
        if loc is None or not _rewritable(target, e) or not loc.where or where_count[loc.where] != 1:
            return None  # not stored as-is (or as a known permutation), or one copy serves several
        if not loc.where.startswith(_PATCHABLE[target]):
            return None  # e.g. a .pte constant buffer outside the delegate: no patcher
        if e.sha256 in now or now[digests[e.name]] != 1:
            # The old or the new bytes are also another weight's: XNNPACK keys named data by
            # content and the ONNX pipeline deduplicates equal initializers, so a fresh lowering
            # stores them once, which rewriting one place cannot reproduce.
            return None
        tensor = tensors[e.name]
        if loc.status == "transformed":
            # A MatMul's weight the ONNX pipeline stored transposed: the new value, permuted the
            # same way, replaces the stored bytes (which the manifest proved are the permutation).
            assert loc.permutation is not None and loc.stored_sha256 is not None
            data = bytes(tensor_bytes(tensor.detach().permute(*loc.permutation).contiguous()))
            changes.append(
                Change(e.name, loc.where, loc.stored_sha256, hashlib.sha256(data).hexdigest(), data)
            )
            continue
        changes.append(Change(e.name, loc.where, e.sha256, digests[e.name], bytes(tensor_bytes(tensor))))
    return changes


def patch_files(
    target: str, previous: pathlib.Path, staging: pathlib.Path, files: list[str], changes: list[Change]
) -> list[pathlib.Path]:
    """Copy the previous files into ``staging`` and apply ``changes``; raises ValueError when a
    file does not hold an old value where the manifest said (the caller then lowers)."""
    out = []
    for fname in files:
        if pathlib.PurePath(fname).name != fname:
            raise ValueError(f"unsafe file name {fname!r}")
        dst = staging / fname
        shutil.copyfile(previous / fname, dst)  # a copy: the previous set's files stay intact
        out.append(dst)
    if target == "onnx":
        _patch_onnx(staging, files[0], changes)
    elif target == "xnnpack":
        _patch_pte(staging / files[0], changes)
    else:
        raise ValueError(f"no patcher for {target}")
    return out


def _patch_onnx(staging: pathlib.Path, main: str, changes: list[Change]) -> None:
    inline = []
    for c in changes:
        # initializer:<name>@<file>@<offset> (external data) or initializer:<name>@<file> (inline)
        ref = c.where.removeprefix("initializer:")
        parts = ref.rsplit("@", 2)
        if len(parts) == 3 and parts[2].isdigit():
            fname, offset = parts[1], int(parts[2])
            path = staging / pathlib.PurePath(fname).name
            with open(path, "r+b") as f:
                f.seek(offset)
                if hashlib.sha256(f.read(len(c.data))).hexdigest() != c.old_sha256:
                    raise ValueError(f"{fname} does not hold {c.name} at offset {offset}")
                f.seek(offset)
                f.write(c.data)
        else:
            inline.append((ref.rsplit("@", 1)[0], c))
    if inline:
        import onnx

        path = staging / main
        model = onnx.load(str(path), load_external_data=False)
        by_name = {i.name: i for i in model.graph.initializer}
        for init_name, c in inline:
            init = by_name.get(init_name)
            if init is None or hashlib.sha256(init.raw_data).hexdigest() != c.old_sha256:
                raise ValueError(f"{main} has no inline initializer {init_name!r} with the old bytes")
            init.raw_data = c.data
        onnx.save(model, str(path))


def _named_offsets(path: pathlib.Path) -> dict[str, tuple[int, int]]:
    """File offset and size of every named-data buffer of a .pte, from ExecuTorch's own reader
    (it slices a memoryview of the mapped file, so a slice's address gives its offset)."""
    import numpy as np
    from executorch.exir._serialize._program import deserialize_pte_binary

    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    pte = deserialize_pte_binary(memoryview(data))
    base = np.frombuffer(data, dtype=np.uint8).__array_interface__["data"][0]
    offsets: dict[str, tuple[int, int]] = {}
    nd = pte.named_data
    if nd is not None:
        for key, entry in nd.pte_data.items():
            buf = np.frombuffer(nd.buffers[entry.buffer_index], dtype=np.uint8)
            offsets[key] = (buf.__array_interface__["data"][0] - base, buf.nbytes)
    return offsets  # the read-only mapping goes with its last view


def _rename(data: mmap.mmap, old: bytes, new: bytes) -> int:
    """Replace every occurrence of ``old`` by ``new`` (same length) in place; how many."""
    pos, renamed = data.find(old), 0
    while pos != -1:
        data[pos : pos + len(old)] = new
        renamed += 1
        pos = data.find(old, pos + len(old))
    return renamed


def _patch_pte(path: pathlib.Path, changes: list[Change]) -> None:
    """Write the new bytes where the named data sits (the .pte's own segments, or its data file
    ``<stem>.ptd``), then rename the key (the sha256 of the bytes) everywhere it occurs: in the
    program, in the XNNPACK payload and in the data file's index (same length)."""
    from ..weights.readers import read_ptd

    ptd = path.with_suffix(".ptd")
    places = {key: (path, at) for key, at in _named_offsets(path).items()}
    if ptd.is_file():
        index, mapped = read_ptd(ptd)
        mapped.close()
        places.update({key: (ptd, at) for key, at in index.items()})
    files = [path, *([ptd] if ptd.is_file() else [])]
    handles = [open(f, "r+b") for f in files]
    try:
        maps = {f: mmap.mmap(h.fileno(), 0) for f, h in zip(files, handles, strict=True)}
        for c in changes:
            key = c.where.removeprefix("named_data:")
            where, (start, size) = places.get(key, (path, (-1, 0)))
            data = maps[where]
            if not 0 <= start <= len(data) - size:
                raise ValueError(f"{where.name} has no named data {key[:12]}... inside the file")
            if size != len(c.data) or hashlib.sha256(data[start : start + size]).hexdigest() != c.old_sha256:
                raise ValueError(f"named data {key[:12]}... of {where.name} is not {c.name}'s old value")
            data[start : start + size] = c.data
            renamed = sum(_rename(m, c.old_sha256.encode(), c.new_sha256.encode()) for m in maps.values())
            if renamed == 0:
                raise ValueError(f"named data key {key[:12]}... not found in {path.name}")
        for m in maps.values():
            m.flush()
            m.close()
    finally:
        for h in handles:
            h.close()
