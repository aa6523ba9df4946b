"""The batch page (``batch.html``): how a whole manifest of models went, one row per entry.

Why it reads the record structurally (the ``*Like`` protocols) instead of importing
``dualexport.fleet``: the fleet sits above the reports in the import layers, and it is the fleet
that calls this page. Why the table is pre-sorted and the script optional: the page must read the
same with scripts off (failures and regressions on top); the small inline script only re-sorts
rows by a clicked header, using each cell's ``data-sort``, and loads nothing.
"""

from __future__ import annotations

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
from ._html import esc, fmt_value, page, pill, sort_key_number, versions_table

__all__ = ["render_batch_page", "write_batch_page", "BatchLike", "EntryLike", "TargetLike"]

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


# ----------------------------------------------------------------------------- table columns
@dataclass(frozen=True)
class _Cell:
    html: str
    sort: str
    cls: str = ""
    title: str = ""

    def td(self) -> str:
        cls = f" class='{self.cls}'" if self.cls else ""
        tip = f" title='{esc(self.title)}'" if self.title else ""
        return f"<td data-sort='{esc(self.sort)}'{cls}{tip}>{self.html}</td>"


@dataclass(frozen=True)
class _Column:
    group: str | None  # a header over several columns (a target); None: the column stands alone
    header: str
    cell: Callable[[EntryLike], _Cell]
    tip: str = ""
    color: str = ""


def _status_rank(status: str) -> int:
    return _STATUS_ORDER.index(status) if status in _STATUS_ORDER else len(_STATUS_ORDER)


def _num_cell(v: float | None, text: str | None = None, cls: str = "num") -> _Cell:
    return _Cell(esc(text if text is not None else format_number(v)), sort_key_number(v), cls)


def _targets_of(entries: Sequence[EntryLike]) -> list[str]:
    names = {t for e in entries for t in e.targets}
    return [t for t in _TARGET_ORDER if t in names] + sorted(names - set(_TARGET_ORDER))


def _export_cell(t: str) -> Callable[[EntryLike], _Cell]:
    def cell(e: EntryLike) -> _Cell:
        r = e.targets.get(t)
        if r is None:
            return _Cell("<span class='small'>\u2014</span>", "")
        if r.ok:
            how = r.outcome or "exported"
            return _Cell(pill("pass", "\u2713 " + how), f"0 {how}", title=f"{format_number(r.seconds, 3)} s")
        kind = r.error_type or "failed"
        return _Cell(pill("fail", "\u2717 " + kind), f"1 {kind}", title=r.error or kind)

    return cell


def _size_cell(t: str) -> Callable[[EntryLike], _Cell]:
    def cell(e: EntryLike) -> _Cell:
        r = e.targets.get(t)
        if r is None or not r.files:
            return _num_cell(None, "\u2014")
        n = sum(f.bytes for f in r.files)
        return _Cell(f"{n / 1e6:.2f}", str(n), "num", f"{n} bytes in {len(r.files)} file(s)")

    return cell


def _share_cell(t: str) -> Callable[[EntryLike], _Cell]:
    def cell(e: EntryLike) -> _Cell:
        r = e.targets.get(t)
        share = None if r is None else r.delegated_share
        if share is None:
            return _num_cell(None, "\u2014")
        return _Cell(f"{100 * share:.1f}", sort_key_number(share), "num" + ("" if share >= 1 else " warn"))

    return cell


def _subgraphs_cell(t: str) -> Callable[[EntryLike], _Cell]:
    def cell(e: EntryLike) -> _Cell:
        r = e.targets.get(t)
        n = None if r is None else r.subgraphs
        return _num_cell(None if n is None else float(n), "\u2014" if n is None else str(n))

    return cell


