"""Rich tables for the terminal: the delegation table, the weight manifest and the parity table;
the same summary as text (``str(res)``) and as HTML tables for a notebook (``_repr_html_``).

Shared by the CLI, ``make demo`` and the result types (nothing imports the CLI module itself).
"""

from __future__ import annotations

import html
import io
import sys
from typing import Any

__all__ = [
    "console",
    "print_export",
    "print_delegation",
    "print_weights",
    "print_parity",
    "summary_text",
    "export_result_html",
]

_WEIGHT_COLUMNS = ("exact", "transformed", "not_stored", "missing", "mismatch")


def console():
    from rich.console import Console

    return Console(stderr=False, highlight=False, width=None if sys.stdout.isatty() else 120)


def print_export(console: Any, res: Any, check: Any | None = None, error: Exception | None = None) -> None:
    """What the CLI prints after an export: each file, each failed target, the delegation table
    and the weight manifest (with the weight check when one ran)."""
    for t, art in res.artifacts.items():
        console.print(f"[green]{t}[/]: {art.path} ({art.seconds:.1f} s)")
    for t, err in res.errors.items():
        console.print(f"[bold red]{t} failed[/]: ", end="")
        console.print(str(err), markup=False)
    print_delegation(console, res)
    print_weights(console, res.manifest, check, error)


def summary_text(res: Any, report: Any | None = None) -> str:
    """``print_export`` (and the parity table with ``report``) as plain text: ``str(res)``."""
    from rich.console import Console

    buf = io.StringIO()
    out = Console(file=buf, width=120, color_system=None, highlight=False, force_terminal=False)
    print_export(out, res)
    if report is not None:
        print_parity(out, report)
    return buf.getvalue().rstrip("\n")


def print_delegation(console: Any, res: Any) -> None:
    from rich.table import Table

    art = res.artifacts.get("xnnpack")
    if art is None or art.delegation is None:
        return
    d = art.delegation
    console.print(f"XNNPACK delegation: {d.summary}; every node of the program:")
    t = Table()
    t.add_column("op_type")
    t.add_column("delegated", justify="right")
    t.add_column("non-delegated", justify="right")
    for op, (dn, nd) in d.by_op.items():
        t.add_row(op, str(dn), str(nd))
    console.print(t)


def print_weights(console: Any, manifest: Any, check: Any | None, error: Exception | None) -> None:
    from rich.table import Table

    t = Table(title="Weight manifest (from the files on disk)")
    t.add_column("target")
    for col in _WEIGHT_COLUMNS:
        t.add_column(col, justify="right")
    for target in manifest.artifacts:
        c = manifest.counts(target)
        t.add_row(target, *(str(c.get(k, 0)) for k in _WEIGHT_COLUMNS))
    console.print(t)
    if error is not None:
        console.print(f"[bold red]weight check FAILED[/]: {error}")
    elif check is not None:
        console.print(
            f"[green]weight check passed[/]: {check.entries} entries; bit-exact "
            + ", ".join(f"{k} {v}" for k, v in check.exact.items())
        )


def print_parity(console: Any, report: Any) -> None:
    from rich.table import Table

    t = Table(title=f"Parity vs eager: {'PASS' if report.ok else 'FAIL'}")
    for col in ("output", "runtime", "max_abs", "max_rel", "cosine", "snr_db", "mismatch %", "ok"):
        t.add_column(col, justify="right" if col not in ("output", "runtime") else "left")
    for o in report.outputs:
        for rt, m in o.metrics.items():
            t.add_row(
                f"{o.label} {list(o.shape)}",
                rt,
                f"{m.max_abs:.3g}",
                f"{m.max_rel:.3g}",
                f"{m.cosine:.6f}",
                f"{m.snr_db:.1f}",
                f"{m.mismatch_pct:.2f}",
                "yes" if m.ok else "[red]no[/]",
            )
    console.print(t)
    for rt, err in report.errors.items():
        console.print(f"[red]{rt} failed to run[/]: {err}")
    for rt, d in report.divergences.items():
        if d is not None:
            console.print(
                f"[red]{rt}: first divergence[/] at node {d.node} ({d.op})"
                + (f" — {d.source}" if d.source else "")
            )


