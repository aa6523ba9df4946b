"""The export page and the batch page: what they say (structure) and what they show (a headless
Chromium screenshot with the runtime and delegation colours).

One ConvBN export serves every export-page case (exports take seconds on 2 cores); the parity
failure is made afterwards by tampering with the ONNX file, as tests/test_html_report.py does.
"""

from __future__ import annotations

import math
import pathlib
import re
from typing import Any

import numpy as np
import onnx
import pytest
import torch

import dualexport as dx
from chromium import CHROMIUM, count_color, hex_rgb, screenshot
from dualexport.api import ExportResult
from dualexport.charts import (
    DELEGATED_COLOR,
    ONNX_COLOR,
    XNNPACK_COLOR,
    BarSeries,
    DotSeries,
    HistogramSeries,
    LineMark,
    LineSeries,
    bar_chart,
    dot_plot,
    histogram,
    line_chart,
)
from dualexport.errors import XnnpackLoweringError
from dualexport.fleet.record import BatchRecord, EntryRecord, FileRecord, ParitySummary, TargetRecord
from dualexport.parity.html import render_html
from dualexport.parity.report import ParityReport
from dualexport.reporting import render_batch_page, render_export_page, write_batch_page, write_export_page
from models import ConvBN

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is absent from this machine (.ci/run installs it)"
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExportResult, ParityReport, ParityReport]:
    """(result, passing report, failing report): the failing one after bn.weight[1] += 0.3 in the ONNX file."""
    out = tmp_path_factory.mktemp("reporting") / "out"
    res = dx.export(ConvBN(), (torch.randn(1, 3, 8, 8),), out_dir=out, name="cb")
    good = dx.compare(res)
    model = onnx.load(str(res.artifacts["onnx"].path), load_external_data=False)
    init = next(i for i in model.graph.initializer if i.name == "bn.weight")
    arr = np.frombuffer(init.raw_data, dtype=np.float32).copy()
    arr[1] += 0.3
    init.raw_data = arr.tobytes()
    onnx.save(model, str(res.artifacts["onnx"].path))
    bad = dx.compare(res)
    assert good.ok and not bad.ok and bad.first_divergence["onnx"] == "batch_norm"
    return res, good, bad


def _section(text: str, heading: str) -> str:
    """The HTML from the <h2> whose text starts with ``heading`` to the next <h2>."""
    start = text.index(f"<h2>{heading}")
    end = text.find("<h2>", start + 4)
    return text[start : end if end >= 0 else len(text)]


