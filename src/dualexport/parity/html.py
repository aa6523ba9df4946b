"""The parity report as HTML: tables plus inline SVG plots (no script, no network).

Why a section renderer apart from the page: the export page (``dualexport.reporting``) shows the
same parity section beside the weights and the delegation, and must not draw it differently.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from ..charts import (
    DotSeries,
    HistogramSeries,
    LineMark,
    LineSeries,
    dot_plot,
    format_number,
    histogram,
    line_chart,
    runtime_color,
    runtime_label,
)

if TYPE_CHECKING:
    from .report import ParityReport

__all__ = ["render_html", "render_parity_section", "PARITY_CSS"]

#: the classes the section uses; a page that embeds the section includes them in its <style>
PARITY_CSS = (
    "table{border-collapse:collapse;margin:6px 0 14px}"
    "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}"
    ".bad{color:#b00;font-weight:bold}.good{color:#186a1b}"
    ".plots{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}"
    ".note{color:#555;font-size:12px}"
)


def _metrics_table(report: ParityReport) -> list[str]:
    parts = [
        "<table><tr><th>output</th><th>runtime</th><th>max_abs</th><th>max_rel</th><th>cosine</th>"
        "<th>snr_db</th><th>mismatch %</th><th>rtol/atol</th><th>ok</th></tr>"
    ]
    for o in report.outputs:
        for rt, m in o.metrics.items():
            t = o.tolerance[rt]
            parts.append(
                f"<tr><td>{html.escape(o.label)} {list(o.shape)}</td><td>{html.escape(runtime_label(rt))}</td>"
                f"<td class='num'>{format_number(m.max_abs)}</td><td class='num'>{format_number(m.max_rel)}</td>"
                f"<td class='num'>{m.cosine:.6f}</td><td class='num'>{format_number(m.snr_db, 4)}</td>"
                f"<td class='num'>{m.mismatch_pct:.2f}</td><td>{t.rtol:g}/{t.atol:g}</td>"
                f"<td class='{'good' if m.ok else 'bad'}'>{'yes' if m.ok else 'no'}</td></tr>"
            )
    parts.append("</table>")
    return parts


def _snr_overview(report: ParityReport) -> str:
    """SNR per output and runtime on one axis: the worst output of a many-output model stands
    out at a glance (an exact match is +inf and sits on the right edge)."""
    labels = [f"{o.label} {list(o.shape)}" for o in report.outputs]
    series = [
        DotSeries(
            runtime_label(rt),
            runtime_color(rt),
            tuple(o.metrics[rt].snr_db if rt in o.metrics else None for o in report.outputs),
        )
        for rt in report.runtimes
        if any(rt in o.metrics for o in report.outputs)
    ]
    return dot_plot(
        labels,
        series,
        title="Signal-to-noise ratio vs eager, per output (higher is closer)",
        x_label="SNR (dB)",
        value_format=lambda v: f"{format_number(v, 4)} dB",
    )


def _histograms(report: ParityReport) -> list[str]:
    parts = []
    for o in report.outputs:
        series = [
            HistogramSeries(runtime_label(rt), runtime_color(rt), tuple(edges), tuple(counts))
            for rt, (edges, counts) in o.histograms.items()
        ]
        if series:
            parts.append(
                histogram(
                    series,
                    title=f"{o.label} {list(o.shape)}: error per element vs eager",
                    x_label="|runtime \u2212 eager| (log scale; exact matches at 1e-12)",
                    y_label="elements (count)",
                    x_log10=True,
                )
            )
    return parts


def _divergence(report: ParityReport, h: str) -> list[str]:
    found = {rt: d for rt, d in report.divergences.items() if d is not None}
    if not found:
        return []
    parts = [f"<{h}>Per-layer error and first divergence</{h}>"]
    for rt, d in found.items():
        where = f" \u2014 model line <code>{html.escape(d.source)}</code>" if d.source else ""
        parts.append(
            f"<p><b>{html.escape(runtime_label(rt))}</b>: first divergence at <code>{html.escape(d.node)}</code> "
            f"({html.escape(d.op)}){where}: "
            f"max_abs {format_number(d.metrics.max_abs)}, cosine {d.metrics.cosine:.6f}</p>"
        )
    series = [LineSeries(runtime_label(rt), runtime_color(rt), tuple(d.curve)) for rt, d in found.items()]
    marks = [
        LineMark(d.node, f"first divergence: {d.node} ({rt})", runtime_color(rt)) for rt, d in found.items()
    ]
    parts.append(
        line_chart(
            series,
            title="Max |error| per node of the shared program vs eager",
            x_label="node # of the shared program (program order)",
            y_label="max |error| (log scale)",
            marks=marks,
        )
    )
    return parts


def render_parity_section(report: ParityReport, *, level: int = 2) -> str:
    """The parity check as an HTML fragment: verdict, metrics table, SNR overview, error
    histograms, the per-node error curve when a runtime diverged, and runtime failures.
    ``level``: the heading level of its title (sub-headings are one below)."""
    h, sub = f"h{level}", f"h{min(level + 1, 6)}"
    verdict = "PASS" if report.ok else "FAIL"
    parts = [
        f"<{h}>Parity vs eager: <span class='{'good' if report.ok else 'bad'}'>{verdict}</span></{h}>",
        f"<p class='note'>input sets: {html.escape(', '.join(report.inputs) or 'example')}"
        + (f"; steps: {report.steps}" if report.steps > 1 else "")
        + "</p>",
    ]
    parts += _metrics_table(report)
    for rt, err in report.errors.items():
        parts.append(f"<p class='bad'>{html.escape(runtime_label(rt))} failed to run: {html.escape(err)}</p>")
    if report.outputs:
        parts.append(f"<{sub}>Error distribution</{sub}><div class='plots'>")
        parts.append(_snr_overview(report))
        parts += _histograms(report)
        parts.append("</div>")
    parts += _divergence(report, sub)
    return "\n".join(parts)


def render_html(report: ParityReport) -> str:
    """A page of its own for ``ParityReport.save_html`` (``dualexport compare --html``)."""
    status = "PASS" if report.ok else "FAIL"
    return "\n".join(
        [
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>dualexport parity report: {status}</title>",
            f"<style>body{{font-family:sans-serif;margin:24px;color:#222}}{PARITY_CSS}</style></head><body>",
            f"<h1>dualexport parity report: <span class='{'good' if report.ok else 'bad'}'>{status}</span></h1>",
            render_parity_section(report, level=2),
            "<p class='note'>"
            + html.escape(", ".join(f"{k} {v}" for k, v in report.versions.items()))
            + "</p>",
            "</body></html>",
        ]
    )