def _parity_cell(t: str, what: str) -> Callable[[EntryLike], _Cell]:
    def cell(e: EntryLike) -> _Cell:
        r = e.targets.get(t)
        p = None if r is None else r.parity
        if p is None:
            return _num_cell(None, "\u2014")
        v = p.snr_db if what == "snr" else p.max_abs
        tip = (
            f"{'ok' if p.ok else 'out of tolerance'}: SNR {format_number(p.snr_db, 4)} dB, max_abs "
            f"{format_number(p.max_abs)}, cosine {format_number(p.cosine, 6)}, mismatch {p.mismatch_pct:.2f}%"
        )
        text = format_number(v, 4 if what == "snr" else 3) + ("" if p.ok else " \u2717")
        return _Cell(esc(text), sort_key_number(v), "num " + ("good" if p.ok else "bad"), tip)

    return cell


def _columns(
    entries: Sequence[EntryLike], regressed: set[str], out_dir: pathlib.Path | None
) -> list[_Column]:
    def name(e: EntryLike) -> _Cell:
        text = esc(e.name)
        if e.report:
            missing = out_dir is not None and not (out_dir / e.report).is_file()
            if missing:
                text += " <small>(report missing)</small>"
            else:
                text = f"<a href='{esc(urllib.parse.quote(e.report))}'>{text}</a>"
        if e.line is not None:
            text += f" <small>line {e.line}</small>"
        return _Cell(text, e.name.lower())

    def status(e: EntryLike) -> _Cell:
        text = pill(e.status)
        if e.name in regressed:
            text += " " + pill("regression")
        if e.vacuous:
            text += " <small title='no output to compare'>vacuous</small>"
        return _Cell(text, f"{_status_rank(e.status)}{0 if e.name in regressed else 1}")

    def seconds(e: EntryLike) -> _Cell:
        v = e.phases.get("export", e.seconds)
        tip = ", ".join(f"{k} {x:.2f} s" for k, x in e.phases.items()) + f"; entry total {e.seconds:.2f} s"
        return _Cell(f"{v:.1f}", sort_key_number(v), "num", tip)

    def rss(e: EntryLike) -> _Cell:
        tip = f"admission estimate {format_number(e.estimate_mb)} MB" if e.estimate_mb is not None else ""
        v = e.peak_rss_mb
        return _Cell("\u2014" if v is None else f"{v:.0f}", sort_key_number(v), "num", tip)

    def attempts(e: EntryLike) -> _Cell:
        return _Cell(str(e.attempts), str(e.attempts), "num" + (" warn" if e.attempts > 1 else ""))

    def reason(e: EntryLike) -> _Cell:
        text = e.reason or ""
        if not text:
            return _Cell("", "")
        short = text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 1] + "\u2026"
        return _Cell(esc(short), text.lower(), "reason", text)

    cols = [_Column(None, "entry", name), _Column(None, "status", status, "worst first")]
    for t in _targets_of(entries):
        group, color = runtime_label(t), runtime_color(t)
        cols.append(
            _Column(group, "export", _export_cell(t), "lowered, reused or patched; or why it failed", color)
        )
        cols.append(_Column(group, "MB", _size_cell(t), "size of the target's files", color))
        if any((r := e.targets.get(t)) is not None and r.delegated_share is not None for e in entries):
            cols.append(_Column(group, "delegated %", _share_cell(t), "share of nodes delegated", color))
            cols.append(_Column(group, "subgraphs", _subgraphs_cell(t), "delegated subgraphs", color))
        if any((r := e.targets.get(t)) is not None and r.parity is not None for e in entries):
            cols.append(_Column(group, "SNR dB", _parity_cell(t, "snr"), "worst output vs eager", color))
            cols.append(
                _Column(group, "max |err|", _parity_cell(t, "max_abs"), "worst output vs eager", color)
            )
    cols.append(_Column(None, "export s", seconds, "export phase (tooltip: every phase)"))
    cols.append(_Column(None, "peak RSS MB", rss, "the worker's peak resident memory"))
    cols.append(_Column(None, "attempts", attempts))
    cols.append(_Column(None, "reason", reason, "why the entry did not pass"))
    return cols