# ----------------------------------------------------------------------------- export page
def test_export_page_holds_every_section(exported: tuple[ExportResult, ParityReport, ParityReport]) -> None:
    res, good, _ = exported
    path = write_export_page(
        res.out_dir / "cb.report.html", res, good, seconds={"verify": 1.25, "compare": 0.5}
    )
    text = path.read_text()
    assert text == render_export_page(res, good, seconds={"verify": 1.25, "compare": 0.5})
    # self-contained: no script, no stylesheet or image fetched (a captured warning's text may
    # quote a URL: this file's first export in a fresh process captures the imports' warnings)
    assert "<script" not in text
    assert not re.search(r"(src|href)=['\"]?(https?:|//)|url\((?!#)|@import|<link", text)
    assert re.search(r"<h1>dualexport: cb <span class='pill ok'>PASS", text)
    # targets: verdict and how each file was made
    targets = _section(text, "Targets")
    assert targets.count("PASS") >= 4 and "lowered from the shared program" in targets and "opset" in targets
    # files with sizes
    files = _section(text, "Files")
    for f in ("cb.onnx", "cb.onnx.data", "cb.pte", "cb.weights.json"):
        assert f"<code>{f}</code>" in files
    assert re.search(r"\d+(\.\d)? (B|KB)", files)
    # delegation: one table row per op, and the stacked chart with its legend
    deleg = _section(text, "Delegation")
    rep = res.artifacts["xnnpack"].delegation
    assert rep is not None
    for op, (d, nd) in rep.by_op.items():
        bad = " bad" if nd else ""
        assert (
            f"<tr><td><code>{op}</code></td><td class='num'>{d}</td><td class='num{bad}'>{nd}</td></tr>"
            in deleg
        )
    assert "delegated vs not delegated" in deleg and ">not delegated<" in deleg and DELEGATED_COLOR in deleg
    assert "nodes (count)" in deleg
    # weights: every manifest entry, with its per-target status
    weights = _section(text, "Weights")
    for e in res.manifest.entries:
        assert f"<code>{e.name}</code>" in weights
    assert ">transformed<" in weights and ">not_stored<" in weights and ">exact<" in weights
    assert "permute" in weights  # the tooltip says what was checked
    # parity: table, SNR overview and a histogram per output with axes, counts and a legend
    parity = _section(text, "Parity vs eager")
    assert "<svg" in parity and parity.count('role="img"') == 1 + len(good.outputs)
    assert "elements (count) (log scale)" in parity and "|runtime \u2212 eager|" in parity
    assert ">ONNX (ONNX Runtime)<" in parity and ">XNNPACK (ExecuTorch)<" in parity
    assert ">1e-12<" in parity and ">1e0<" in parity  # decade ticks on the error axis
    assert ONNX_COLOR in parity and XNNPACK_COLOR in parity
    assert "first divergence" not in parity.lower()
    # timings (export phases and the extra ones) and versions
    timings = _section(text, "Timings")
    for phase in ("capture", "onnx", "xnnpack", "total", "verify", "compare"):
        assert f"<td>{phase}</td>" in timings
    versions = _section(text, "Versions")
    assert "torch" in versions and "executorch" in versions and "onnxruntime" in versions
    # every chart is accessible, and its marks carry their values as tooltips
    svgs = re.findall(r"<svg.*?</svg>", text, flags=re.S)
    assert len(svgs) == 2 + len(good.outputs)  # delegation bars, SNR dots, a histogram per output
    for svg in svgs:
        assert re.match(r'<svg class="chart" [^>]*role="img" aria-label="[^"]+"><title>[^<]+</title>', svg)
        # a mark drawn alone has its <title> first in its group; marks drawn as one artist
        # (the SNR dots) have one per <use>
        alone = re.findall(r'<g id="c[0-9a-f]{8}-\d+"><title>[^<]+</title>', svg)
        together = re.findall(r"<use [^>]*><title>[^<]+</title></use>", svg)
        assert len(alone) + len(together) > 0
    for op, (d, _) in rep.by_op.items():
        if d:
            assert f"<title>{op} \u2014 delegated: {d}</title>" in deleg
    for runtime in ("ONNX (ONNX Runtime)", "XNNPACK (ExecuTorch)"):  # its SNR dot, with its value
        assert re.search(f"<title>[^<]* \u2014 {re.escape(runtime)}: [^<]+ dB[^<]*</title>", parity)


def test_export_page_without_report_and_with_failed_target(
    exported: tuple[ExportResult, ParityReport, ParityReport],
) -> None:
    res, _, _ = exported
    text = render_export_page(res)
    assert "not checked" in text and "(parity not checked)" in text and "<script" not in text
    text = render_export_page(_failed(res))
    assert "<span class='pill bad'>FAIL</span>" in text
    errors = _section(text, "Errors")
    assert "XnnpackLoweringError" in errors and "&lt;on purpose&gt;" in errors and "try &amp; see" in errors
    assert "<h2>Delegation" not in text  # the failed target published nothing


@needs_chromium
def test_export_page_with_divergence_renders(
    exported: tuple[ExportResult, ParityReport, ParityReport], tmp_path: pathlib.Path
) -> None:
    res, _, bad = exported
    html = write_export_page(tmp_path / "cb.report.html", res, bad)
    text = html.read_text()
    parity = _section(text, "Parity vs eager")
    assert "FAIL" in parity and "Per-layer error and first divergence" in parity
    assert "batch_norm" in parity and "max |error| (log scale)" in parity
    assert "node # of the shared program" in parity and "first divergence: batch_norm (onnx)" in parity
    png = tmp_path / "shot.png"
    screenshot(html, png, tmp_path / "profile", size=(1280, 4200))
    assert count_color(png, hex_rgb(ONNX_COLOR)) > 200  # histogram bars, SNR dot, error curve
    assert count_color(png, hex_rgb(XNNPACK_COLOR)) > 200  # histogram bars, SNR dot
    assert count_color(png, hex_rgb(DELEGATED_COLOR)) > 200  # delegated nodes per op


def _sections(text: str) -> dict[str, str]:
    """Heading text (markup removed) -> the HTML from that <h1>..<h3> to the next one."""
    marks = list(re.finditer(r"<h([1-3])>(.*?)</h\1>", text, flags=re.S))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return {
        re.sub(r"<[^>]+>", "", m.group(2)).strip(): text[m.start() : end]
        for m, end in zip(marks, ends, strict=True)
    }