# ------------------------------------------------------------------------------ notebooks
def export_result_html(res: Any) -> str:
    """An export result as HTML tables (files, failures, delegation, weight manifest), for
    Jupyter's ``_repr_html_``."""
    from .parity.report import NOTEBOOK_STYLE as _STYLE
    from .parity.report import html_table as _table

    esc = html.escape
    verdict = "<span class='good'>ok</span>" if res.ok else "<span class='bad'>target(s) failed</span>"
    parts = [
        _STYLE,
        f"<div class='dx'><b>dualexport {esc(res.name)}</b> in <code>{esc(str(res.out_dir))}</code>: {verdict}",
    ]
    rows = [
        (
            esc(t),
            f"<code>{esc(art.path.name)}</code>",
            f"{art.seconds:.1f}",
            esc(type(art.outcome).__name__ if art.outcome else ""),
        )
        for t, art in res.artifacts.items()
    ]
    rows += [
        (esc(t), "<span class='bad'>failed</span>", "", esc(str(err).splitlines()[0]))
        for t, err in res.errors.items()
    ]
    parts.append(_table("Targets", ("target", "file", "seconds", "made by"), rows))
    art = res.artifacts.get("xnnpack")
    d = None if art is None else art.delegation
    if d is not None:
        parts.append(
            _table(
                f"XNNPACK delegation: {d.summary}",
                ("op_type", "delegated", "non-delegated"),
                [
                    (f"<code>{esc(op)}</code>", dn, f"<span class='bad'>{nd}</span>" if nd else nd)
                    for op, (dn, nd) in d.by_op.items()
                ],
            )
        )
    rows = []
    for target in res.manifest.artifacts:
        c = res.manifest.counts(target)
        rows.append((esc(target), *(c.get(k, 0) for k in _WEIGHT_COLUMNS)))
    parts.append(_table("Weight manifest (from the files on disk)", ("target", *_WEIGHT_COLUMNS), rows))
    return "\n".join(parts) + "</div>"


class StageProgress:
    """An export's live progress: a row per stage as it starts (a spinner and the elapsed time),
    ticked off with its seconds and the process tree's peak memory as it ends
    (``dualexport._stages``), so that a long export never looks hung. On a terminal that is not
    interactive (a CI log) each stage is one line as it ends."""

    def __init__(self, console: Any, title: str) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console
        self.title = title
        self.live = bool(getattr(console, "is_terminal", False))
        self.progress = Progress(
            SpinnerColumn(finished_text="[green]done[/]"),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[peak]}", style="dim"),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, Any] = {}
        self._listening: Any = None

    def __enter__(self) -> StageProgress:
        from ._stages import listening

        self.console.print(self.title)
        if self.live:
            self.progress.__enter__()
        self._listening = listening(self)
        self._listening.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listening.__exit__(*exc)
        if self.live:
            self.progress.__exit__(*exc)  # type: ignore[arg-type]

    def __call__(self, name: str, timing: Any) -> None:
        peak = "" if timing is None or not timing.peak_mb else f"peak {timing.peak_mb / 1024:.2f} GB"
        if not self.live:
            if timing is not None:
                self.console.print(f"  {name}: {timing.seconds:.1f} s{', ' + peak if peak else ''}")
            return
        if timing is None:
            self.tasks[name] = self.progress.add_task(name, total=1, peak="")
            return
        task = self.tasks.pop(name, None)
        if task is None:
            task = self.progress.add_task(name, total=1, peak="")
        self.progress.update(task, completed=1, peak=peak)
        self.progress.stop_task(task)


