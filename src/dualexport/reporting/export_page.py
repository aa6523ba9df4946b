"""One self-contained HTML page per export: what was made, how, and what was proved about it.

Why one page: the verdict per target, the files, XNNPACK's delegation, the weight manifest and the
parity check used to live in separate files (``.weights.json``, ``.parity.html``, log lines); a
reviewer deciding whether to ship a model needs them side by side. The page has no script and
loads nothing. This module gathers the page's content into frozen records (``ExportPage``); the
template ``export.html`` lays it out.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._versions import library_versions
from ..charts import DELEGATED_COLOR, NOT_DELEGATED_COLOR, BarSeries, bar_chart, runtime_color, runtime_label
from ..outputs import atomic_write_text
from ..pages import Badge, render
from ..parity.html import ParitySection, parity_section
from ..pipeline.outcome import SHARED_PROGRAM
from ..weights.manifest import FAILING_STATUSES

if TYPE_CHECKING:
    from ..api import Artifact, ExportResult
    from ..exporters import DelegationReport
    from ..parity.report import ParityReport
    from ..weights import WeightManifest
    from ..weights.manifest import WeightLocation

__all__ = ["render_export_page", "write_export_page", "export_page", "ExportPage"]

_TARGET_ORDER = ("onnx", "xnnpack")
#: a manifest this long starts folded (the summary line above it still gives the counts)
_FOLD_WEIGHTS_OVER = 60
_DETAIL_CHARS = 90


# ----------------------------------------------------------------------------- the page's records
@dataclass(frozen=True)
class TargetRow:
    """A target's verdict: exported or why not, how its file was made, what was proved."""

    label: str
    color: str
    export: Badge
    error: str = ""  # a failed target: "ErrorType: message" (the other columns are empty)
    how: str = ""
    proof: str = ""
    weights: Badge | None = None
    weights_note: str = ""
    parity: Badge = Badge("not checked")
    seconds: float = 0.0


@dataclass(frozen=True)
class ErrorBox:
    target: str
    kind: str
    phase: str
    internal: bool
    message: str
    hint: str


@dataclass(frozen=True)
class FileRow:
    name: str
    of: str
    size: int | None


@dataclass(frozen=True)
class OpRow:
    op: str
    delegated: int
    not_delegated: int


@dataclass(frozen=True)
class DelegationSection:
    target: str
    subgraphs: int
    delegated_nodes: int
    non_delegated_nodes: int
    share: float
    ops: tuple[OpRow, ...]
    chart: str


@dataclass(frozen=True)
class WeightCell:
    """Where one target keeps one entry: its status, a short detail, and the whole of it."""

    status: Badge
    detail: str
    tip: str


@dataclass(frozen=True)
class WeightRow:
    name: str
    aliases: str
    kind: str
    dtype: str
    shape: str
    nbytes: int
    cells: tuple[WeightCell | None, ...]


@dataclass(frozen=True)
class WeightsSection:
    count: int
    summary: str
    open: bool
    targets: tuple[str, ...]
    rows: tuple[WeightRow, ...]


@dataclass(frozen=True)
class TimingRow:
    phase: str
    seconds: float
    when: str


@dataclass(frozen=True)
class FloatOpRow:
    """Computations an int8 program keeps in float: op, why, how many."""

    op: str
    reason: str
    count: int


@dataclass(frozen=True)
class QuantizationSection:
    """The int8 scheme and what it left in float (from the manifest's program record)."""

    scheme: str
    weights: str
    activations: str
    quantized_ops: str
    integer_ops: int
    float_ops: tuple[FloatOpRow, ...]


@dataclass(frozen=True)
class ExportPage:
    name: str
    verdict: Badge
    note: str
    out_dir: str
    targets: tuple[TargetRow, ...]
    problems: tuple[str, ...]
    errors: tuple[ErrorBox, ...]
    files: tuple[FileRow, ...]
    files_total: int
    delegations: tuple[DelegationSection, ...]
    weights: WeightsSection
    parity: ParitySection | None
    timings: tuple[TimingRow, ...]
    versions: tuple[tuple[str, str], ...]
    #: the libraries' warnings and log lines, kept off the terminal (dualexport._quiet)
    library_messages: tuple[str, ...] = ()
    quantization: QuantizationSection | None = None


