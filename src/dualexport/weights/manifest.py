"""The weight manifest: every state_dict entry, its digest, and *every* place each artifact
stores it.

Why every place: one Parameter can be stored several times by one file (a tied embedding and
output head: ONNX keeps the Gather table and a transposed MatMul initializer; the .pte keeps the
portable embedding's constant buffer and the delegated head's XNNPACK named data). A manifest
that records one place per weight verifies one copy and patches one copy, and a retrained model
ships a stale second copy reported as proven.

Statuses, per stored copy (``WeightEntry.copies[target]``, a tuple):
- ``exact``: the holder's bytes, bit for bit (an ONNX initializer, XNNPACK named data keyed by
  their sha256, a .pte constant buffer bound to a tensor of the weight's size, or bytes in the
  XNNPACK payload at a recorded offset).
- ``transformed``: stored in another layout (XNNPACK keeps conv weights NHWC; the ONNX pipeline
  keeps a MatMul's weight transposed) or encoding (int4 codes packed two per byte, bfloat16
  group scales): the stored bytes equal the holder's tensor after the recorded permutation and
  encoding, bit for bit.
- ``derived``: the file stores a value computed from the weight that cannot be related to it
  bit for bit (a constant folded from it, a convolution fused with BatchNorm); ``reason`` says
  how, ``checked`` what is verified instead. A weights-only patch is impossible for it.
- ``not_stored``: the file does not keep these bytes at all by design (unused, folded away);
  the one record of its target.
- ``missing`` / ``mismatch``: the artifact does not carry what it should, or carries a weight's
  name with other bytes. These are the inconsistencies a user must see; ``verify_weights`` fails.

``WeightEntry.locations[target]`` summarizes a target's copies in one record (the first failing
copy, else the first copy) for tables and older callers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "WeightEntry",
    "WeightLocation",
    "WeightManifest",
    "SCHEMA",
    "FAILING_STATUSES",
    "STORED_STATUSES",
]

SCHEMA = "dualexport.weights/2"
FAILING_STATUSES = frozenset({"missing", "mismatch"})
#: statuses of a copy whose bytes are checked from disk
STORED_STATUSES = frozenset({"exact", "transformed"})


@dataclass(frozen=True)
class WeightLocation:
    """One stored copy of a weight in one artifact (or the record of why there is none).

    ``where`` is ``<kind>:<ref>``: ``initializer:<name>@<file>[@<offset>]``,
    ``named_data:<sha256 key>``, ``constant_buffer:<index>``, ``delegate_payload:<offset>``.
    """

    status: str
    where: str | None = None
    reason: str | None = None
    checked: str | None = None
    stored_sha256: str | None = None
    permutation: tuple[int, ...] | None = None
    #: how a ``transformed`` copy's values are written after the permutation (None: as the
    #: holder's dtype); one of :data:`~dualexport.weights.locate.ENCODINGS`, or
    #: ``rows_repeated:R`` (a per-row scale repeated per block, before the permutation)
    encoding: str | None = None

    @property
    def kind(self) -> str:
        return (self.where or "").partition(":")[0]

    @property
    def ref(self) -> str:
        return (self.where or "").partition(":")[2]


def _summary(copies: tuple[WeightLocation, ...]) -> WeightLocation:
    for c in copies:
        if c.status in FAILING_STATUSES:
            return c
    return copies[0]


@dataclass(frozen=True)
class WeightEntry:
    """One weight (tied names listed once, with ``aliases``) and every copy each target keeps."""

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    sha256: str
    aliases: tuple[str, ...] = ()
    copies: Mapping[str, tuple[WeightLocation, ...]] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def locations(self) -> Mapping[str, WeightLocation]:
        """One record per target: its first failing copy, else its first copy."""
        return {t: _summary(c) for t, c in self.copies.items() if c}


@dataclass(frozen=True)
class WeightManifest:
    entries: tuple[WeightEntry, ...]
    artifacts: Mapping[str, Mapping[str, Any]]
    versions: Mapping[str, str]
    #: the shared program: graph and shapes digests, its file, and an int8 export's quantization record
    program: Mapping[str, Any]

    def entry(self, name: str) -> WeightEntry:
        for e in self.entries:
            if name in e.names:
                return e
        raise KeyError(name)

    def counts(self, target: str) -> dict[str, int]:
        """Entries per summary status (``locations``) for ``target``."""
        out: dict[str, int] = {}
        for e in self.entries:
            loc = e.locations.get(target)
            if loc is not None:
                out[loc.status] = out.get(loc.status, 0) + 1
        return out

    def copy_counts(self, target: str) -> dict[str, int]:
        """Stored copies per status for ``target`` (a tied weight counts each copy)."""
        out: dict[str, int] = {}
        for e in self.entries:
            for c in e.copies.get(target, ()):
                out[c.status] = out.get(c.status, 0) + 1
        return out

    def problems(self) -> tuple[str, ...]:
        """Copies whose status is a failure, as sentences."""
        out = []
        for e in self.entries:
            for target, copies in e.copies.items():
                for loc in copies:
                    if loc.status in FAILING_STATUSES:
                        at = f" ({loc.where})" if loc.where else ""
                        out.append(f"{target}: weight {e.name!r} is {loc.status}{at}: {loc.reason}")
        return tuple(out)

    # ----------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "versions": dict(self.versions),
            "program": dict(self.program),
            "artifacts": {k: dict(v) for k, v in self.artifacts.items()},
            "entries": [
                {
                    "name": e.name,
                    "kind": e.kind,
                    "dtype": e.dtype,
                    "shape": list(e.shape),
                    "nbytes": e.nbytes,
                    "sha256": e.sha256,
                    "aliases": list(e.aliases),
                    "copies": {t: [_location_dict(c) for c in copies] for t, copies in e.copies.items()},
                }
                for e in self.entries
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WeightManifest:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} manifest (schema={data.get('schema')!r})")
        entries = []
        for e in data["entries"]:
            entries.append(
                WeightEntry(
                    name=e["name"],
                    kind=e["kind"],
                    dtype=e["dtype"],
                    shape=tuple(e["shape"]),
                    nbytes=int(e["nbytes"]),
                    sha256=e["sha256"],
                    aliases=tuple(e.get("aliases", ())),
                    copies={
                        t: tuple(_location_from(c) for c in copies)
                        for t, copies in e.get("copies", {}).items()
                    },
                )
            )
        return cls(
            tuple(entries), data.get("artifacts", {}), data.get("versions", {}), data.get("program", {})
        )


def _location_dict(loc: WeightLocation) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(loc).items() if v is not None}


def _location_from(data: Mapping[str, Any]) -> WeightLocation:
    perm = data.get("permutation")
    return WeightLocation(
        status=data["status"],
        where=data.get("where"),
        reason=data.get("reason"),
        checked=data.get("checked"),
        stored_sha256=data.get("stored_sha256"),
        permutation=tuple(perm) if perm is not None else None,
        encoding=data.get("encoding"),
    )