def _chart_titles(text: str) -> list[str]:
    return re.findall(r'<svg class="chart" [^>]*aria-label="([^"]*)"', text)


def test_every_page_shows_its_sections_and_charts(
    exported: tuple[ExportResult, ParityReport, ParityReport],
) -> None:
    """Each page (export, parity, batch) has every section title it had before the pages moved
    to templates, and each of its charts: the charts a section draws sit inside that section."""
    res, _, bad = exported
    pages = {
        "export": (
            render_export_page(res, bad, seconds={"verify": 1.0}),
            {
                "Targets": [],
                "Files": [],
                "Delegation: XNNPACK (ExecuTorch)": ["Nodes per op: delegated vs not delegated"],
                "Weights": [],
                "Parity vs eager: FAIL": [],
                "Error distribution": ["Signal-to-noise ratio vs eager", "error per element vs eager"],
                "Per-layer error and first divergence": ["Max |error| per node of the shared program"],
                "Timings": [],
                "Versions": [],
            },
        ),
        "parity": (
            render_html(bad),
            {
                "Parity vs eager: FAIL": [],
                "Error distribution": ["Signal-to-noise ratio vs eager", "error per element vs eager"],
                "Per-layer error and first divergence": ["Max |error| per node of the shared program"],
            },
        ),
        "batch": (
            render_batch_page(_batch(_DIFF)),
            {
                "Changes since runs/previous/batch.json": [],
                "Entries": [],
                "Across the batch": ["share of nodes delegated, per entry", "Parity per entry: SNR"],
                "Versions": [],
            },
        ),
    }
    for name, (text, expected) in pages.items():
        sections = _sections(text)
        assert next(iter(sections)).startswith("dualexport"), name
        assert _chart_titles(text), f"the {name} page has no chart"
        for heading, charts in expected.items():
            assert heading in sections, f"{name} page: no section {heading!r} in {list(sections)}"
            for chart in charts:
                drawn = _chart_titles(sections[heading])
                assert any(chart in t for t in drawn), f"{name}: {chart!r} not under {heading!r}: {drawn}"
        # self-contained: nothing fetched from anywhere
        assert not re.search(r"(src|href)=['\"]?(https?:|//)|url\((?!#)|@import|<link", text), name
    assert "Errors" in _sections(render_export_page(_failed(res)))


def _failed(res: ExportResult) -> ExportResult:
    """``res`` as if XNNPACK had failed to lower."""
    err = XnnpackLoweringError("lowering failed <on purpose>", target="xnnpack", hint="try & see")
    return ExportResult(
        res.program,
        {"onnx": res.artifacts["onnx"]},
        {"xnnpack": err},
        res.manifest,
        res.out_dir,
        res.name,
        res.seconds,
    )


_DRAW_ELSEWHERE = """
import sys, dualexport, dualexport.charts, dualexport.pages
light = not any(m in sys.modules for m in ("matplotlib", "jinja2", "torch"))
import matplotlib
def stored():  # the values as stored: reading "backend" the usual way would resolve (and set) it
    return {k: dict.__getitem__(matplotlib.rcParams, k) for k in dict.keys(matplotlib.rcParams)}
before = stored()
from dualexport.charts import LineMark, LineSeries, line_chart
svg = line_chart([LineSeries("a", "#1f77b4", (("x", 1e-3), ("y", 0.5)))], title="t", x_label="x",
                 y_label="y", marks=[LineMark("y", "here")])
print(light, "matplotlib.pyplot" not in sys.modules, stored() == before)
sys.stdout.write(svg)
"""


def test_charts_are_deterministic_and_leave_matplotlib_alone() -> None:
    """The same chart gives the same bytes in another process (ids hashed from a fixed salt, no
    date); ``import dualexport`` loads neither matplotlib nor Jinja2; drawing neither imports
    pyplot nor changes the user's rcParams (the backend among them)."""
    import subprocess
    import sys

    here = line_chart(
        [LineSeries("a", "#1f77b4", (("x", 1e-3), ("y", 0.5)))],
        title="t",
        x_label="x",
        y_label="y",
        marks=[LineMark("y", "here")],
    )
    out = subprocess.run(
        [sys.executable, "-c", _DRAW_ELSEWHERE], capture_output=True, text=True, check=True, timeout=300
    ).stdout
    flags, there = out.split("\n", 1)
    assert flags.split() == ["True", "True", "True"], "light import, no pyplot, rcParams kept: " + flags
    assert there == here
    assert "<metadata" not in here and "Date" not in here


