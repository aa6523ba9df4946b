"""A single-file HTML report: tables plus inline SVG plots (no scripts, no network)."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .report import ParityReport

__all__ = ["render_html"]

_COLORS = {"onnx": "#1f77b4", "xnnpack": "#d62728"}


def _bars(edges: tuple[float, ...], counts: tuple[int, ...], color: str, title: str) -> str:
    w, h, pad = 360, 160, 30
    if not counts:
        return ""
    top = max(counts) or 1
    bw = (w - 2 * pad) / len(counts)
    rects = []
    for i, c in enumerate(counts):
        bh = (h - 2 * pad) * (math.log10(c + 1) / math.log10(top + 1))
        rects.append(
            f'<rect x="{pad + i * bw:.1f}" y="{h - pad - bh:.1f}" width="{bw - 1:.1f}" '
            f'height="{bh:.1f}" fill="{color}"><title>10^{edges[i]:.1f}..10^{edges[i + 1]:.1f}: {c}</title></rect>'
        )
    return (
        f'<svg width="{w}" height="{h}" role="img" aria-label="{html.escape(title)}">'
        f'<text x="{pad}" y="14" font-size="12">{html.escape(title)}</text>'
        + "".join(rects)
        + f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#333"/>'
        f'<text x="{pad}" y="{h - 8}" font-size="10">1e{edges[0]:.0f}</text>'
        f'<text x="{w - pad - 30}" y="{h - 8}" font-size="10">1e{edges[-1]:.0f}</text>'
        f'<text x="{w / 2 - 40}" y="{h - 8}" font-size="10">|error| (log10)</text></svg>'
    )


def _curve(points: list[tuple[str, float]], color: str, title: str) -> str:
    w, h, pad = 720, 200, 36
    if not points:
        return ""
    vals = [math.log10(max(v, 1e-12)) if math.isfinite(v) else 3.0 for _, v in points]
    lo, hi = min(vals + [-12.0]), max(vals + [0.0])
    span = (hi - lo) or 1.0
    n = len(vals)
    xs = [pad + (w - 2 * pad) * (i / max(n - 1, 1)) for i in range(n)]
    ys = [h - pad - (h - 2 * pad) * ((v - lo) / span) for v in vals]
    path = " ".join(
        f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(zip(xs, ys, strict=True))
    )
    dots = "".join(
        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}"><title>{html.escape(name)}: {v:.3g}</title></circle>'
        for (name, v), x, y in zip(points, xs, ys, strict=True)
    )
    return (
        f'<svg width="{w}" height="{h}" role="img" aria-label="{html.escape(title)}">'
        f'<text x="{pad}" y="14" font-size="12">{html.escape(title)}</text>'
        f'<path d="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>{dots}'
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#333"/>'
        f'<text x="4" y="{pad}" font-size="10">1e{hi:.0f}</text><text x="4" y="{h - pad}" font-size="10">1e{lo:.0f}</text>'
        f'<text x="{w / 2 - 60}" y="{h - 8}" font-size="10">nodes of the shared program (in order)</text></svg>'
    )


def render_html(report: ParityReport) -> str:
    status = "PASS" if report.ok else "FAIL"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>dualexport parity report</title>",
        "<style>body{font-family:sans-serif;margin:24px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}.bad{color:#b00;font-weight:bold}"
        ".plots{display:flex;flex-wrap:wrap;gap:12px}</style></head><body>",
        f"<h1>dualexport parity report: <span class='{'bad' if not report.ok else ''}'>{status}</span></h1>",
        "<table><tr><th>output</th><th>runtime</th><th>max_abs</th><th>max_rel</th><th>cosine</th>"
        "<th>snr_db</th><th>mismatch %</th><th>rtol/atol</th><th>ok</th></tr>",
    ]
    for o in report.outputs:
        for rt, m in o.metrics.items():
            t = o.tolerance[rt]
            parts.append(
                f"<tr><td>{html.escape(o.label)} {list(o.shape)}</td><td>{rt}</td><td>{m.max_abs:.3g}</td>"
                f"<td>{m.max_rel:.3g}</td><td>{m.cosine:.6f}</td><td>{m.snr_db:.1f}</td>"
                f"<td>{m.mismatch_pct:.2f}</td><td>{t.rtol:g}/{t.atol:g}</td>"
                f"<td class='{'' if m.ok else 'bad'}'>{'yes' if m.ok else 'no'}</td></tr>"
            )
    parts.append("</table><h2>Error histograms</h2><div class='plots'>")
    for o in report.outputs:
        for rt, (edges, counts) in o.histograms.items():
            parts.append(_bars(edges, counts, _COLORS.get(rt, "#555"), f"{o.label}: {rt} vs eager"))
    parts.append("</div>")
    if any(d is not None for d in report.divergences.values()):
        parts.append("<h2>Per-layer error</h2>")
    for rt, d in report.divergences.items():
        if d is None:
            continue
        parts.append(
            f"<p><b>{rt}</b>: first divergence at <code>{html.escape(d.node)}</code> "
            f"({html.escape(d.op)}){' — ' + html.escape(d.source) if d.source else ''}</p>"
        )
        parts.append(_curve(list(d.curve), _COLORS.get(rt, "#555"), f"{rt}: max |error| per node vs eager"))
    for rt, err in report.errors.items():
        parts.append(f"<p class='bad'>{rt} failed: {html.escape(err)}</p>")
    parts.append(
        "<p style='color:#666;font-size:12px'>"
        + html.escape(", ".join(f"{k} {v}" for k, v in report.versions.items()))
        + "</p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)
