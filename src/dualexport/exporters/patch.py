"""Weights-only re-export: patch the previous set's files instead of lowering again.

Why: when only weight values changed (same graph, shapes, options and library versions: the
target's structure key matches), lowering again recomputes everything to move a few tensors'
bytes. The previous manifest lists *every* place each file stores each weight: ONNX initializers
(external data offset, or inline in the proto; as-is or transposed), a .pte's XNNPACK named data
(keyed by the sha256 of its bytes, the key repeated in the delegate payload; as-is or in NHWC) and
its constant buffers. Patching writes the new bytes at every one of those places (and renames a
named-data key), or at none: when any copy of a changed weight cannot be rewritten in place (a
value folded or fused from it, a copy shared with another weight), :func:`plan_patch` says why
and the caller lowers again. The patched files are copies (never the previous set's hard-linked
files), and the caller proves them like any lowering: the manifest re-read from disk, and the
file's outputs against the shared program's.
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
from ..weights.locate import encoded_bytes
from ..weights.manifest import WeightEntry, WeightLocation

__all__ = ["Change", "PatchPlan", "plan_patch", "patch_files"]

logger = logging.getLogger(__name__)


#: The kinds of place each target's patcher rewrites.
_PATCHABLE = {"onnx": ("initializer",), "xnnpack": ("named_data", "constant_buffer")}


@dataclass(frozen=True)
class Change:
    """One stored copy to rewrite: where the previous file holds it, its old digest, the new bytes."""

    name: str
    where: str
    old_sha256: str
    new_sha256: str
    data: bytes


@dataclass(frozen=True)
class PatchPlan:
    """Every rewrite that turns the previous file into this program's (``changes``: each stored
    copy of each changed weight), or why no patch can (``refusal``: then nothing is rewritten)."""

    changes: tuple[Change, ...] = ()
    weights: int = 0
    refusal: str | None = None


def _refuse(why: str) -> PatchPlan:
    return PatchPlan(refusal=why)


def plan_patch(
    target: str,
    entries: Sequence[WeightEntry],
    digests: Mapping[str, str],
    tensors: Mapping[str, torch.Tensor],
) -> PatchPlan:
    """The rewrites of every copy of every changed weight, or a refusal naming the first copy
    that cannot be rewritten in place. ``entries`` are the previous manifest's; ``digests`` and
    ``tensors`` the holder's, by name."""
    if target not in _PATCHABLE:
        return _refuse(f"no weights-only patcher for {target}")
    names = {n for e in entries for n in e.names}
    if names != set(digests) or any(e.name not in tensors for e in entries):
        return _refuse("the program's weights are not the previous set's")
    for e in entries:
        if len({digests[n] for n in e.names}) != 1:
            return _refuse(f"weight {e.name!r} is no longer one tensor with {', '.join(e.aliases)}")
    changed = [e for e in entries if digests[e.name] != e.sha256]
    places = Counter(c.where for e in entries for c in e.copies.get(target, ()) if c.where)
    # XNNPACK keys its named data by content and ExecuTorch and the ONNX pipeline deduplicate
    # equal constants: a value held by two entries is stored once, which rewriting one place
    # cannot reproduce.
    now = Counter(digests[e.name] for e in entries)
    changes: list[Change] = []
    for e in changed:
        if e.sha256 in now or now[digests[e.name]] != 1:
            return _refuse(f"weight {e.name!r}: its old or new value equals another weight's (stored once)")
        copies = e.copies.get(target) or ()
        if not copies:
            return _refuse(f"weight {e.name!r} has no record in the previous {target} manifest")
        for c in copies:
            if c.status not in ("exact", "transformed") or c.kind not in _PATCHABLE[target]:
                place = f" at {c.where}" if c.where else ""
                return _refuse(
                    f"weight {e.name!r} is kept {c.status}{place} in the {target} file "
                    f"({c.reason or c.checked}): that copy cannot be rewritten in place"
                )
            if places[c.where or ""] != 1:
                return _refuse(f"weight {e.name!r}: its copy {c.where} also serves another weight")
            changes.append(_change(e, c, tensors[e.name], digests[e.name]))
    return PatchPlan(tuple(changes), len(changed))


def _change(e: WeightEntry, c: WeightLocation, tensor: torch.Tensor, digest: str) -> Change:
    assert c.where is not None
    if c.status == "transformed":
        # Stored as a permutation of the weight (a MatMul's transposed weight in ONNX, NHWC in
        # XNNPACK), perhaps encoded (packed int4 codes, bfloat16 scales): the new value, permuted
        # and encoded the same way, replaces the stored bytes.
        assert c.permutation is not None and c.stored_sha256 is not None
        data = encoded_bytes(tensor, c.permutation, c.encoding)
        return Change(e.name, c.where, c.stored_sha256, hashlib.sha256(data).hexdigest(), data)
    return Change(e.name, c.where, e.sha256, digest, bytes(tensor_bytes(tensor)))


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


def _rename(data: mmap.mmap, old: bytes, new: bytes) -> int:
    """Replace every occurrence of ``old`` by ``new`` (same length) in place; how many."""
    pos, renamed = data.find(old), 0
    while pos != -1:
        data[pos : pos + len(old)] = new
        renamed += 1
        pos = data.find(old, pos + len(old))
    return renamed


def _patch_pte(path: pathlib.Path, changes: list[Change]) -> None:
    """Write the new bytes at every place a changed weight sits: named data (in the .pte's own
    segments, or its data file ``<stem>.ptd``), whose key (the sha256 of the bytes) is then
    renamed everywhere it occurs (the program, the XNNPACK payload, the data file's index; same
    length), and constant buffers of the portable program (no key)."""
    from ..weights.readers import pte_extents, read_ptd

    ptd = path.with_suffix(".ptd")
    named, constants = pte_extents(path)
    places = {f"named_data:{key}": (path, at) for key, at in named.items()}
    places.update({f"constant_buffer:{i}": (path, at) for i, at in constants.items()})
    if ptd.is_file():
        index, mapped = read_ptd(ptd)
        mapped.close()
        places.update({f"named_data:{key}": (ptd, at) for key, at in index.items()})
    files = [path, *([ptd] if ptd.is_file() else [])]
    handles = [open(f, "r+b") for f in files]
    try:
        maps = {f: mmap.mmap(h.fileno(), 0) for f, h in zip(files, handles, strict=True)}
        # Buffers first (their content is checked before any key is renamed), then the keys.
        for c in changes:
            where, (start, size) = places.get(c.where, (path, (-1, 0)))
            data = maps[where]
            if not 0 <= start <= len(data) - size or size < len(c.data):
                raise ValueError(f"{where.name} has no {c.where[:40]} inside the file")
            if hashlib.sha256(data[start : start + len(c.data)]).hexdigest() != c.old_sha256:
                raise ValueError(f"{c.where[:40]} of {where.name} is not {c.name}'s old value")
            data[start : start + len(c.data)] = c.data
        for c in changes:
            if c.where.startswith("named_data:"):
                renamed = sum(_rename(m, c.old_sha256.encode(), c.new_sha256.encode()) for m in maps.values())
                if renamed == 0:
                    raise ValueError(f"named data key {c.old_sha256[:12]}... not found in {path.name}")
        for m in maps.values():
            m.flush()
            m.close()
    finally:
        for h in handles:
            h.close()