# ----------------------------------------------------------------------------- gathering
def _quantization(res: ExportResult) -> QuantizationSection | None:
    """The manifest's record of an int8 export (None for a float one)."""
    record = res.manifest.program.get("quantization")
    if not isinstance(record, Mapping):
        return None
    weights = record.get("weights", {})
    return QuantizationSection(
        scheme=str(record.get("scheme", "")),
        weights=f"{weights.get('dtype', '')} in {weights.get('range', '')}: {weights.get('why', '')}",
        activations=str(record.get("activations", "")),
        quantized_ops=", ".join(f"{op} \u00d7{n}" for op, n in dict(record.get("quantized_ops", {})).items()),
        integer_ops=int(record.get("integer_ops", 0)),
        float_ops=tuple(
            FloatOpRow(str(f["op"]), str(f["reason"]), int(f["count"])) for f in record.get("float_ops", ())
        ),
    )


def _targets(res: ExportResult) -> list[str]:
    names = set(res.artifacts) | set(res.errors)
    return [t for t in _TARGET_ORDER if t in names] + sorted(names - set(_TARGET_ORDER))


def _how_made(art: Artifact) -> str:
    """The outcome in words: lowered now, reused from the cache, or patched weights-only."""
    from ..pipeline.outcome import Lowered, Patched, Reused  # torch is loaded: there is a result

    o = art.outcome
    if isinstance(o, Lowered):
        text = "lowered from the shared program"
        if o.forked:
            text += " in a forked worker"
        if o.opset:
            text += f" (ONNX opset {o.opset})"
        return text
    if isinstance(o, Reused):
        key = o.cache_key
        return "reused from the previous export (cache hit" + (f", key {key[:12]}\u2026)" if key else ")")
    if isinstance(o, Patched):
        return f"weights patched into copies of the previous files ({o.patched} tensor(s))"
    return "unknown"


def _proof(art: Artifact) -> str:
    proof = art.outcome.proof if art.outcome is not None else None
    if proof is None:
        return "\u2014"
    text = proof.ranges + (f"; ran from disk at {', '.join(proof.edges)}" if proof.edges else "")
    return text + ("" if proof.against == SHARED_PROGRAM else f"; judged against {proof.against}")


def _parity_badge(target: str, report: ParityReport | None) -> Badge:
    if report is None or target not in report.runtimes:
        return Badge("not checked")
    if target in report.errors:
        return Badge("fail", "FAIL", report.errors[target])
    ok = all(o.metrics[target].ok for o in report.outputs if target in o.metrics)
    return Badge("pass", "PASS") if ok else Badge("fail", "FAIL")


def _target_row(res: ExportResult, t: str, report: ParityReport | None) -> TargetRow:
    label, color = runtime_label(t), runtime_color(t)
    if t in res.errors:
        err = res.errors[t]
        return TargetRow(label, color, Badge("fail", "FAIL"), error=f"{type(err).__name__}: {err.message}")
    art = res.artifacts[t]
    counts = res.manifest.counts(t)
    weights = None
    if counts:
        bad = any(s in FAILING_STATUSES for s in counts)
        weights = Badge("fail", "FAIL") if bad else Badge("pass", "PASS")
    return TargetRow(
        label,
        color,
        Badge("pass", "PASS"),
        how=_how_made(art),
        proof=_proof(art),
        weights=weights,
        weights_note=", ".join(f"{n} {s}" for s, n in sorted(counts.items())),
        parity=_parity_badge(t, report),
        seconds=art.seconds,
    )


def _error_boxes(res: ExportResult) -> tuple[ErrorBox, ...]:
    return tuple(
        ErrorBox(runtime_label(t), type(e).__name__, e.phase, e.internal, e.message, e.hint or "")
        for t, e in res.errors.items()
    )


