"""One self-contained HTML page per export: what was made, how, and what was proved about it.

Why one page: the verdict per target, the files, XNNPACK's delegation, the weight manifest and the
parity check used to live in separate files (``.weights.json``, ``.parity.html``, log lines); a
reviewer deciding whether to ship a model needs them side by side. The page has no script and
loads nothing: it reads the same from a CI artifact, an e-mail attachment or a file browser.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .._versions import library_versions
from ..charts import (
    DELEGATED_COLOR,
    NOT_DELEGATED_COLOR,
    BarSeries,
    bar_chart,
    format_number,
    runtime_color,
    runtime_label,
)
from ..outputs import atomic_write_text
from ..parity.html import render_parity_section
from ..weights.manifest import FAILING_STATUSES
from ._html import esc, human_bytes, page, pill, versions_table

if TYPE_CHECKING:
    from ..api import Artifact, ExportResult
    from ..exporters import DelegationReport
    from ..parity.report import ParityReport
    from ..weights import WeightManifest
    from ..weights.manifest import WeightLocation

__all__ = ["render_export_page", "write_export_page"]

_TARGET_ORDER = ("onnx", "xnnpack")
#: a manifest this long starts folded (the summary line above it still gives the counts)
_FOLD_WEIGHTS_OVER = 60


def _targets(res: ExportResult) -> list[str]:
    names = set(res.artifacts) | set(res.errors)
    return [t for t in _TARGET_ORDER if t in names] + sorted(names - set(_TARGET_ORDER))


def _how_made(art: Artifact) -> str:
    """The outcome in words: lowered now, reused from the cache, or patched weights-only."""
    d = art.details
    strategy = d.get("strategy")
    if strategy == "lowered":
        text = "lowered from the shared program"
        if d.get("forked"):
            text += " in a forked worker"
        if d.get("opset"):
            text += f" (ONNX opset {d['opset']})"
        return text
    if strategy == "reused":
        key = str(d.get("cache_key") or "")
        return "reused from the previous export (cache hit" + (f", key {key[:12]}\u2026)" if key else ")")
    if strategy == "patched":
        return f"weights patched into copies of the previous files ({d.get('patched', 0)} tensor(s))"
    return "unknown"


def _proof(art: Artifact) -> str:
    proof = art.details.get("proof")
    if proof is None:
        return "\u2014"
    ranges = str(getattr(proof, "ranges", ""))
    edges = tuple(getattr(proof, "edges", ()))
    return esc(ranges) + (f"; ran from disk at {esc(', '.join(edges))}" if edges else "")


def _size(path: pathlib.Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _weights_verdict(manifest: WeightManifest, target: str) -> str:
    counts = manifest.counts(target)
    if not counts:
        return "<span class='small'>no entries</span>"
    bad = any(s in FAILING_STATUSES for s in counts)
    text = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return (
        pill("fail" if bad else "pass", "FAIL" if bad else "PASS")
        + f" <span class='small'>{esc(text)}</span>"
    )


def _passed(res: ExportResult, report: ParityReport | None) -> bool:
    """Every target exported, every weight where it belongs, and parity held (when checked)."""
    return res.ok and not res.manifest.problems() and (report is None or report.ok)


def _header(res: ExportResult, report: ParityReport | None) -> list[str]:
    problems = res.manifest.problems()
    ok = _passed(res, report)
    verdict = "PASS" if ok else "FAIL"
    note = " (parity not checked)" if report is None and ok else ""
    parts = [
        f"<h1>dualexport: {esc(res.name)} {pill(verdict.lower(), verdict)}"
        f"<span class='small'>{esc(note)}</span></h1>",
        f"<p class='small'>output folder: <code>{esc(res.out_dir)}</code></p>",
        "<h2>Targets</h2>",
        "<table><tr><th>target</th><th>export</th><th>how the file was made</th><th>proved from the file</th>"
        "<th>weights</th><th>parity</th><th>seconds</th></tr>",
    ]
    for t in _targets(res):
        swatch = f"<span style='color:{runtime_color(t)}'>\u25a0</span> "
        label = swatch + esc(runtime_label(t))
        if t in res.errors:
            err = res.errors[t]
            parts.append(
                f"<tr><td>{label}</td><td>{pill('fail', 'FAIL')}</td>"
                f"<td colspan='5'>{esc(type(err).__name__)}: {esc(err.message)}</td></tr>"
            )
            continue
        art = res.artifacts[t]
        if report is None or t not in report.runtimes:
            parity = pill("not checked")
        elif t in report.errors:
            parity = pill("fail", "FAIL", title=report.errors[t])
        else:
            t_ok = all(o.metrics[t].ok for o in report.outputs if t in o.metrics)
            parity = pill("pass" if t_ok else "fail", "PASS" if t_ok else "FAIL")
        parts.append(
            f"<tr><td>{label}</td><td>{pill('pass', 'PASS')}</td><td>{esc(_how_made(art))}</td>"
            f"<td>{_proof(art)}</td><td>{_weights_verdict(res.manifest, t)}</td><td>{parity}</td>"
            f"<td class='num'>{art.seconds:.2f}</td></tr>"
        )
    parts.append("</table>")
    for p in problems:
        parts.append(f"<div class='err'>{esc(p)}</div>")
    return parts


def _errors(res: ExportResult) -> list[str]:
    if not res.errors:
        return []
    parts = ["<h2>Errors</h2>"]
    for t, err in res.errors.items():
        parts.append(
            f"<div class='err'><b>{esc(runtime_label(t))}</b> \u2014 {esc(type(err).__name__)} "
            f"(phase: {esc(err.phase)}{', internal' if err.internal else ''})"
            f"<pre>{esc(err.message)}</pre>"
            + (f"<b>What to try:</b> {esc(err.hint)}" if err.hint else "")
            + "</div>"
        )
    return parts


def _files(res: ExportResult) -> list[str]:
    rows = []
    total = 0
    for t in _targets(res):
        art = res.artifacts.get(t)
        for f in art.files if art is not None else ():
            n = _size(f)
            total += n or 0
            rows.append(
                f"<tr><td><code>{esc(f.name)}</code></td><td>{esc(t)}</td>"
                f"<td class='num' title='{n if n is not None else 'missing'} bytes'>{human_bytes(n)}</td></tr>"
            )
    manifest = res.out_dir / f"{res.name}.weights.json"
    if manifest.is_file():
        n = _size(manifest)
        rows.append(
            f"<tr><td><code>{esc(manifest.name)}</code></td><td>weight manifest</td>"
            f"<td class='num'>{human_bytes(n)}</td></tr>"
        )
    if not rows:
        return ["<h2>Files</h2><p>no file was published</p>"]
    return [
        "<h2>Files</h2><table><tr><th>file</th><th>of</th><th>size</th></tr>",
        *rows,
        f"<tr><td colspan='2'><b>artifacts in total</b></td><td class='num'>{human_bytes(total)}</td></tr></table>",
    ]


def _delegation(t: str, rep: DelegationReport) -> list[str]:
    ops = list(rep.by_op)
    parts = [
        f"<h2>Delegation: {esc(runtime_label(t))}</h2>",
        f"<p>{rep.subgraphs} delegated subgraph(s); {rep.delegated_nodes} node(s) delegated, "
        f"{rep.non_delegated_nodes} left to the portable runtime: "
        f"<b>{100 * rep.delegated_share:.1f}%</b> of the compute ops delegated "
        "(getitem, alloc and size reads are listed, not counted).</p>",
        "<div class='plots'><table><tr><th>op</th><th>delegated</th><th>not delegated</th></tr>",
    ]
    for op, (d, nd) in rep.by_op.items():
        parts.append(
            f"<tr><td><code>{esc(op)}</code></td><td class='num'>{d}</td>"
            f"<td class='num{' bad' if nd else ''}'>{nd}</td></tr>"
        )
    parts.append("</table>")
    parts.append(
        bar_chart(
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
    )
    parts.append("</div>")
    return parts


def _location_cell(loc: WeightLocation | None) -> str:
    if loc is None:
        return "<td class='small'>\u2014</td>"
    detail = loc.where or loc.reason or ""
    tip = "; ".join(str(x) for x in (loc.where, loc.reason, loc.checked) if x)
    short = detail if len(detail) <= 90 else detail[:89] + "\u2026"
    return f"<td title='{esc(tip)}'>{pill(loc.status)}<br><small>{esc(short)}</small></td>"


def _weights(res: ExportResult) -> list[str]:
    m = res.manifest
    targets = [t for t in _targets(res) if any(t in e.locations for e in m.entries)]
    summary = "; ".join(
        f"{runtime_label(t)}: " + ", ".join(f"{n} {s}" for s, n in sorted(m.counts(t).items()))
        for t in targets
    )
    open_ = " open" if len(m.entries) <= _FOLD_WEIGHTS_OVER or m.problems() else ""
    parts = [
        "<h2>Weights</h2>",
        f"<p>{len(m.entries)} entr{'y' if len(m.entries) == 1 else 'ies'} of the state_dict (tied names "
        f"listed once). {esc(summary)}</p>",
        f"<details{open_}><summary>the manifest, entry by entry</summary>",
        "<table><tr><th>entry</th><th>kind</th><th>dtype</th><th>shape</th><th>bytes</th>"
        + "".join(f"<th>{esc(runtime_label(t))}</th>" for t in targets)
        + "</tr>",
    ]
    for e in m.entries:
        aliases = f"<br><small>also: {esc(', '.join(e.aliases))}</small>" if e.aliases else ""
        parts.append(
            f"<tr><td><code>{esc(e.name)}</code>{aliases}</td><td>{esc(e.kind)}</td><td>{esc(e.dtype)}</td>"
            f"<td>{esc(list(e.shape))}</td><td class='num'>{e.nbytes}</td>"
            + "".join(_location_cell(e.locations.get(t)) for t in targets)
            + "</tr>"
        )
    parts.append("</table></details>")
    return parts


def _timings(res: ExportResult, extra: Mapping[str, float] | None) -> list[str]:
    rows = [(k, v, "export") for k, v in res.seconds.items()]
    rows += [(k, v, "after the export") for k, v in (extra or {}).items()]
    if not rows:
        return []
    body = "".join(
        f"<tr><td>{esc(k)}</td><td class='num'>{format_number(float(v), 4)}</td><td class='small'>{esc(w)}</td></tr>"
        for k, v, w in rows
    )
    return [
        "<h2>Timings</h2><p class='small'>the targets lower side by side, so their phases overlap "
        "and add up to more than the total</p>",
        f"<table><tr><th>phase</th><th>seconds</th><th>when</th></tr>{body}</table>",
    ]


def render_export_page(
    res: ExportResult, report: ParityReport | None = None, *, seconds: Mapping[str, float] | None = None
) -> str:
    """The page for one export: verdict per target and how its file was made, errors, files,
    delegation, weight manifest, parity (``report``; says so when absent), timings per phase
    (``seconds`` adds phases run after the export, e.g. verify and compare) and versions."""
    parts = _header(res, report)
    parts += _errors(res)
    parts += _files(res)
    for t in _targets(res):
        art = res.artifacts.get(t)
        if art is not None and art.delegation is not None:
            parts += _delegation(t, art.delegation)
    parts += _weights(res)
    if report is not None:
        parts.append(render_parity_section(report, level=2))
    else:
        parts.append(
            "<h2>Parity vs eager</h2><p>not checked: run <code>dx.compare(res)</code> and pass its report</p>"
        )
    parts += _timings(res, seconds)
    versions = (
        dict(report.versions) if report is not None and report.versions else dict(res.manifest.versions)
    )
    parts += ["<h2>Versions</h2>", versions_table(versions or library_versions())]
    messages = getattr(res, "library_messages", ())
    if messages:  # the libraries' warnings and log lines, kept off the terminal (dualexport._quiet)
        items = "".join(f"<li><code>{esc(m)}</code></li>" for m in messages)
        parts.append(
            f"<details><summary>{len(messages)} library message(s)</summary><ul>{items}</ul></details>"
        )
    verdict = "PASS" if _passed(res, report) else "FAIL"
    return page(f"dualexport {res.name}: {verdict}", "\n".join(parts))


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
