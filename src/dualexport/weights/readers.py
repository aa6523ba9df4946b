"""Read the weights an artifact carries, from the file on disk.

Why from disk: the manifest and ``verify_weights`` must prove what a deployment will load, not
what the exporter held in memory. ONNX initializers are read by name (inline or external data,
whose locations must stay inside the artifact's folder); a ``.pte`` is read with ExecuTorch's own
deserializer: XNNPACK's named data is keyed by the sha256 of the bytes it stored, and
non-delegated constants sit in the program's constant buffer.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any

from ..compat.executorch import deserialize_flat_tensor, deserialize_pte
from ..errors import ArtifactFormatError, ArtifactIOError
from ..outputs.paths import safe_child

#: XNNPACK keys the per-channel scales of int8 weights ``scale_<sha256>`` (node_visitor.py)
SCALE_KEY_PREFIX = "scale_"

__all__ = [
    "OnnxTensors",
    "PteTensors",
    "read_onnx",
    "read_pte",
    "read_ptd",
    "check_pte_header",
    "file_extent",
    "SCALE_KEY_PREFIX",
]


@dataclass(frozen=True)
class OnnxTensors:
    """sha256, size, dims and place of each initializer, by name."""

    sha256: dict[str, str]
    nbytes: dict[str, int]
    where: dict[str, str]
    dims: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass
class PteTensors:
    """Named data (key -> sha256 of the stored bytes) and constant buffers of a .pte.

    Only digests of the named blobs are kept (they hold most of the weights), so reading a
    large artifact back costs about one copy of the file, not three.
    """

    named: dict[str, str]
    constant_buffers: list[memoryview]
    raw: Any = b""  # the mapped file (mmap: find/slice like bytes)
    #: constant buffer index -> the byte sizes of the program's tensors that read it (a buffer is
    #: padded to the tensor alignment, so its length alone does not bind it to a weight)
    buffer_tensors: dict[int, frozenset[int]] = field(default_factory=dict)
    #: (offset, size) in the file of each delegate's payload (the XNNPACK flatbuffer)
    payloads: tuple[tuple[int, int], ...] = ()
    #: named data key -> its size in bytes (in the .pte or its .ptd)
    named_sizes: dict[str, int] = field(default_factory=dict)
    #: named data kept in the program's data file (``<stem>.ptd``): key -> (offset, nbytes) there
    external: dict[str, tuple[int, int]] = field(default_factory=dict)
    data_file: str | None = None
    _prefix_cache: dict[tuple[int, int], str] = field(default_factory=dict, repr=False)

    def named_ok(self, key: str) -> bool:
        """The named blob exists and its bytes still hash to its key (XNNPACK's keying rule:
        the sha256, or ``scale_<sha256>`` for per-channel quantization scales)."""
        return self.named.get(key) == key.removeprefix(SCALE_KEY_PREFIX)

    def named_key(self, sha: str) -> str | None:
        """The named data key under which XNNPACK stores bytes of digest ``sha``, if any."""
        for key in (sha, SCALE_KEY_PREFIX + sha):
            if key in self.named:
                return key
        return None

    def constant_sha(self, index: int, nbytes: int) -> str | None:
        """sha256 of the first ``nbytes`` of constant buffer ``index`` (buffers are padded)."""
        if index >= len(self.constant_buffers) or len(self.constant_buffers[index]) < nbytes:
            return None
        key = (index, nbytes)
        if key not in self._prefix_cache:
            self._prefix_cache[key] = hashlib.sha256(self.constant_buffers[index][:nbytes]).hexdigest()
        return self._prefix_cache[key]

    def bound(self, index: int, nbytes: int) -> bool:
        """Buffer ``index`` is read by a tensor of exactly ``nbytes`` (mutable state buffers,
        appended after the constants, carry no tensor record and are bound by size)."""
        sizes = self.buffer_tensors.get(index)
        if sizes is None:
            return index < len(self.constant_buffers) and len(self.constant_buffers[index]) == nbytes
        return nbytes in sizes

    def constants_holding(self, sha: str, nbytes: int) -> list[int]:
        """Every constant buffer bound to a tensor of ``nbytes`` whose bytes hash to ``sha``."""
        return [
            i
            for i in range(len(self.constant_buffers))
            if nbytes and self.bound(i, nbytes) and self.constant_sha(i, nbytes) == sha
        ]

    def payload_offsets(self, blob: bytes) -> list[int]:
        """File offsets of ``blob`` inside the delegate payloads (never elsewhere in the file)."""
        out = []
        for start, size in self.payloads:
            region = bytes(memoryview(self.raw)[start : start + size])  # a delegate's flatbuffer: small
            pos = region.find(blob)
            while pos != -1:
                out.append(start + pos)
                pos = region.find(blob, pos + 1)
        return out


def read_onnx(path: pathlib.Path) -> OnnxTensors:
    import onnx
    from onnx import numpy_helper

    path = pathlib.Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
        if not model.HasField("graph"):
            raise ValueError("no graph in the file")
    except Exception as exc:
        raise ArtifactFormatError(
            f"{path.name} is not a readable ONNX model: {exc}",
            hint="re-export; the file may be truncated or not an ONNX file",
        ) from exc
    sha: dict[str, str] = {}
    nbytes: dict[str, int] = {}
    where: dict[str, str] = {}
    dims: dict[str, tuple[int, ...]] = {}
    handles: dict[pathlib.Path, object] = {}
    try:
        for init in model.graph.initializer:
            dims[init.name] = tuple(int(d) for d in init.dims)
            if init.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in init.external_data}
                loc = safe_child(
                    path.parent, info.get("location", ""), what=f"external data of initializer {init.name!r}"
                )
                offset, length = _extent(info, init.name, path)
                if loc not in handles:
                    if loc.exists() and not loc.is_file():
                        raise ArtifactFormatError(
                            f"external data {loc.name!r} of {path.name} is not a regular file",
                            hint="keep the real .onnx.data file next to the .onnx file",
                        )
                    try:
                        handles[loc] = open(loc, "rb")
                    except OSError as exc:
                        raise ArtifactIOError(
                            f"external data file {loc.name!r} of {path.name} cannot be read: {exc.strerror}",
                            hint="keep the .onnx.data file next to the .onnx file",
                        ) from exc
                f = handles[loc]
                f.seek(offset)  # type: ignore[attr-defined]
                h = hashlib.sha256()
                remaining = length
                while remaining != 0:
                    chunk = f.read(min(1 << 24, remaining) if remaining > 0 else 1 << 24)  # type: ignore[attr-defined]
                    if not chunk:
                        break
                    h.update(chunk)
                    remaining -= len(chunk)
                if remaining > 0:
                    raise ArtifactFormatError(
                        f"external data for {init.name!r} is truncated in {loc.name}",
                        hint="re-export; the data file is incomplete",
                    )
                sha[init.name] = h.hexdigest()
                nbytes[init.name] = length if length >= 0 else 0
                where[init.name] = f"{loc.name}@{offset}"
            else:
                data = init.raw_data if init.HasField("raw_data") else numpy_helper.to_array(init).tobytes()
                sha[init.name] = hashlib.sha256(data).hexdigest()
                nbytes[init.name] = len(data)
                where[init.name] = path.name
    finally:
        for f in handles.values():
            f.close()  # type: ignore[attr-defined]
    return OnnxTensors(sha, nbytes, where, dims)


def _extent(info: dict[str, str], name: str, path: pathlib.Path) -> tuple[int, int]:
    """(offset, length) of an external tensor; garbage or negative values are a foreign file."""
    try:
        offset, length = int(info.get("offset", 0)), int(info.get("length", -1))
    except ValueError:
        offset = length = -2
    if offset < 0 or length < -1:
        raise ArtifactFormatError(
            f"external data of {name!r} in {path.name} has a bad offset/length "
            f"({info.get('offset')!r}, {info.get('length')!r})",
            hint="re-export; the file was not written by an ONNX exporter",
        )
    return offset, length


def check_pte_header(path: pathlib.Path, data: bytes | mmap.mmap) -> None:
    """A .pte is a flatbuffer whose file identifier (bytes 4..8) is 'ET' + two version digits;
    anything else is refused before the deserializer (or the C++ runtime) parses it."""
    ident = data[4:8]
    if len(data) < 8 or ident[:2] != b"ET" or not ident[2:].isdigit():
        raise ArtifactFormatError(
            f"{path.name} is not an ExecuTorch program (file identifier {ident!r}, expected b'ETnn')",
            hint="re-export; the file is truncated or is not a .pte file",
        )


def sha256_mapped(data: mmap.mmap, offset: int, nbytes: int) -> str:
    """sha256 of ``nbytes`` at ``offset`` of a read-only mapping, without a copy, and without
    keeping the pages: slicing an mmap copies the bytes, and pages read through a mapping stay
    in this process's resident set until unmapped (a 768 MB .ptd hashed whole added 1.3x the
    weights to the exporter's peak); ``MADV_DONTNEED`` drops them (they stay in the page cache)."""
    view = memoryview(data)
    h = hashlib.sha256()
    step = 64 << 20
    for start in range(offset, offset + nbytes, step):
        end = min(start + step, offset + nbytes)
        h.update(view[start:end])
        lo = start - start % mmap.PAGESIZE
        with contextlib.suppress(OSError, ValueError, AttributeError):
            data.madvise(mmap.MADV_DONTNEED, lo, end - lo)
    view.release()
    return h.hexdigest()