def _size(path: pathlib.Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _files(res: ExportResult) -> tuple[FileRow, ...]:
    rows = [
        FileRow(f.name, t, _size(f))
        for t in _targets(res)
        if (art := res.artifacts.get(t)) is not None
        for f in art.files
    ]
    manifest = res.out_dir / f"{res.name}.weights.json"
    if manifest.is_file():
        rows.append(FileRow(manifest.name, "weight manifest", _size(manifest)))
    return tuple(rows)


def _delegation(t: str, rep: DelegationReport) -> DelegationSection:
    ops = list(rep.by_op)
    chart = bar_chart(
        ops,
        [
            BarSeries("delegated", DELEGATED_COLOR, tuple(float(rep.by_op[o][0]) for o in ops)),
            BarSeries("not delegated", NOT_DELEGATED_COLOR, tuple(float(rep.by_op[o][1]) for o in ops)),
        ],
        title="Nodes per op: delegated vs not delegated",
        x_label="nodes (count)",
        stacked=True,
        integer=True,
        width=720,
    )
    return DelegationSection(
        runtime_label(t),
        rep.subgraphs,
        rep.delegated_nodes,
        rep.non_delegated_nodes,
        rep.delegated_share,
        tuple(OpRow(op, d, nd) for op, (d, nd) in rep.by_op.items()),
        chart,
    )


def _weight_cell(loc: WeightLocation | None) -> WeightCell | None:
    if loc is None:
        return None
    detail = loc.where or loc.reason or ""
    short = detail if len(detail) <= _DETAIL_CHARS else detail[: _DETAIL_CHARS - 1] + "\u2026"
    tip = "; ".join(str(x) for x in (loc.where, loc.reason, loc.checked) if x)
    return WeightCell(Badge(loc.status), short, tip)


def _weights(res: ExportResult) -> WeightsSection:
    m: WeightManifest = res.manifest
    targets = [t for t in _targets(res) if any(t in e.locations for e in m.entries)]
    summary = "; ".join(
        f"{runtime_label(t)}: " + ", ".join(f"{n} {s}" for s, n in sorted(m.counts(t).items()))
        for t in targets
    )
    rows = tuple(
        WeightRow(
            e.name,
            ", ".join(e.aliases),
            e.kind,
            e.dtype,
            str(list(e.shape)),
            e.nbytes,
            tuple(_weight_cell(e.locations.get(t)) for t in targets),
        )
        for e in m.entries
    )
    open_ = len(m.entries) <= _FOLD_WEIGHTS_OVER or bool(m.problems())
    return WeightsSection(len(m.entries), summary, open_, tuple(runtime_label(t) for t in targets), rows)


def _passed(res: ExportResult, report: ParityReport | None) -> bool:
    """Every target exported, every weight where it belongs, and parity held (when checked)."""
    return res.ok and not res.manifest.problems() and (report is None or report.ok)


def export_page(
    res: ExportResult, report: ParityReport | None = None, *, seconds: Mapping[str, float] | None = None
) -> ExportPage:
    """The page's content, every chart drawn (see ``render_export_page``)."""
    ok = _passed(res, report)
    files = _files(res)
    timings = [TimingRow(k, float(v), "export") for k, v in res.seconds.items()]
    timings += [TimingRow(k, float(v), "after the export") for k, v in (seconds or {}).items()]
    versions = (
        dict(report.versions) if report is not None and report.versions else dict(res.manifest.versions)
    )
    return ExportPage(
        name=res.name,
        verdict=Badge("pass", "PASS") if ok else Badge("fail", "FAIL"),
        note=" (parity not checked)" if report is None and ok else "",
        out_dir=str(res.out_dir),
        targets=tuple(_target_row(res, t, report) for t in _targets(res)),
        problems=tuple(res.manifest.problems()),
        errors=_error_boxes(res),
        files=files,
        files_total=sum(f.size or 0 for f in files if f.of != "weight manifest"),
        delegations=tuple(
            _delegation(t, art.delegation)
            for t in _targets(res)
            if (art := res.artifacts.get(t)) is not None and art.delegation is not None
        ),
        weights=_weights(res),
        parity=parity_section(report) if report is not None else None,
        timings=tuple(timings),
        versions=tuple((versions or library_versions()).items()),
        library_messages=tuple(getattr(res, "library_messages", ())),
        quantization=_quantization(res),
    )


# ----------------------------------------------------------------------------- rendering
def render_export_page(
    res: ExportResult, report: ParityReport | None = None, *, seconds: Mapping[str, float] | None = None
) -> str:
    """The page for one export: verdict per target and how its file was made, errors, files,
    delegation, weight manifest, parity (``report``; says so when absent), timings per phase
    (``seconds`` adds phases run after the export, e.g. verify and compare) and versions."""
    return render("export.html", page=export_page(res, report, seconds=seconds))


def write_export_page(
    path: str | pathlib.Path,
    res: ExportResult,
    report: ParityReport | None = None,
    *,
    seconds: Mapping[str, float] | None = None,
) -> pathlib.Path:
    """Write the page atomically (a reader never sees half a page) and return its path."""
    path = pathlib.Path(path)
    atomic_write_text(path, render_export_page(res, report, seconds=seconds))
    return path