def _table(entries: Sequence[EntryLike], cols: list[_Column], regressed: set[str]) -> str:
    top, bottom = [], []
    i = 0
    while i < len(cols):
        c = cols[i]
        if c.group is None:
            top.append(f"<th rowspan='2' data-col='{i}' title='{esc(c.tip)}'>{esc(c.header)}</th>")
            i += 1
            continue
        j = i
        while j < len(cols) and cols[j].group == c.group:
            bottom.append(f"<th data-col='{j}' title='{esc(cols[j].tip)}'>{esc(cols[j].header)}</th>")
            j += 1
        top.append(f"<th colspan='{j - i}' style='border-top:4px solid {esc(c.color)}'>{esc(c.group)}</th>")
        i = j
    rows = []
    for e in entries:
        cls = " class='regressed'" if e.name in regressed else ""
        rows.append(f"<tr{cls}>" + "".join(c.cell(e).td() for c in cols) + "</tr>")
    return (
        "<div class='scroll'><table id='entries'><thead><tr>"
        + "".join(top)
        + "</tr><tr>"
        + "".join(bottom)
        + "</tr></thead><tbody>\n"
        + "\n".join(rows)
        + "\n</tbody></table></div>"
    )


# ----------------------------------------------------------------------------- sections
def _summary(batch: BatchLike) -> list[str]:
    n = len(batch.entries)
    verdict = "PASS" if batch.ok else "FAIL"
    counts = (
        " ".join(pill(s, f"{s} {k}") for s, k in batch.counts().items()) or "<span class='small'>none</span>"
    )
    rate = f"{n / (batch.seconds / 60):.1f} entries/minute" if batch.seconds > 0 and n else "n/a"
    engine = batch.engine + (f" at {batch.address}" if batch.address else "")
    rows = [
        ("entries", f"{n}: {counts}"),
        (
            "manifest",
            f"<code>{esc(batch.manifest)}</code> <small>sha256 {esc(batch.manifest_sha256[:16])}</small>",
        ),
        ("engine", esc(engine)),
        ("workers", esc(batch.workers)),
        ("memory budget", "none" if batch.memory_budget_mb is None else f"{batch.memory_budget_mb:.0f} MB"),
        ("started", esc(batch.started)),
        ("wall time", f"{batch.seconds:.1f} s"),
        ("throughput", esc(rate)),
    ]
    return [
        f"<h1>dualexport batch {pill(verdict.lower(), verdict)}</h1>",
        "<table class='kv'>" + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows) + "</table>",
    ]


def _changes(diff: Mapping[str, Any]) -> list[str]:
    changes = [c for c in (diff.get("changes") or ()) if isinstance(c, Mapping)]

    def rank(c: Mapping[str, Any]) -> int:
        kind = str(c.get("kind", ""))
        return _KIND_ORDER.index(kind) if kind in _KIND_ORDER else len(_KIND_ORDER)

    changes.sort(key=rank)  # stable: within a kind, the order the diff gave
    parts = [f"<h2>Changes since {esc(diff.get('against', 'the previous run'))}</h2>"]
    if not changes:
        return [*parts, "<p>no change</p>"]
    parts.append(
        "<table id='changes'><tr><th>entry</th><th>change</th><th>field</th><th>before</th><th>after</th></tr>"
    )
    for c in changes:
        before, after = c.get("before"), c.get("after")
        parts.append(
            f"<tr><td>{esc(c.get('name', ''))}</td><td>{pill(str(c.get('kind', 'changed')))}</td>"
            f"<td><code>{esc(c.get('field', ''))}</code></td>"
            f"<td title='{esc(fmt_value(before, 2000))}'>{esc(fmt_value(before))}</td>"
            f"<td title='{esc(fmt_value(after, 2000))}'>{esc(fmt_value(after))}</td></tr>"
        )
    parts.append("</table>")
    return parts


