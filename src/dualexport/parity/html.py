"""The parity report as HTML: its section (tables and charts) and a page of its own.

Why the section is a record apart from the page: the export page (``dualexport.reporting``) shows
the same parity section beside the weights and the delegation, and must not draw it differently;
both fill the template ``_parity.html`` from ``parity_section(report)``.
"""

from __future__ import annotations

from dataclasses import dataclass
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
from ..pages import render

if TYPE_CHECKING:
    from .report import ParityReport

__all__ = [
    "ParitySection",
    "MetricRow",
    "FloatRow",
    "RuntimeFailure",
    "DivergenceNote",
    "parity_section",
    "render_parity_section",
    "render_html",
]


@dataclass(frozen=True)
class MetricRow:
    """One output of one runtime against eager."""

    output: str
    runtime: str
    max_abs: float
    max_rel: float
    cosine: float
    snr_db: float
    mismatch_pct: float
    tolerance: str
    ok: bool


@dataclass(frozen=True)
class FloatRow:
    """One output of the quantized reference or a runtime against the float model."""

    output: str
    who: str
    cosine: float
    snr_db: float
    top1: float | None


@dataclass(frozen=True)
class RuntimeFailure:
    runtime: str
    message: str


@dataclass(frozen=True)
class DivergenceNote:
    """Where a runtime first departs from eager, in words."""

    runtime: str
    node: str
    op: str
    source: str | None
    max_abs: float
    cosine: float


@dataclass(frozen=True)
class ParitySection:
    """What the parity section shows; ``charts``: the SNR overview and a histogram per output,
    ``divergence_chart``: the per-node error curve (when a runtime diverged)."""

    ok: bool
    inputs: str
    steps: int
    rows: tuple[MetricRow, ...]
    failures: tuple[RuntimeFailure, ...]
    charts: tuple[str, ...]
    divergences: tuple[DivergenceNote, ...]
    divergence_chart: str
    float_rows: tuple[FloatRow, ...] = ()

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else "FAIL"


def _output_label(label: str, shape: tuple[int, ...]) -> str:
    return f"{label} {list(shape)}"


def _rows(report: ParityReport) -> tuple[MetricRow, ...]:
    return tuple(
        MetricRow(
            _output_label(o.label, o.shape),
            runtime_label(rt),
            m.max_abs,
            m.max_rel,
            m.cosine,
            m.snr_db,
            m.mismatch_pct,
            f"{o.tolerance[rt].rtol:g}/{o.tolerance[rt].atol:g}",
            m.ok,
        )
        for o in report.outputs
        for rt, m in o.metrics.items()
    )


def _float_rows(report: ParityReport) -> tuple[FloatRow, ...]:
    return tuple(
        FloatRow(
            _output_label(o.label, o.shape),
            "eager (int8 reference)" if who == "eager" else runtime_label(who),
            a.cosine,
            a.snr_db,
            a.top1,
        )
        for o in report.outputs
        for who, a in o.against_float.items()
    )


def _snr_overview(report: ParityReport) -> str:
    """SNR per output and runtime on one axis: the worst output of a many-output model stands
    out at a glance (an exact match is +inf and sits on the right edge)."""
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
        [_output_label(o.label, o.shape) for o in report.outputs],
        series,
        title="Signal-to-noise ratio vs eager, per output (higher is closer)",
        x_label="SNR (dB)",
        value_format=lambda v: f"{format_number(v, 4)} dB",
    )


def _histograms(report: ParityReport) -> list[str]:
    charts = []
    for o in report.outputs:
        series = [
            HistogramSeries(runtime_label(rt), runtime_color(rt), tuple(edges), tuple(counts))
            for rt, (edges, counts) in o.histograms.items()
        ]
        if series:
            charts.append(
                histogram(
                    series,
                    title=f"{_output_label(o.label, o.shape)}: error per element vs eager",
                    x_label="|runtime \u2212 eager| (log scale; exact matches at 1e-12)",
                    y_label="elements (count)",
                    x_log10=True,
                )
            )
    return charts


def _divergence_chart(report: ParityReport) -> str:
    found = {rt: d for rt, d in report.divergences.items() if d is not None}
    if not found:
        return ""
    return line_chart(
        [LineSeries(runtime_label(rt), runtime_color(rt), tuple(d.curve)) for rt, d in found.items()],
        title="Max |error| per node of the shared program vs eager",
        x_label="node # of the shared program (program order)",
        y_label="max |error| (log scale)",
        marks=[
            LineMark(d.node, f"first divergence: {d.node} ({rt})", runtime_color(rt))
            for rt, d in found.items()
        ],
    )


def parity_section(report: ParityReport) -> ParitySection:
    """The section's content: every chart drawn, every number kept as a number."""
    return ParitySection(
        ok=report.ok,
        inputs=", ".join(report.inputs) or "example",
        steps=report.steps,
        rows=_rows(report),
        failures=tuple(RuntimeFailure(runtime_label(rt), err) for rt, err in report.errors.items()),
        charts=(_snr_overview(report), *_histograms(report)) if report.outputs else (),
        divergences=tuple(
            DivergenceNote(runtime_label(rt), d.node, d.op, d.source, d.metrics.max_abs, d.metrics.cosine)
            for rt, d in report.divergences.items()
            if d is not None
        ),
        divergence_chart=_divergence_chart(report),
        float_rows=_float_rows(report),
    )


def render_parity_section(report: ParityReport, *, level: int = 2) -> str:
    """The parity check as an HTML fragment (its title at heading ``level``, sub-headings one
    below), for a page that embeds it."""
    return render("parity_section.html", p=parity_section(report), level=level)


def render_html(report: ParityReport) -> str:
    """A page of its own for ``ParityReport.save_html`` (``dualexport compare --html``)."""
    return render("parity.html", p=parity_section(report), versions=tuple(report.versions.items()))