# ----------------------------------------------------------------------------- batch page
def _target(target: str, ok: bool = True, **kw: Any) -> TargetRecord:
    files = (FileRecord(f"m.{'onnx' if target == 'onnx' else 'pte'}", 2_500_000, "0" * 64),) if ok else ()
    return TargetRecord(target, ok, outcome="lowered" if ok else None, seconds=3.0, files=files, **kw)


def _parity(snr: float, ok: bool = True) -> ParitySummary:
    return ParitySummary(ok, 1e-6 if ok else 0.4, snr, 0.999999, 0.0 if ok else 12.5)


def _batch(diff: dict[str, Any] | None) -> BatchRecord:
    long_reason = "timed out after 600 s <while lowering> " + "x" * 300
    entries = (
        EntryRecord(
            "resnet_tiny",
            "passed",
            line=3,
            folder="resnet_tiny",
            report="resnet_tiny/resnet_tiny.report.html",
            targets={
                "onnx": _target("onnx", parity=_parity(math.inf)),
                "xnnpack": _target("xnnpack", delegated_share=0.9, subgraphs=2, parity=_parity(96.5)),
            },
            weights_ok=True,
            parity_ok=True,
            seconds=12.0,
            phases={"load": 1.0, "export": 9.5, "compare": 1.5},
            peak_rss_mb=812.0,
            estimate_mb=900.0,
        ),
        EntryRecord(
            "mlp",
            "failed",
            line=1,
            reason="xnnpack: XnnpackLoweringError: op aten.foo not supported",
            folder="mlp",
            report="mlp/mlp.report.html",
            targets={
                "onnx": _target("onnx", parity=_parity(18.0, ok=False)),
                "xnnpack": _target(
                    "xnnpack", ok=False, error="op aten.foo not supported", error_type="XnnpackLoweringError"
                ),
            },
            seconds=7.0,
            phases={"export": 6.0},
            peak_rss_mb=640.0,
        ),
        EntryRecord("bert_small", "timeout", line=2, reason=long_reason, seconds=600.0, attempts=2),
        EntryRecord("broken", "invalid", line=4, reason="manifest line 4: unknown key 'modle'"),
    )
    return BatchRecord(
        entries,
        "zoo.toml",
        "a" * 64,
        "local",
        2,
        "2025-01-01T00:00:00Z",
        630.0,
        versions={"torch": "2.13.0", "executorch": "1.4.1"},
        diff=diff,
    )


_DIFF = {
    "against": "runs/previous/batch.json",
    "changes": [
        {"name": "resnet_tiny", "kind": "improvement", "field": "seconds", "before": 20.0, "after": 12.0},
        {"name": "broken", "kind": "new", "field": "status", "before": None, "after": "invalid"},
        {"name": "mlp", "kind": "regression", "field": "status", "before": "passed", "after": "failed"},
    ],
}


def test_batch_page_structure(tmp_path: pathlib.Path) -> None:
    batch = _batch(_DIFF)
    for e in batch.entries:
        if e.report:
            (tmp_path / e.report).parent.mkdir(parents=True)
            (tmp_path / e.report).write_text("<html></html>")
    text = write_batch_page(tmp_path / "batch.html", batch).read_text()
    # summary
    assert "<span class='pill bad'>FAIL</span>" in text and "entries/minute" in text and "local" in text
    assert ">passed 1<" in text and ">failed 1<" in text and ">timeout 1<" in text and ">invalid 1<" in text
    # changes: the regression first
    changes = _section(text, "Changes since")
    assert "runs/previous/batch.json" in changes
    assert changes.index(">regression<") < changes.index(">improvement<") < changes.index(">new<")
    # one row per entry, regression first, then the other failures by name, passed last
    table = text[
        text.index("<table id='entries'>") : text.index("</table>", text.index("<table id='entries'>"))
    ]
    body = table[table.index("<tbody>") :]
    rows = re.findall(r"<tr.*?</tr>", body, flags=re.S)
    assert len(rows) == len(batch.entries)
    names = [re.search(r"data-sort='([^']*)'", r).group(1) for r in rows]  # type: ignore[union-attr]
    assert names == ["mlp", "bert_small", "broken", "resnet_tiny"]
    assert "class='regressed'" in rows[0]
    # links to the entries' pages; every cell carries its sort key, numbers as numbers
    assert "<a href='mlp/mlp.report.html'>mlp</a>" in body
    assert "<a href='resnet_tiny/resnet_tiny.report.html'>resnet_tiny</a>" in body
    assert body.count("<td") == body.count("<td data-sort=")
    assert "data-sort='Infinity'" in body and "data-sort='0.9'" in body and "data-sort='2500000'" in body
    assert "\u2713 lowered" in body and "\u2717 XnnpackLoweringError" in body
    # the long reason: escaped, cut, and whole in the tooltip
    assert re.search(
        r"title='timed out after 600 s &lt;while lowering&gt; x{300}'>timed out after 600 s "
        r"&lt;while lowering&gt; x+\u2026</td>",
        body,
    )
    # plots across the batch
    plots = _section(text, "Across the batch")
    assert "share of nodes delegated, per entry" in plots and "SNR of the worst output" in plots
    assert ONNX_COLOR in plots and XNNPACK_COLOR in plots and DELEGATED_COLOR in plots
    assert "beyond the axis" in plots  # resnet_tiny's ONNX SNR is inf: clipped and marked
    assert "torch" in _section(text, "Versions")
    # the only script: small, inline, loads nothing
    scripts = re.findall(r"<script>(.*?)</script>", text, flags=re.S)
    assert len(scripts) == 1 and len(scripts[0]) < 1200 and "http" not in text and "src=" not in text


