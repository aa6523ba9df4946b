"""The batch page (``batch.html``): how a whole manifest of models went, one row per entry.

Why it reads the record structurally (the ``*Like`` protocols) instead of importing
``dualexport.fleet``: the fleet sits above the reports in the import layers, and it is the fleet
that calls this page. Why the table is pre-sorted and the script optional: the page must read the
same with scripts off (failures and regressions on top); the small inline script only re-sorts
rows by a clicked header, using each cell's ``data-sort``, and loads nothing. This module turns
the record into frozen rows and cells (``BatchPage``); the template ``batch.html`` lays them out.
"""

from __future__ import annotations

import json
import math
import pathlib
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..charts import (
    DELEGATED_COLOR,
    NOT_DELEGATED_COLOR,
    BarSeries,
    DotSeries,
    bar_chart,
    dot_plot,
    format_number,
    runtime_color,
    runtime_label,
)
from ..outputs import atomic_write_text
from ..pages import Badge, render

__all__ = [
    "render_batch_page",
    "write_batch_page",
    "batch_page",
    "BatchPage",
    "BatchLike",
    "EntryLike",
    "TargetLike",
]

#: entry statuses best first, as ``dualexport.fleet.record.STATUSES`` (an unknown one sorts last)
_STATUS_ORDER = ("passed", "check_failed", "failed", "error", "timeout", "killed", "invalid")
_KIND_ORDER = ("regression", "improvement", "changed", "new", "removed")
_TARGET_ORDER = ("onnx", "xnnpack")
_REASON_CHARS = 90


# ----------------------------------------------------------------------------- what is read
class FileLike(Protocol):
    @property
    def bytes(self) -> int: ...


class ParityLike(Protocol):
    @property
    def ok(self) -> bool: ...
    @property
    def max_abs(self) -> float: ...
    @property
    def snr_db(self) -> float: ...
    @property
    def cosine(self) -> float: ...
    @property
    def mismatch_pct(self) -> float: ...


class TargetLike(Protocol):
    @property
    def ok(self) -> bool: ...
    @property
    def outcome(self) -> str | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def error_type(self) -> str | None: ...
    @property
    def seconds(self) -> float: ...
    @property
    def files(self) -> Sequence[FileLike]: ...
    @property
    def delegated_share(self) -> float | None: ...
    @property
    def subgraphs(self) -> int | None: ...
    @property
    def parity(self) -> ParityLike | None: ...


class EntryLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def line(self) -> int | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def targets(self) -> Mapping[str, TargetLike]: ...
    @property
    def vacuous(self) -> bool: ...
    @property
    def seconds(self) -> float: ...
    @property
    def phases(self) -> Mapping[str, float]: ...
    @property
    def attempts(self) -> int: ...
    @property
    def peak_rss_mb(self) -> float | None: ...
    @property
    def estimate_mb(self) -> float | None: ...
    @property
    def report(self) -> str | None: ...


class BatchLike(Protocol):
    """What the page reads of ``dualexport.fleet.BatchRecord``."""

    @property
    def entries(self) -> Sequence[EntryLike]: ...
    @property
    def manifest(self) -> str: ...
    @property
    def manifest_sha256(self) -> str: ...
    @property
    def engine(self) -> str: ...
    @property
    def workers(self) -> int: ...
    @property
    def started(self) -> str: ...
    @property
    def seconds(self) -> float: ...
    @property
    def versions(self) -> Mapping[str, str]: ...
    @property
    def address(self) -> str | None: ...
    @property
    def memory_budget_mb(self) -> float | None: ...
    @property
    def diff(self) -> Mapping[str, Any] | None: ...
    @property
    def ok(self) -> bool: ...
    def counts(self) -> dict[str, int]: ...


# ----------------------------------------------------------------------------- the page's records
@dataclass(frozen=True)
class Note:
    """Small text after a cell's value (e.g. "line 3")."""

    text: str
    title: str = ""


@dataclass(frozen=True)
class Cell:
    """One table cell: badges, then its text (a link with ``href``), then notes. ``sort``: the
    key the header sort reads (numbers as JavaScript's parseFloat reads them)."""

    text: str = ""
    sort: str = ""
    cls: str = ""
    title: str = ""
    href: str = ""
    badges: tuple[Badge, ...] = ()
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class Column:
    group: str | None  # a header over several columns (a target); None: the column stands alone
    header: str
    cell: Callable[[EntryLike], Cell]
    tip: str = ""
    color: str = ""


@dataclass(frozen=True)
class HeaderCell:
    """A header cell: ``col`` is the column it sorts (None for a group over several columns)."""

    text: str
    col: int | None
    span: int = 1
    tip: str = ""
    color: str = ""


@dataclass(frozen=True)
class Row:
    cells: tuple[Cell, ...]
    regressed: bool


