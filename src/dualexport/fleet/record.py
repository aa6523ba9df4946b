"""What a batch records: one ``EntryRecord`` per manifest entry, one ``BatchRecord`` per run.

Why plain values with a JSON form: the record crosses process boundaries (a spawned worker, a Ray
task), lands in ``batch.json`` (schema-versioned, read back by ``--compare-to``) and is rendered
into ``batch.html``; the same value must survive every hop unchanged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "BATCH_SCHEMA",
    "STATUSES",
    "FileRecord",
    "ParitySummary",
    "TargetRecord",
    "EntryRecord",
    "BatchRecord",
]

BATCH_SCHEMA = "dualexport.batch/1"

#: An entry's status, best first. ``passed``: every target exported, weights verified from disk,
#: parity held. ``check_failed``: exported, but a weight or parity check failed. ``failed``: a
#: target failed to export. ``error``: the entry could not run (model import, inputs). ``timeout``
#: / ``killed``: the worker ran out of time or died. ``invalid``: the manifest entry is malformed.
STATUSES = ("passed", "check_failed", "failed", "error", "timeout", "killed", "invalid")


def _num(v: float | None) -> float | str | None:
    if v is None or math.isfinite(v):
        return v
    return "inf" if v > 0 else ("-inf" if v < 0 else "nan")


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True)
class FileRecord:
    """One published file: its name inside the entry's folder, size and sha256."""

    name: str
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FileRecord:
        return cls(str(d["name"]), int(d["bytes"]), str(d["sha256"]))


@dataclass(frozen=True)
class ParitySummary:
    """The worst output of one runtime against eager, over every input set the check ran."""

    ok: bool
    max_abs: float
    snr_db: float
    cosine: float
    mismatch_pct: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "max_abs": _num(self.max_abs),
            "snr_db": _num(self.snr_db),
            "cosine": _num(self.cosine),
            "mismatch_pct": _num(self.mismatch_pct),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParitySummary:
        return cls(
            bool(d["ok"]),
            float(d["max_abs"]),
            float(d["snr_db"]),
            float(d["cosine"]),
            float(d["mismatch_pct"]),
        )


@dataclass(frozen=True)
class TargetRecord:
    """One target of one entry: how its files were made (``lowered``, ``reused``, ``patched``) or
    why it failed, its files, XNNPACK's delegation and the parity of its runtime."""

    target: str
    ok: bool
    outcome: str | None = None
    error: str | None = None
    error_type: str | None = None
    seconds: float = 0.0
    files: tuple[FileRecord, ...] = ()
    delegated_share: float | None = None
    subgraphs: int | None = None
    parity: ParitySummary | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def with_(self, **changes: Any) -> TargetRecord:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "ok": self.ok,
            "outcome": self.outcome,
            "error": self.error,
            "error_type": self.error_type,
            "seconds": round(self.seconds, 3),
            "files": [f.to_dict() for f in self.files],
            "delegated_share": self.delegated_share,
            "subgraphs": self.subgraphs,
            "parity": None if self.parity is None else self.parity.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TargetRecord:
        return cls(
            target=str(d["target"]),
            ok=bool(d["ok"]),
            outcome=d.get("outcome"),
            error=d.get("error"),
            error_type=d.get("error_type"),
            seconds=float(d.get("seconds", 0.0)),
            files=tuple(FileRecord.from_dict(f) for f in d.get("files", ())),
            delegated_share=_float(d.get("delegated_share")),
            subgraphs=None if d.get("subgraphs") is None else int(d["subgraphs"]),
            parity=None if d.get("parity") is None else ParitySummary.from_dict(d["parity"]),
        )


