"""ParityReport: per output and runtime, metrics against eager; JSON, Markdown and HTML views."""

from __future__ import annotations

import html
import json
import math
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .metrics import FloatAgreement, Metrics
from .tolerances import Tolerance

__all__ = ["OutputParity", "Divergence", "ParityReport", "REPORT_SCHEMA", "html_table", "NOTEBOOK_STYLE"]

REPORT_SCHEMA = "dualexport.parity/1"


@dataclass(frozen=True)
class OutputParity:
    """One output of one input set (and step): metrics per runtime vs eager, and runtime vs runtime."""

    index: int
    label: str
    shape: tuple[int, ...]
    dtype: str
    metrics: Mapping[str, Metrics]
    tolerance: Mapping[str, Tolerance]
    cross: Metrics | None = None
    histograms: Mapping[str, tuple[tuple[float, ...], tuple[int, ...]]] = field(default_factory=dict)
    #: an int8 program's output against the float model it was quantized from: "eager" (the
    #: quantized reference) and each runtime; informative, not part of ``ok`` (the files are
    #: judged against their own program)
    against_float: Mapping[str, FloatAgreement] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(m.ok for m in self.metrics.values())


@dataclass(frozen=True)
class Divergence:
    """Where a runtime first departs from eager: a node of the shared program."""

    runtime: str
    node: str
    op: str
    source: str | None
    metrics: Metrics
    curve: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ParityReport:
    outputs: tuple[OutputParity, ...]
    runtimes: tuple[str, ...]
    first_divergence: Mapping[str, str | None]
    divergences: Mapping[str, Divergence | None] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    steps: int = 1
    versions: Mapping[str, str] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors and all(o.ok for o in self.outputs)

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "ok": self.ok,
            "versions": dict(self.versions),
            "runtimes": list(self.runtimes),
            "inputs": list(self.inputs),
            "steps": self.steps,
            "errors": dict(self.errors),
            "outputs": [
                {
                    "index": o.index,
                    "label": o.label,
                    "shape": list(o.shape),
                    "dtype": o.dtype,
                    "ok": o.ok,
                    "metrics": {rt: m.to_dict() for rt, m in o.metrics.items()},
                    "tolerance": {
                        rt: {"rtol": t.rtol, "atol": t.atol, "source": t.source}
                        for rt, t in o.tolerance.items()
                    },
                    "cross": o.cross.to_dict() if o.cross else None,
                    "histograms": {
                        rt: {"edges": list(e), "counts": list(c)} for rt, (e, c) in o.histograms.items()
                    },
                    "against_float": {k: a.to_dict() for k, a in o.against_float.items()},
                }
                for o in self.outputs
            ],
            "first_divergence": dict(self.first_divergence),
            "divergences": {
                rt: None
                if d is None
                else {
                    "node": d.node,
                    "op": d.op,
                    "source": d.source,
                    "metrics": d.metrics.to_dict(),
                    "curve": [[n, _num(v)] for n, v in d.curve],
                }
                for rt, d in self.divergences.items()
            },
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    # ------------------------------------------------------------ Markdown
    def to_markdown(self) -> str:
        lines = [f"## Parity: {'PASS' if self.ok else 'FAIL'}", ""]
        lines.append(
            "| output | runtime | max_abs | max_rel | cosine | snr_db | mismatch % | rtol/atol | ok |"
        )
        lines.append("|---|---|---:|---:|---:|---:|---:|---|---|")
        for o in self.outputs:
            for rt, m in o.metrics.items():
                t = o.tolerance[rt]
                lines.append(
                    f"| {o.label} {list(o.shape)} | {rt} | {_fmt(m.max_abs)} | {_fmt(m.max_rel)} | "
                    f"{_fmt(m.cosine, 6)} | {_fmt(m.snr_db, 1)} | {m.mismatch_pct:.2f} | "
                    f"{t.rtol:g}/{t.atol:g} | {'yes' if m.ok else '**no**'} |"
                )
        floats = [(o, k, a) for o in self.outputs for k, a in o.against_float.items()]
        if floats:
            lines += ["", "Against the float model (what quantization costs; not part of the verdict):", ""]
            lines += ["| output | who | cosine | snr_db | top-1 agreement |", "|---|---|---:|---:|---:|"]
            for o, k, a in floats:
                top1 = "" if a.top1 is None else f"{a.top1:.4f}"
                lines.append(f"| {o.label} | {k} | {_fmt(a.cosine, 6)} | {_fmt(a.snr_db, 1)} | {top1} |")
        for rt, err in self.errors.items():
            lines.append(f"\n**{rt} failed to run**: {err}")
        for rt, d in self.divergences.items():
            if d is not None:
                lines.append(
                    f"\n**{rt}: first divergence** at node `{d.node}` ({d.op})"
                    + (f", model line: `{d.source}`" if d.source else "")
                    + f": max_abs {_fmt(d.metrics.max_abs)}, cosine {_fmt(d.metrics.cosine, 6)}"
                )
        if self.versions:
            lines.append("\n" + ", ".join(f"{k} {v}" for k, v in self.versions.items()))
        return "\n".join(lines) + "\n"

    def _repr_html_(self) -> str:
        """The parity table (and any failure or divergence) for a notebook."""
        esc = html.escape
        rows = []
        for o in self.outputs:
            for rt, m in o.metrics.items():
                rows.append(
                    (
                        esc(f"{o.label} {list(o.shape)}"),
                        esc(rt),
                        _fmt(m.max_abs),
                        _fmt(m.max_rel),
                        _fmt(m.cosine, 6),
                        _fmt(m.snr_db, 1),
                        f"{m.mismatch_pct:.2f}",
                        "<span class='good'>yes</span>" if m.ok else "<span class='bad'>no</span>",
                    )
                )
        header = ("output", "runtime", "max_abs", "max_rel", "cosine", "snr_db", "mismatch %", "ok")
        parts = [
            NOTEBOOK_STYLE,
            html_table(f"Parity vs eager: {'PASS' if self.ok else 'FAIL'}", header, rows),
        ]
        for rt, err in self.errors.items():
            parts.append(
                f"<p class='dx'><span class='bad'>{esc(rt)} failed to run</span>: {esc(str(err))}</p>"
            )
        for rt, d in self.divergences.items():
            if d is not None:
                where = f", model line: <code>{esc(d.source)}</code>" if d.source else ""
                parts.append(
                    f"<p class='dx'><span class='bad'>{esc(rt)}: first divergence</span> at node "
                    f"<code>{esc(d.node)}</code> ({esc(d.op)}){where}</p>"
                )
        return "\n".join(parts)

    def save_html(self, path: str | pathlib.Path) -> pathlib.Path:
        from ..outputs.atomic import atomic_write_text
        from .html import render_html

        path = pathlib.Path(path)
        atomic_write_text(path, render_html(self))
        return path


def _num(v: float) -> float | str:
    return v if math.isfinite(v) else ("inf" if v > 0 else "nan")


def _fmt(v: float, digits: int = 3) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if digits >= 6:
        return f"{v:.{digits}f}"
    return f"{v:.{digits}g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"


#: The notebook views' style (``_repr_html_`` here and of ``dx.ExportResult``).
NOTEBOOK_STYLE = (
    "<style>.dx td,.dx th{padding:2px 8px;text-align:right}.dx td:first-child,.dx th:first-child"
    "{text-align:left}.dx .bad{color:#b00020;font-weight:bold}.dx .good{color:#1b7f3b}</style>"
)


def html_table(title: str, header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    """A small HTML table (cells are inserted as given: escape text before)."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class='dx'><caption>{html.escape(title)}</caption><tr>{head}</tr>{body}</table>"
