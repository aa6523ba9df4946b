"""What changed between two batch runs, regressions first.

Why thresholds: two runs of the same files give the same numbers, but a library upgrade moves the
last digits of every metric; only changes a user would act on are listed: a status that got worse
(or better), a target that stopped (or started) exporting or passing parity, a delegation share
that moved by half a percentage point or more, a subgraph count that changed, an SNR that moved by
3 dB or more, artifact bytes that changed (informational).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any

from ..errors import InputError
from .record import STATUSES, BatchRecord, EntryRecord

__all__ = ["diff_batches", "load_batch", "SHARE_STEP", "SNR_STEP_DB"]

SHARE_STEP = 0.005
SNR_STEP_DB = 3.0
_ORDER = {"regression": 0, "removed": 1, "new": 2, "improvement": 3, "changed": 4}


def load_batch(path: str | os.PathLike[str]) -> BatchRecord:
    """An earlier run's record: its ``batch.json``, or the folder that holds it."""
    p = pathlib.Path(path)
    if p.is_dir():
        p = p / "batch.json"
    try:
        return BatchRecord.from_dict(json.loads(p.read_text()))
    except OSError as exc:
        raise InputError(
            f"cannot read {p}: {exc.strerror or exc}", hint="pass an earlier run's batch.json"
        ) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"{p} is not a dualexport batch record: {exc}", hint="pass an earlier run's batch.json"
        ) from None


def _rank(status: str) -> int:
    return STATUSES.index(status) if status in STATUSES else len(STATUSES)


def _change(name: str, kind: str, field: str, before: Any, after: Any) -> dict[str, Any]:
    def enc(v: Any) -> Any:
        return v if not isinstance(v, float) or math.isfinite(v) else str(v)

    return {"name": name, "kind": kind, "field": field, "before": enc(before), "after": enc(after)}


def _entry_changes(old: EntryRecord, new: EntryRecord) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    n = new.name
    if old.status != new.status:
        kind = "regression" if _rank(new.status) > _rank(old.status) else "improvement"
        out.append(_change(n, kind, "status", old.status, new.status))
    for t in sorted(set(old.targets) | set(new.targets)):
        a, b = old.targets.get(t), new.targets.get(t)
        if a is None or b is None:
            if a is not None and a.ok:
                out.append(_change(n, "regression", f"{t}", "exported", "not asked"))
            continue
        if a.ok != b.ok:
            out.append(_change(n, "improvement" if b.ok else "regression", f"{t}.exported", a.ok, b.ok))
        if a.delegated_share is not None and b.delegated_share is not None:
            step = b.delegated_share - a.delegated_share
            if abs(step) >= SHARE_STEP:
                kind = "improvement" if step > 0 else "regression"
                out.append(_change(n, kind, f"{t}.delegated_share", a.delegated_share, b.delegated_share))
        if a.subgraphs is not None and b.subgraphs is not None and a.subgraphs != b.subgraphs:
            kind = "improvement" if b.subgraphs < a.subgraphs else "regression"
            out.append(_change(n, kind, f"{t}.subgraphs", a.subgraphs, b.subgraphs))
        if a.parity is not None and b.parity is not None:
            if a.parity.ok != b.parity.ok:
                kind = "improvement" if b.parity.ok else "regression"
                out.append(_change(n, kind, f"{t}.parity", a.parity.ok, b.parity.ok))
            sa, sb = a.parity.snr_db, b.parity.snr_db
            if math.isfinite(sa) and math.isfinite(sb) and abs(sb - sa) >= SNR_STEP_DB:
                kind = "improvement" if sb > sa else "regression"
                out.append(_change(n, kind, f"{t}.snr_db", round(sa, 1), round(sb, 1)))
        if a.ok and b.ok and {f.sha256 for f in a.files} != {f.sha256 for f in b.files}:
            out.append(_change(n, "changed", f"{t}.bytes", a.total_bytes, b.total_bytes))
    return out


def diff_batches(old: BatchRecord, new: BatchRecord, *, against: str = "") -> dict[str, Any]:
    """The changes from ``old`` to ``new``: regressions first, then removed and new entries,
    improvements, and informational changes; within a kind in manifest order."""
    before = {e.name: e for e in old.entries}
    changes: list[dict[str, Any]] = []
    for e in new.entries:
        o = before.get(e.name)
        if o is None:
            changes.append(_change(e.name, "new", "entry", None, e.status))
        else:
            changes.extend(_entry_changes(o, e))
    for name, o in before.items():
        if name not in {e.name for e in new.entries}:
            changes.append(_change(name, "removed", "entry", o.status, None))
    changes.sort(key=lambda c: _ORDER[c["kind"]])
    return {
        "against": against,
        "regressions": sum(c["kind"] == "regression" for c in changes),
        "changes": changes,
    }