def _plots(entries: Sequence[EntryLike]) -> list[str]:
    ordered = sorted(entries, key=lambda e: e.name)
    parts = ["<h2>Across the batch</h2><div class='plots'>"]
    targets = _targets_of(entries)
    for t in targets:
        with_share = [e for e in ordered if t in e.targets]
        if not any(e.targets[t].delegated_share is not None for e in with_share):
            continue
        shares = [e.targets[t].delegated_share for e in with_share]
        parts.append(
            bar_chart(
                [e.name for e in with_share],
                [
                    BarSeries(
                        "delegated", DELEGATED_COLOR, tuple(None if s is None else 100 * s for s in shares)
                    ),
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
        )
    series = []
    for t in targets:
        values = []
        for e in ordered:
            r = e.targets.get(t)
            values.append(None if r is None or r.parity is None else r.parity.snr_db)
        if any(v is not None for v in values):
            series.append(DotSeries(runtime_label(t), runtime_color(t), tuple(values)))
    if series:
        parts.append(
            dot_plot(
                [e.name for e in ordered],
                series,
                title="Parity per entry: SNR of the worst output vs eager (higher is closer)",
                x_label="SNR (dB)",
                value_format=lambda v: f"{format_number(v, 4)} dB",
            )
        )
    parts.append("</div>")
    return parts


# The only script: re-sorts the entries table by a clicked (or Enter-pressed) header, numerically
# where both cells' data-sort parse as numbers, empty cells last. It loads nothing.
_SORT_SCRIPT = """<script>
for (const th of document.querySelectorAll("#entries th[data-col]")) {
  th.tabIndex = 0; th.style.cursor = "pointer";
  const go = () => {
    const i = +th.dataset.col, body = document.querySelector("#entries tbody");
    const up = th.dataset.dir !== "asc"; th.dataset.dir = up ? "asc" : "desc";
    const key = (r) => r.cells[i].dataset.sort;
    [...body.rows].sort((p, q) => {
      const a = key(p), b = key(q);
      if (a === b) return 0; if (a === "") return 1; if (b === "") return -1;
      const x = parseFloat(a), y = parseFloat(b);
      const c = isNaN(x) || isNaN(y) ? a.localeCompare(b) : x - y;
      return up ? c : -c;
    }).forEach((r) => body.appendChild(r));
  };
  th.onclick = go; th.onkeydown = (ev) => { if (ev.key === "Enter") go(); };
}
</script>
"""

_PAGE_CSS = (
    ".scroll{overflow-x:auto;max-width:100%}"
    "#entries td,#entries th{font-size:12px;padding:2px 5px}#entries td{white-space:nowrap}"
    "#entries td.reason{white-space:normal;overflow-wrap:anywhere;min-width:160px;max-width:280px;color:#7a0000}"
    "#entries tr.regressed td{background:#fff4f4}#entries td.warn{color:#8a4b00}"
    "#entries thead th{background:#f6f6f6}"
)


def render_batch_page(batch: BatchLike, *, out_dir: str | pathlib.Path | None = None) -> str:
    """The batch page: summary, changes since the compared run (regressions first), one row per
    entry (failures and regressions first, then by name), plots across the batch, versions.

    ``out_dir``: the folder the page is written to; entries' report links are relative to it,
    and with it a link whose page is absent is marked missing instead of linking nowhere."""
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
    parts = _summary(batch)
    if diff is not None:
        parts += _changes(diff)
    parts.append("<h2>Entries</h2>")
    if not entries:
        parts.append("<p>no entries in this batch</p>")
    else:
        parts.append(
            "<p class='small'>failures and regressions first; with scripts on, a header sorts by its "
            "column. Hover a cell for details.</p>"
        )
        parts.append(_table(entries, _columns(entries, regressed, folder), regressed))
        parts += _plots(entries)
    parts += ["<h2>Versions</h2>", versions_table(batch.versions)]
    verdict = "PASS" if batch.ok else "FAIL"
    return page(
        f"dualexport batch: {verdict}",
        "\n".join(parts),
        css=_PAGE_CSS,
        script=_SORT_SCRIPT if entries else "",
    )


def write_batch_page(path: str | pathlib.Path, batch: BatchLike) -> pathlib.Path:
    """Write the page atomically next to the entries' folders (links are relative to it)."""
    path = pathlib.Path(path)
    atomic_write_text(path, render_batch_page(batch, out_dir=path.parent))
    return path