@dataclass(frozen=True)
class Summary:
    entries: int
    counts: tuple[Badge, ...]
    manifest: str
    manifest_sha256: str
    engine: str
    workers: int
    memory_budget: str
    started: str
    seconds: float
    throughput: str


@dataclass(frozen=True)
class ChangeRow:
    name: str
    kind: Badge
    field: str
    before: str
    after: str
    before_full: str
    after_full: str


@dataclass(frozen=True)
class Changes:
    against: str
    rows: tuple[ChangeRow, ...]


@dataclass(frozen=True)
class BatchPage:
    verdict: Badge
    summary: Summary
    changes: Changes | None
    header_top: tuple[HeaderCell, ...]
    header_bottom: tuple[HeaderCell, ...]
    rows: tuple[Row, ...]
    charts: tuple[str, ...]
    versions: tuple[tuple[str, str], ...]


# ----------------------------------------------------------------------------- cells
def _status_rank(status: str) -> int:
    return _STATUS_ORDER.index(status) if status in _STATUS_ORDER else len(_STATUS_ORDER)


def _sort_key(v: float | None) -> str:
    """A ``data-sort`` value JavaScript's parseFloat reads (inf included); '' for no value."""
    if v is None or math.isnan(v):
        return ""
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return repr(float(v))


def _short(v: Any, limit: int = 80) -> str:
    """A diff's before/after value as short text (numbers short, containers as JSON)."""
    if v is None:
        return "\u2014"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format_number(v)
    text = v if isinstance(v, str) else json.dumps(v, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _num_cell(v: float | None, text: str | None = None, cls: str = "num") -> Cell:
    return Cell(text if text is not None else format_number(v), _sort_key(v), cls)


_NONE = _num_cell(None, "\u2014")


def _targets_of(entries: Sequence[EntryLike]) -> list[str]:
    names = {t for e in entries for t in e.targets}
    return [t for t in _TARGET_ORDER if t in names] + sorted(names - set(_TARGET_ORDER))


def _export_cell(t: str) -> Callable[[EntryLike], Cell]:
    def cell(e: EntryLike) -> Cell:
        r = e.targets.get(t)
        if r is None:
            return Cell("", "", notes=(Note("\u2014"),))
        if r.ok:
            how = r.outcome or "exported"
            return Cell(
                sort=f"0 {how}",
                title=f"{format_number(r.seconds, 3)} s",
                badges=(Badge("pass", "\u2713 " + how),),
            )
        kind = r.error_type or "failed"
        return Cell(sort=f"1 {kind}", title=r.error or kind, badges=(Badge("fail", "\u2717 " + kind),))

    return cell


def _size_cell(t: str) -> Callable[[EntryLike], Cell]:
    def cell(e: EntryLike) -> Cell:
        r = e.targets.get(t)
        if r is None or not r.files:
            return _NONE
        n = sum(f.bytes for f in r.files)
        return Cell(f"{n / 1e6:.2f}", str(n), "num", f"{n} bytes in {len(r.files)} file(s)")

    return cell


def _share_cell(t: str) -> Callable[[EntryLike], Cell]:
    def cell(e: EntryLike) -> Cell:
        r = e.targets.get(t)
        share = None if r is None else r.delegated_share
        if share is None:
            return _NONE
        return Cell(f"{100 * share:.1f}", _sort_key(share), "num" + ("" if share >= 1 else " warn"))

    return cell


def _subgraphs_cell(t: str) -> Callable[[EntryLike], Cell]:
    def cell(e: EntryLike) -> Cell:
        r = e.targets.get(t)
        n = None if r is None else r.subgraphs
        return _NONE if n is None else _num_cell(float(n), str(n))

    return cell


def _parity_cell(t: str, what: str) -> Callable[[EntryLike], Cell]:
    def cell(e: EntryLike) -> Cell:
        r = e.targets.get(t)
        p = None if r is None else r.parity
        if p is None:
            return _NONE
        v = p.snr_db if what == "snr" else p.max_abs
        tip = (
            f"{'ok' if p.ok else 'out of tolerance'}: SNR {format_number(p.snr_db, 4)} dB, max_abs "
            f"{format_number(p.max_abs)}, cosine {format_number(p.cosine, 6)}, mismatch {p.mismatch_pct:.2f}%"
        )
        text = format_number(v, 4 if what == "snr" else 3) + ("" if p.ok else " \u2717")
        return Cell(text, _sort_key(v), "num " + ("good" if p.ok else "bad"), tip)

    return cell


def _name_cell(out_dir: pathlib.Path | None) -> Callable[[EntryLike], Cell]:
    def cell(e: EntryLike) -> Cell:
        notes, href = [], ""
        if e.report:
            if out_dir is not None and not (out_dir / e.report).is_file():
                notes.append(Note("(report missing)"))
            else:
                href = urllib.parse.quote(e.report)
        if e.line is not None:
            notes.append(Note(f"line {e.line}"))
        return Cell(e.name, e.name.lower(), href=href, notes=tuple(notes))

    return cell


def _status_cell(regressed: set[str]) -> Callable[[EntryLike], Cell]:
    def cell(e: EntryLike) -> Cell:
        badges = (Badge(e.status), Badge("regression")) if e.name in regressed else (Badge(e.status),)
        notes = (Note("vacuous", "no output to compare"),) if e.vacuous else ()
        return Cell(
            sort=f"{_status_rank(e.status)}{0 if e.name in regressed else 1}", badges=badges, notes=notes
        )

    return cell


def _seconds_cell(e: EntryLike) -> Cell:
    v = e.phases.get("export", e.seconds)
    tip = ", ".join(f"{k} {x:.2f} s" for k, x in e.phases.items()) + f"; entry total {e.seconds:.2f} s"
    return Cell(f"{v:.1f}", _sort_key(v), "num", tip)


def _rss_cell(e: EntryLike) -> Cell:
    tip = f"admission estimate {format_number(e.estimate_mb)} MB" if e.estimate_mb is not None else ""
    v = e.peak_rss_mb
    return Cell("\u2014" if v is None else f"{v:.0f}", _sort_key(v), "num", tip)


def _attempts_cell(e: EntryLike) -> Cell:
    return Cell(str(e.attempts), str(e.attempts), "num" + (" warn" if e.attempts > 1 else ""))


def _reason_cell(e: EntryLike) -> Cell:
    text = e.reason or ""
    if not text:
        return Cell()
    short = text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 1] + "\u2026"
    return Cell(short, text.lower(), "reason", text)