@dataclass(frozen=True)
class EntryRecord:
    """One manifest entry's result.

    ``folder`` is the entry's subfolder of the batch's output folder (artifacts, manifest,
    ``<name>.report.html``); ``line`` the manifest line of its table; ``keys`` the per-target cache
    keys (the next run compares them); ``phases`` seconds per phase (load, export, verify, compare,
    report); ``peak_rss_mb`` the worker's own peak; ``estimate_mb`` what admission assumed.
    """

    name: str
    status: str
    line: int | None = None
    reason: str | None = None
    folder: str | None = None
    targets: Mapping[str, TargetRecord] = field(default_factory=dict)
    weights_ok: bool | None = None
    parity_ok: bool | None = None
    vacuous: bool = False
    seconds: float = 0.0
    phases: Mapping[str, float] = field(default_factory=dict)
    attempts: int = 1
    peak_rss_mb: float | None = None
    estimate_mb: float | None = None
    weight_bytes: int | None = None
    keys: Mapping[str, str] = field(default_factory=dict)
    report: str | None = None
    worker: str | None = None
    digest: str | None = None
    carried: bool = False
    started: float | None = None  # Unix time the worker began the entry (when, and alongside what)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown entry status {self.status!r}; one of {STATUSES}")

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def with_(self, **changes: Any) -> EntryRecord:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "line": self.line,
            "reason": self.reason,
            "folder": self.folder,
            "targets": {t: r.to_dict() for t, r in self.targets.items()},
            "weights_ok": self.weights_ok,
            "parity_ok": self.parity_ok,
            "vacuous": self.vacuous,
            "seconds": round(self.seconds, 3),
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
            "attempts": self.attempts,
            "peak_rss_mb": None if self.peak_rss_mb is None else round(self.peak_rss_mb, 1),
            "estimate_mb": None if self.estimate_mb is None else round(self.estimate_mb, 1),
            "weight_bytes": self.weight_bytes,
            "keys": dict(self.keys),
            "report": self.report,
            "worker": self.worker,
            "digest": self.digest,
            "carried": self.carried,
            "started": self.started,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EntryRecord:
        return cls(
            name=str(d["name"]),
            status=str(d["status"]),
            line=d.get("line"),
            reason=d.get("reason"),
            folder=d.get("folder"),
            targets={t: TargetRecord.from_dict(r) for t, r in d.get("targets", {}).items()},
            weights_ok=d.get("weights_ok"),
            parity_ok=d.get("parity_ok"),
            vacuous=bool(d.get("vacuous", False)),
            seconds=float(d.get("seconds", 0.0)),
            phases={k: float(v) for k, v in d.get("phases", {}).items()},
            attempts=int(d.get("attempts", 1)),
            peak_rss_mb=_float(d.get("peak_rss_mb")),
            estimate_mb=_float(d.get("estimate_mb")),
            weight_bytes=d.get("weight_bytes"),
            keys=dict(d.get("keys", {})),
            report=d.get("report"),
            worker=d.get("worker"),
            digest=d.get("digest"),
            carried=bool(d.get("carried", False)),
            started=_float(d.get("started")),
        )


@dataclass(frozen=True)
class BatchRecord:
    """One batch run: the entries in manifest order, how the run went, and (with
    ``--compare-to``) the difference against an earlier run's record."""

    entries: tuple[EntryRecord, ...]
    manifest: str
    manifest_sha256: str
    engine: str
    workers: int
    started: str
    seconds: float
    versions: Mapping[str, str] = field(default_factory=dict)
    address: str | None = None
    memory_budget_mb: float | None = None
    diff: Mapping[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return all(e.passed for e in self.entries)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for e in self.entries:
            out[e.status] += 1
        return {k: v for k, v in out.items() if v}

    def with_diff(self, diff: Mapping[str, Any]) -> BatchRecord:
        return replace(self, diff=diff)

    def entry(self, name: str) -> EntryRecord:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": BATCH_SCHEMA,
            "ok": self.ok,
            "counts": self.counts(),
            "manifest": self.manifest,
            "manifest_sha256": self.manifest_sha256,
            "engine": self.engine,
            "address": self.address,
            "workers": self.workers,
            "memory_budget_mb": self.memory_budget_mb,
            "started": self.started,
            "seconds": round(self.seconds, 3),
            "versions": dict(self.versions),
            "entries": [e.to_dict() for e in self.entries],
            "diff": None if self.diff is None else dict(self.diff),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BatchRecord:
        schema = d.get("schema")
        if schema != BATCH_SCHEMA:
            raise ValueError(f"batch record schema {schema!r}, expected {BATCH_SCHEMA!r}")
        return cls(
            entries=tuple(EntryRecord.from_dict(e) for e in d["entries"]),
            manifest=str(d["manifest"]),
            manifest_sha256=str(d["manifest_sha256"]),
            engine=str(d["engine"]),
            workers=int(d["workers"]),
            started=str(d["started"]),
            seconds=float(d["seconds"]),
            versions=dict(d.get("versions", {})),
            address=d.get("address"),
            memory_budget_mb=_float(d.get("memory_budget_mb")),
            diff=d.get("diff"),
        )
