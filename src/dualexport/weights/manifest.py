"""The weight manifest: every state_dict entry, its digest, and where each artifact keeps it.

Statuses, per entry and artifact:
- ``exact``: found bit for bit (ONNX initializer, XNNPACK named data keyed by the same sha256, or
  the .pte constant buffer).
- ``transformed``: stored in another layout (XNNPACK keeps conv weights NHWC); the stored bytes
  equal the holder's tensor after the recorded permutation, bit for bit.
- ``not_stored``: the target does not keep these bytes by design (BatchNorm folded into a conv,
  unused by the program); ``reason`` says why and ``checked`` what is verified instead.
- ``missing`` / ``mismatch``: the artifact does not carry what it should, or carries a weight's
  name with other bytes. These are the inconsistencies a user must see; ``verify_weights`` fails.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["WeightEntry", "WeightLocation", "WeightManifest", "SCHEMA", "FAILING_STATUSES"]

SCHEMA = "dualexport.weights/1"
FAILING_STATUSES = frozenset({"missing", "mismatch"})


@dataclass(frozen=True)
class WeightLocation:
    status: str
    where: str | None = None
    reason: str | None = None
    checked: str | None = None
    stored_sha256: str | None = None
    permutation: tuple[int, ...] | None = None


@dataclass(frozen=True)
class WeightEntry:
    """One weight (tied names listed once, with ``aliases``)."""

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    sha256: str
    aliases: tuple[str, ...] = ()
    locations: Mapping[str, WeightLocation] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


@dataclass(frozen=True)
class WeightManifest:
    entries: tuple[WeightEntry, ...]
    artifacts: Mapping[str, Mapping[str, Any]]
    versions: Mapping[str, str]
    program: Mapping[str, str]

    def entry(self, name: str) -> WeightEntry:
        for e in self.entries:
            if name in e.names:
                return e
        raise KeyError(name)

    def counts(self, target: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.entries:
            loc = e.locations.get(target)
            if loc is not None:
                out[loc.status] = out.get(loc.status, 0) + 1
        return out

    def problems(self) -> tuple[str, ...]:
        """Entries whose location status is a failure, as sentences."""
        out = []
        for e in self.entries:
            for target, loc in e.locations.items():
                if loc.status in FAILING_STATUSES:
                    out.append(f"{target}: weight {e.name!r} is {loc.status}: {loc.reason}")
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
                    "locations": {
                        t: {
                            k: (list(v) if isinstance(v, tuple) else v)
                            for k, v in asdict(loc).items()
                            if v is not None
                        }
                        for t, loc in e.locations.items()
                    },
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
            locs = {}
            for t, loc in e.get("locations", {}).items():
                perm = loc.get("permutation")
                locs[t] = WeightLocation(
                    status=loc["status"],
                    where=loc.get("where"),
                    reason=loc.get("reason"),
                    checked=loc.get("checked"),
                    stored_sha256=loc.get("stored_sha256"),
                    permutation=tuple(perm) if perm is not None else None,
                )
            entries.append(
                WeightEntry(
                    name=e["name"],
                    kind=e["kind"],
                    dtype=e["dtype"],
                    shape=tuple(e["shape"]),
                    nbytes=int(e["nbytes"]),
                    sha256=e["sha256"],
                    aliases=tuple(e.get("aliases", ())),
                    locations=locs,
                )
            )
        return cls(
            tuple(entries), data.get("artifacts", {}), data.get("versions", {}), data.get("program", {})
        )