# ----------------------------------------------------------------------------- the table
def _columns(entries: Sequence[EntryLike], regressed: set[str], out_dir: pathlib.Path | None) -> list[Column]:
    cols = [
        Column(None, "entry", _name_cell(out_dir)),
        Column(None, "status", _status_cell(regressed), "worst first"),
    ]
    for t in _targets_of(entries):
        group, color = runtime_label(t), runtime_color(t)
        cols.append(
            Column(group, "export", _export_cell(t), "lowered, reused or patched; or why it failed", color)
        )
        cols.append(Column(group, "MB", _size_cell(t), "size of the target's files", color))
        if any((r := e.targets.get(t)) is not None and r.delegated_share is not None for e in entries):
            cols.append(Column(group, "delegated %", _share_cell(t), "share of nodes delegated", color))
            cols.append(Column(group, "subgraphs", _subgraphs_cell(t), "delegated subgraphs", color))
        if any((r := e.targets.get(t)) is not None and r.parity is not None for e in entries):
            cols.append(Column(group, "SNR dB", _parity_cell(t, "snr"), "worst output vs eager", color))
            cols.append(
                Column(group, "max |err|", _parity_cell(t, "max_abs"), "worst output vs eager", color)
            )
    cols.append(Column(None, "export s", _seconds_cell, "export phase (tooltip: every phase)"))
    cols.append(Column(None, "peak RSS MB", _rss_cell, "the worker's peak resident memory"))
    cols.append(Column(None, "attempts", _attempts_cell))
    cols.append(Column(None, "reason", _reason_cell, "why the entry did not pass"))
    return cols


def _headers(cols: Sequence[Column]) -> tuple[tuple[HeaderCell, ...], tuple[HeaderCell, ...]]:
    """Two header rows: a column that stands alone spans both; a target's columns sit under
    one group cell ruled in the target's colour."""
    top: list[HeaderCell] = []
    bottom: list[HeaderCell] = []
    i = 0
    while i < len(cols):
        c = cols[i]
        if c.group is None:
            top.append(HeaderCell(c.header, i, tip=c.tip))
            i += 1
            continue
        j = i
        while j < len(cols) and cols[j].group == c.group:
            bottom.append(HeaderCell(cols[j].header, j, tip=cols[j].tip))
            j += 1
        top.append(HeaderCell(c.group, None, span=j - i, color=c.color))
        i = j
    return tuple(top), tuple(bottom)


# ----------------------------------------------------------------------------- sections
def _summary(batch: BatchLike) -> Summary:
    n = len(batch.entries)
    return Summary(
        entries=n,
        counts=tuple(Badge(s, f"{s} {k}") for s, k in batch.counts().items()),
        manifest=batch.manifest,
        manifest_sha256=batch.manifest_sha256[:16],
        engine=batch.engine + (f" at {batch.address}" if batch.address else ""),
        workers=batch.workers,
        memory_budget="none" if batch.memory_budget_mb is None else f"{batch.memory_budget_mb:.0f} MB",
        started=batch.started,
        seconds=batch.seconds,
        throughput=f"{n / (batch.seconds / 60):.1f} entries/minute" if batch.seconds > 0 and n else "n/a",
    )