def read_ptd(path: pathlib.Path) -> tuple[dict[str, tuple[int, int]], Any]:
    """The named data of an ExecuTorch data file (``.ptd``, FlatTensor): key -> (offset, nbytes)
    in the file, and the file mapped read-only. XNNPACK's keys are the sha256 of the bytes."""
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorHeader

    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        header = FlatTensorHeader.from_bytes(bytes(data[8 : 8 + 64]))
        if not header.is_valid():
            raise ValueError("no FlatTensor header")
        flat = deserialize_flat_tensor(bytes(data[: header.flatbuffer_offset + header.flatbuffer_size]))
        index = {
            nd.key: (
                header.segment_base_offset + flat.segments[nd.segment_index].offset,
                flat.segments[nd.segment_index].size,
            )
            for nd in flat.named_data
        }
    except (OSError, ValueError, IndexError) as exc:
        raise ArtifactFormatError(
            f"{path.name} is not a readable ExecuTorch data file: {exc}",
            hint="re-export; the file is truncated or not a .ptd",
        ) from exc
    if any(off + n > len(data) for off, n in index.values()):
        raise ArtifactFormatError(
            f"{path.name} is shorter than its index says", hint="re-export; the file was truncated"
        )
    return index, data


def read_pte(path: pathlib.Path) -> PteTensors:
    import mmap

    path = pathlib.Path(path)
    try:
        # Mapped, not read: ExecuTorch's deserializer slices a memoryview without copying, so
        # reading a large .pte back costs page cache, not another copy of the weights.
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as exc:
        raise ArtifactIOError(
            f"cannot read {path.name}: {exc.strerror}", hint="re-export into the folder"
        ) from exc
    check_pte_header(path, data)
    try:
        pte = deserialize_pte(memoryview(data))
    except Exception as exc:
        raise ArtifactFormatError(
            f"{path.name} is not a readable ExecuTorch program: {exc}",
            hint="re-export; the file may be truncated or not a .pte file",
        ) from exc
    named: dict[str, str] = {}
    sizes: dict[str, int] = {}
    nd = pte.named_data
    if nd is not None:
        for key, entry in nd.pte_data.items():
            named[key] = hashlib.sha256(nd.buffers[entry.buffer_index]).hexdigest()
            sizes[key] = len(nd.buffers[entry.buffer_index])
        if isinstance(data, mmap.mmap):  # the hashed pages leave the resident set (see sha256_mapped)
            with contextlib.suppress(OSError, ValueError):
                data.madvise(mmap.MADV_DONTNEED)
    constants = [memoryview(b.storage) for b in pte.program.constant_buffer]
    buffer_tensors = _buffer_tensors(pte.program)
    # Mutable buffers (state) are stored with their initial values in the mutable segment.
    constants += [memoryview(b.storage) for b in (pte.mutable_data or [])]
    payloads = tuple(file_extent(data, d.data) for d in pte.program.backend_delegate_data)
    del pte, nd
    external: dict[str, tuple[int, int]] = {}
    data_file = None
    ptd = path.with_suffix(".ptd")
    if ptd.exists() or ptd.is_symlink():  # refused like ONNX external data: a symlink out, a non-file
        safe_child(path.parent, ptd.name, what="the program's data file")
        if not ptd.is_file():
            raise ArtifactFormatError(
                f"{ptd.name} beside {path.name} is not a regular file",
                hint="keep the real .ptd file next to the .pte file",
            )
        external, ptd_data = read_ptd(ptd)
        for key, (off, n) in external.items():
            named[key] = sha256_mapped(ptd_data, off, n)
            sizes[key] = n
        data_file = ptd.name
    return PteTensors(
        named=named,
        constant_buffers=constants,
        raw=data,
        buffer_tensors=buffer_tensors,
        payloads=tuple(p for p in payloads if p is not None),
        named_sizes=sizes,
        external=external,
        data_file=data_file,
    )


