"""Rich tables for the terminal: the delegation table, the weight manifest and the parity table.

Shared by the CLI and ``make demo`` (nothing imports the CLI module itself).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["console", "print_delegation", "print_weights", "print_parity"]


def console():
    from rich.console import Console

    return Console(stderr=False, highlight=False, width=None if sys.stdout.isatty() else 120)


def print_delegation(console: Any, res: Any) -> None:
    from rich.table import Table

    art = res.artifacts.get("xnnpack")
    if art is None or art.delegation is None:
        return
    d = art.delegation
    t = Table(
        title=f"XNNPACK delegation: {d.subgraphs} subgraph(s), {d.delegated_nodes} delegated, "
        f"{d.non_delegated_nodes} not ({100 * d.delegated_share:.0f}%)"
    )
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
    for col in ("exact", "transformed", "not_stored", "missing", "mismatch"):
        t.add_column(col, justify="right")
    for target in manifest.artifacts:
        c = manifest.counts(target)
        t.add_row(
            target, *(str(c.get(k, 0)) for k in ("exact", "transformed", "not_stored", "missing", "mismatch"))
        )
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