def _changes(diff: Mapping[str, Any]) -> Changes:
    changes = [c for c in (diff.get("changes") or ()) if isinstance(c, Mapping)]

    def rank(c: Mapping[str, Any]) -> int:
        kind = str(c.get("kind", ""))
        return _KIND_ORDER.index(kind) if kind in _KIND_ORDER else len(_KIND_ORDER)

    changes.sort(key=rank)  # stable: within a kind, the order the diff gave
    rows = tuple(
        ChangeRow(
            str(c.get("name", "")),
            Badge(str(c.get("kind", "changed"))),
            str(c.get("field", "")),
            _short(c.get("before")),
            _short(c.get("after")),
            _short(c.get("before"), 2000),
            _short(c.get("after"), 2000),
        )
        for c in changes
    )
    return Changes(str(diff.get("against", "the previous run")), rows)


def _share_chart(t: str, entries: Sequence[EntryLike]) -> str | None:
    """Delegated share per entry for target ``t`` (None when no entry has one)."""
    with_share = [e for e in entries if t in e.targets]
    shares = [e.targets[t].delegated_share for e in with_share]
    if all(s is None for s in shares):
        return None
    return bar_chart(
        [e.name for e in with_share],
        [
            BarSeries("delegated", DELEGATED_COLOR, tuple(None if s is None else 100 * s for s in shares)),
            BarSeries(
                "not delegated",
                NOT_DELEGATED_COLOR,
                tuple(None if s is None else 100 * (1 - s) for s in shares),
            ),
        ],
        title=f"{runtime_label(t)}: share of nodes delegated, per entry",
        x_label="nodes (% of the entry's program)",
        stacked=True,
        x_max=100.0,
        value_format=lambda v: f"{format_number(v, 3)}%",
    )


def _snr_chart(targets: Sequence[str], entries: Sequence[EntryLike]) -> str | None:
    series = []
    for t in targets:
        values = tuple(
            None if (r := e.targets.get(t)) is None or r.parity is None else r.parity.snr_db for e in entries
        )
        if any(v is not None for v in values):
            series.append(DotSeries(runtime_label(t), runtime_color(t), values))
    if not series:
        return None
    return dot_plot(
        [e.name for e in entries],
        series,
        title="Parity per entry: SNR of the worst output vs eager (higher is closer)",
        x_label="SNR (dB)",
        value_format=lambda v: f"{format_number(v, 4)} dB",
    )


def _charts(entries: Sequence[EntryLike]) -> tuple[str, ...]:
    ordered = sorted(entries, key=lambda e: e.name)
    targets = _targets_of(entries)
    charts = [_share_chart(t, ordered) for t in targets] + [_snr_chart(targets, ordered)]
    return tuple(c for c in charts if c is not None)


# ----------------------------------------------------------------------------- the page
def batch_page(batch: BatchLike, *, out_dir: str | pathlib.Path | None = None) -> BatchPage:
    """The page's content, every chart drawn (see ``render_batch_page``)."""
    folder = None if out_dir is None else pathlib.Path(out_dir)
    diff = batch.diff
    regressed = {
        str(c.get("name"))
        for c in ((diff or {}).get("changes") or ())
        if isinstance(c, Mapping) and c.get("kind") == "regression"
    }
    entries = sorted(
        batch.entries,
        key=lambda e: (0 if e.name in regressed else 1 if e.status != "passed" else 2, e.name),
    )
    cols = _columns(entries, regressed, folder)
    top, bottom = _headers(cols) if entries else ((), ())
    return BatchPage(
        verdict=Badge("pass", "PASS") if batch.ok else Badge("fail", "FAIL"),
        summary=_summary(batch),
        changes=None if diff is None else _changes(diff),
        header_top=top,
        header_bottom=bottom,
        rows=tuple(Row(tuple(c.cell(e) for c in cols), e.name in regressed) for e in entries),
        charts=_charts(entries) if entries else (),
        versions=tuple(batch.versions.items()),
    )


def render_batch_page(batch: BatchLike, *, out_dir: str | pathlib.Path | None = None) -> str:
    """The batch page: summary, changes since the compared run (regressions first), one row per
    entry (failures and regressions first, then by name), charts across the batch, versions.

    ``out_dir``: the folder the page is written to; entries' report links are relative to it,
    and with it a link whose page is absent is marked missing instead of linking nowhere."""
    return render("batch.html", page=batch_page(batch, out_dir=out_dir))


def write_batch_page(path: str | pathlib.Path, batch: BatchLike) -> pathlib.Path:
    """Write the page atomically next to the entries' folders (links are relative to it)."""
    path = pathlib.Path(path)
    atomic_write_text(path, render_batch_page(batch, out_dir=path.parent))
    return path
