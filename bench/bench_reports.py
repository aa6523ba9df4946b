"""Render time and size of each HTML page (export page, export page with a divergence, parity page,
batch page) from the same results, N times each.

The inputs are fixed: TinyConvNet seeded, exported once to a temporary folder, compared twice (the
second time after one BatchNorm weight in the ONNX file is shifted, so the ONNX runtime diverges and
the pages draw the per-node error curve), and a 12-entry batch record built in code. The first
render of each page is reported apart ("cold": it pays the lazy imports, e.g. matplotlib), then
min/median/max wall time over N renders and the mean CPU time of this process per render (the
steadier figure on shared cores).

Usage: python bench/bench_reports.py [-n N] [--out DIR]  (``--out`` keeps the pages, to compare
sizes or look at them). The code that renders is whatever ``dualexport`` imports: to compare two
versions, run this same script at each commit (the numbers printed name the commit).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import fmt, quiet, samples


def _batch_record() -> object:
    """A batch of 12 entries: passed, failed, timed out and invalid, with parity and delegation."""
    from dualexport.fleet.record import BatchRecord, EntryRecord, FileRecord, ParitySummary, TargetRecord

    def target(name: str, ok: bool, share: float | None = None, snr: float = 90.0) -> TargetRecord:
        files = (FileRecord(f"m.{'onnx' if name == 'onnx' else 'pte'}", 2_500_000, "0" * 64),) if ok else ()
        parity = ParitySummary(snr > 40, 1e-6 if snr > 40 else 0.3, snr, 0.999999, 0.0) if ok else None
        return TargetRecord(
            name,
            ok,
            outcome="lowered" if ok else None,
            seconds=3.0,
            files=files,
            delegated_share=share if ok else None,
            subgraphs=2 if ok and share is not None else None,
            parity=parity,
            error=None if ok else "op aten.foo not supported",
            error_type=None if ok else "XnnpackLoweringError",
        )

    entries = []
    for i in range(12):
        status = ("passed", "passed", "passed", "failed", "timeout", "invalid")[i % 6]
        targets = {}
        if status in ("passed", "failed"):
            targets = {
                "onnx": target("onnx", True, snr=math.inf if i % 2 else 80.0 + i),
                "xnnpack": target("xnnpack", status == "passed", share=0.5 + i / 30, snr=70.0 + i),
            }
        entries.append(
            EntryRecord(
                f"model_{i:02d}",
                status,
                line=i + 1,
                reason=None if status == "passed" else f"{status}: entry {i} <did not pass>",
                folder=f"model_{i:02d}",
                report=f"model_{i:02d}/model_{i:02d}.report.html" if targets else None,
                targets=targets,
                seconds=10.0 + i,
                phases={"load": 1.0, "export": 8.0 + i, "compare": 1.0},
                peak_rss_mb=600.0 + 10 * i,
            )
        )
    diff = {
        "against": "runs/previous/batch.json",
        "changes": [
            {
                "name": "model_03",
                "kind": "regression",
                "field": "status",
                "before": "passed",
                "after": "failed",
            },
            {"name": "model_01", "kind": "improvement", "field": "seconds", "before": 20.0, "after": 11.0},
        ],
    }
    return BatchRecord(
        tuple(entries),
        "zoo.toml",
        "a" * 64,
        "local",
        2,
        "2025-01-01T00:00:00Z",
        630.0,
        versions={"torch": "2.13.0", "executorch": "1.4.1"},
        diff=diff,
    )


def _pages(out: pathlib.Path) -> dict[str, Callable[[], str]]:
    """name -> a function that renders that page (the export and the reports made once here)."""
    import numpy as np
    import onnx
    import torch

    import dualexport as dx
    from dualexport.examples import TinyConvNet
    from dualexport.parity.html import render_html
    from dualexport.reporting import render_batch_page, render_export_page

    torch.manual_seed(0)
    res = dx.export(TinyConvNet().eval(), (torch.randn(1, 3, 32, 32),), out_dir=out, name="m")
    assert not res.errors, res.errors
    good = dx.compare(res)
    model = onnx.load(str(res.artifacts["onnx"].path), load_external_data=False)
    init = next(i for i in model.graph.initializer if i.name == "features.1.weight")
    arr = np.frombuffer(init.raw_data, dtype=np.float32).copy()
    arr[1] += 0.3
    init.raw_data = arr.tobytes()
    onnx.save(model, str(res.artifacts["onnx"].path))
    bad = dx.compare(res)
    assert good.ok and not bad.ok, "the tampered weight must make the ONNX runtime diverge"
    batch = _batch_record()
    seconds = {"verify": 1.0, "compare": 2.0}
    return {
        "export page": lambda: render_export_page(res, good, seconds=seconds),
        "export page, divergence": lambda: render_export_page(res, bad, seconds=seconds),
        "parity page (divergence)": lambda: render_html(bad),
        "batch page (12 entries)": lambda: render_batch_page(batch),
    }


def _commit(package: pathlib.Path) -> str:
    """The commit of the checkout ``package`` lies in (the code that renders), if it is one."""
    try:
        return subprocess.run(
            ["git", "-C", str(package), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=20, help="renders per page (after the cold one)")
    ap.add_argument("--out", type=pathlib.Path, help="write each page here, to keep it")
    ns = ap.parse_args()
    quiet()
    import dualexport

    package = pathlib.Path(dualexport.__file__).parent
    print(f"dualexport from {package} (commit: {_commit(package)})")
    with tempfile.TemporaryDirectory() as d:
        pages = _pages(pathlib.Path(d) / "out")
        for name, render in pages.items():
            t = time.perf_counter()
            text = render()
            cold = time.perf_counter() - t
            again = render()
            same = "same bytes" if again == text else "DIFFERENT bytes on a second render"
            cpu = time.process_time()
            warm = samples(render, ns.n)
            cpu = (time.process_time() - cpu) / ns.n  # this process's CPU: less noisy on shared cores
            size = len(text.encode())
            print(
                f"{name:26s} {size / 1000:6.1f} KB  cold {cold * 1e3:7.1f} ms  x{ns.n}: {fmt(warm)}, "
                f"CPU {cpu * 1e3:.1f} ms/render  ({same})"
            )
            if ns.out is not None:
                ns.out.mkdir(parents=True, exist_ok=True)
                slug = name.split(" (")[0].replace(",", "").replace(" ", "_")
                (ns.out / f"{slug}.html").write_text(text)


if __name__ == "__main__":
    main()