#: bytes per element of ExecuTorch's ScalarType codes (executorch/exir/scalar_type.py)
_SCALAR_BYTES = {
    0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 8: 4, 9: 8, 10: 16, 11: 1, 12: 1, 13: 1, 14: 4,
    15: 2, 22: 2, 23: 1, 24: 1, 25: 1, 26: 1, 27: 2, 28: 4, 29: 8,
}  # fmt: skip


def _buffer_tensors(program: Any) -> dict[int, frozenset[int]]:
    """Constant buffer index -> byte sizes of the constant tensors (no memory plan) reading it,
    over every method of the program."""
    sizes: dict[int, set[int]] = {}
    for plan in program.execution_plan:
        for value in plan.values:
            t = value.val
            idx = getattr(t, "data_buffer_idx", 0)
            if not idx or getattr(t, "allocation_info", None) is not None:
                continue
            numel = 1
            for d in t.sizes:
                numel *= int(d)
            elem = _SCALAR_BYTES.get(int(getattr(t.scalar_type, "value", t.scalar_type)))
            if elem is not None:
                sizes.setdefault(int(idx), set()).add(numel * elem)
    return {i: frozenset(v) for i, v in sizes.items()}


def file_extent(data: Any, view: Any) -> tuple[int, int] | None:
    """(offset, size) of ``view`` in the mapped file ``data`` (ExecuTorch's deserializer slices
    the mapping without copying), or None when it is a copy."""
    import numpy as np

    if not isinstance(data, mmap.mmap) or not isinstance(view, memoryview | bytes) or not len(view):
        return None
    base = np.frombuffer(data, dtype=np.uint8).__array_interface__["data"][0]
    addr = np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]
    off = addr - base
    return (off, len(view)) if 0 <= off <= len(data) - len(view) else None


def pte_extents(path: pathlib.Path) -> tuple[dict[str, tuple[int, int]], dict[int, tuple[int, int]]]:
    """File offset and size of every named-data buffer and every constant buffer of a .pte
    (what the weights-only patch rewrites in place), from ExecuTorch's own reader."""
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    pte = deserialize_pte(memoryview(data))
    named: dict[str, tuple[int, int]] = {}
    nd = pte.named_data
    if nd is not None:
        for key, entry in nd.pte_data.items():
            at = file_extent(data, nd.buffers[entry.buffer_index])
            if at is not None:
                named[key] = at
    constants = {
        i: at
        for i, b in enumerate(pte.program.constant_buffer)
        if (at := file_extent(data, b.storage)) is not None
    }
    return named, constants  # the read-only mapping goes with its last view