def test_batch_page_edge_cases(tmp_path: pathlib.Path) -> None:
    plain = render_batch_page(_batch(None))
    assert "Changes since" not in plain and "<table id='entries'>" in plain
    # rendered without a folder, links are not checked; written, a missing page is said so
    assert "<a href='mlp/mlp.report.html'>" in plain
    written = write_batch_page(tmp_path / "batch.html", _batch(None)).read_text()
    assert "(report missing)" in written and "<a href=" not in written
    empty = BatchRecord(
        (), "empty.toml", "b" * 64, "ray", 4, "2025-01-01T00:00:00Z", 0.0, address="127.0.0.1:6379"
    )
    text = render_batch_page(empty)
    assert "no entries in this batch" in text and "<script" not in text and "127.0.0.1:6379" in text
    nodiff = render_batch_page(_batch({"against": "old.json", "changes": []}))
    assert "no change" in nodiff


@needs_chromium
def test_batch_page_renders(tmp_path: pathlib.Path) -> None:
    html = write_batch_page(tmp_path / "batch.html", _batch(_DIFF))
    png = tmp_path / "shot.png"
    screenshot(html, png, tmp_path / "profile", size=(1400, 1600))
    assert count_color(png, hex_rgb(ONNX_COLOR)) > 40  # SNR dots and the ONNX header rule
    assert count_color(png, hex_rgb(XNNPACK_COLOR)) > 40
    assert count_color(png, hex_rgb(DELEGATED_COLOR)) > 200  # delegation share bars


# ----------------------------------------------------------------------------- charts
def test_charts_survive_non_finite_values_and_escape_text() -> None:
    nasty = "<b>&\"'"
    svgs = [
        histogram(
            [HistogramSeries(nasty, "#123456", (0.0, 1.0, 2.0), (3.0, math.nan))],
            title=nasty,
            x_label=nasty,
        ),
        histogram([HistogramSeries("bad edges", "#123456", (0.0, math.inf), (1.0,))], title="t", x_label="x"),
        bar_chart([nasty, "b"], [BarSeries(nasty, "#123456", (math.inf, None))], title=nasty, x_label="x"),
        line_chart(
            [LineSeries(nasty, "#123456", (("a", 0.0), ("b", math.nan), ("c", 1e-3)))],
            title="t",
            x_label="x",
            y_label="y",
        ),
        dot_plot(
            [nasty],
            [DotSeries(nasty, "#123456", (math.nan,)), DotSeries("b", "#654321", (-math.inf,))],
            title="t",
            x_label="x",
        ),
        dot_plot([], [], title="empty", x_label="x"),
    ]
    for svg in svgs:
        assert svg.startswith("<svg") and 'role="img"' in svg and "aria-label=" in svg
        assert "<b>" not in svg and "nan" not in re.sub(r"<title>.*?</title>|>[^<]*<", "", svg)
    assert "1 non-finite count(s) drawn as 0" in svgs[0]
    assert "no data (bad edges)" in svgs[1]
    assert "clipped" in svgs[2] and ">n/a<" in svgs[2]
    assert "non-finite (drawn at the top edge)" in svgs[3] and "drawn at the floor" in svgs[3]
    assert "not a number" in svgs[4] and "no data" in svgs[5]