def print_timings(console: Any, timings: Any) -> None:
    """Each stage of an export: wall seconds and the peak memory of the process tree."""
    from rich.table import Table

    if not timings:
        return
    table = Table(title="where the time and memory went")
    for col in ("stage", "seconds", "peak memory (GB)"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for t in timings:
        table.add_row(t.name, f"{t.seconds:.1f}", f"{t.peak_mb / 1024:.2f}" if t.peak_mb else "-")
    console.print(table)


class BatchProgress:
    """A batch's live progress: a bar of entries done, how many run and failed, the elapsed time
    and the ETA, and the phase each running entry is in. Callable with each ``BatchEvent``."""

    def __init__(self, console: Any) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("running {task.fields[running]}  failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}"),
            TextColumn("{task.fields[phases]}", style="dim"),
            console=console,
            transient=False,
        )
        self.task: Any = None
        self.phases: dict[str, str] = {}

    def __enter__(self) -> BatchProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)  # type: ignore[arg-type]

    def __call__(self, event: Any) -> None:
        if self.task is None:
            self.task = self.progress.add_task(
                "entries", total=event.total, running=0, failed=0, eta="-", phases=""
            )
        if event.kind == "done":
            self.phases.pop(event.name, None)
            rec = event.record
            if rec is not None and not rec.passed:
                self.progress.console.print(f"[red]{event.name}: {rec.status}[/] {rec.reason or ''}"[:300])
        else:
            self.phases[event.name] = event.phase or event.kind
        eta = event.eta
        self.progress.update(
            self.task,
            completed=event.done,
            running=event.running,
            failed=event.failed,
            eta="-" if eta is None else f"{eta:.0f}s",
            phases=", ".join(f"{n}: {p}" for n, p in list(self.phases.items())[:4]),
        )


_STATUS_STYLE = {"passed": "green", "check_failed": "yellow"}


def print_batch(console: Any, record: Any, out_dir: Any) -> None:
    """The batch's table (one row per entry) and, with ``--compare-to``, what changed."""
    from rich.table import Table

    diff = record.diff
    if diff is not None and diff.get("changes"):
        t = Table(title=f"Changes since {diff.get('against', 'the earlier run')} (regressions first)")
        for col in ("entry", "kind", "what", "before", "after"):
            t.add_column(col)
        for c in diff["changes"]:
            style = "red" if c["kind"] == "regression" else ("green" if c["kind"] == "improvement" else "")
            t.add_row(
                c["name"],
                f"[{style}]{c['kind']}[/]" if style else c["kind"],
                c["field"],
                str(c["before"]),
                str(c["after"]),
            )
        console.print(t)
    counts = ", ".join(f"{k} {v}" for k, v in record.counts().items())
    t = Table(title=f"Batch: {len(record.entries)} entries in {record.seconds:.0f} s ({counts})")
    for col in (
        "entry",
        "status",
        "onnx",
        "xnnpack",
        "delegated",
        "SNR dB (onnx/xnnpack)",
        "seconds",
        "reason",
    ):
        t.add_column(col, justify="right" if col in ("delegated", "seconds") else "left")
    for e in record.entries:
        style = _STATUS_STYLE.get(e.status, "red")
        cells = []
        for target in ("onnx", "xnnpack"):
            r = e.targets.get(target)
            cells.append("-" if r is None else (r.outcome or "ok") if r.ok else "[red]failed[/]")
        x = e.targets.get("xnnpack")
        share = "-" if x is None or x.delegated_share is None else f"{100 * x.delegated_share:.1f}%"
        snr = "/".join(
            "-"
            if e.targets.get(rt) is None or e.targets[rt].parity is None
            else f"{e.targets[rt].parity.snr_db:.0f}"
            for rt in ("onnx", "xnnpack")
        )
        t.add_row(
            e.name,
            f"[{style}]{e.status}[/]",
            *cells,
            share,
            snr,
            f"{e.seconds:.1f}",
            (e.reason or "").replace("\n", " ")[:80],
        )
    console.print(t)
    console.print(f"record: {out_dir}/batch.json  page: {out_dir}/batch.html")
