#!/usr/bin/env python
"""Run the model zoo (and with ``--hf`` the Hugging Face cases) on both targets and write the
coverage table, docs/coverage.md.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/gen_coverage.py --hf          # the committed table
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/gen_coverage.py --hf --check  # compare, write nothing

``--check`` runs fresh and compares the stable columns (case, target, status, delegation counts)
with the committed file; the exit code is 1 on a difference. Exit code 1 also when a case's status
is FAIL or XPASS, i.e. the run disagrees with the catalogue.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import sys
import tempfile
import time
import types
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
# torchvision's model definitions without its CUDA-only compiled ops (see tests/conftest.py)
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf", action="store_true", help="include the Hugging Face cases (slow)")
    parser.add_argument("--vision", action="store_true", help="include the torchvision classifiers (slow)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "coverage.md")
    parser.add_argument(
        "--check", action="store_true", help="compare the stable columns with --out instead of writing it"
    )
    parser.add_argument("--case", action="append", default=[], help="only this case (repeatable)")
    ns = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.CRITICAL)
    from dualexport._versions import library_versions
    from zoo import ZOO, run_case
    from zoo.coverage import parse, render, rows_for

    cases = list(ZOO)
    if ns.hf:
        from zoo.hf import HF_CASES

        cases += list(HF_CASES)
    if ns.vision:
        from zoo.vision import VISION_CASES

        cases += list(VISION_CASES)
    if ns.case:
        cases = [c for c in cases if c.name in ns.case]
    rows = []
    with tempfile.TemporaryDirectory(prefix="dx-coverage-") as tmp:
        for case in cases:
            t0 = time.perf_counter()
            run = run_case(case, pathlib.Path(tmp) / case.name)
            case_rows = rows_for(run)
            rows += case_rows
            summary = ", ".join(f"{r.cells['target']} {r.cells['status']}" for r in case_rows)
            print(f"{case.name:24s} {summary}  ({time.perf_counter() - t0:.1f} s)", flush=True)

    bad = [r for r in rows if r.cells["status"] in ("FAIL", "XPASS")]
    for r in bad:
        print(
            f"DISAGREES WITH CATALOGUE: {r.cells['case']} {r.cells['target']} "
            f"{r.cells['status']}: {r.cells['note']}",
            file=sys.stderr,
        )
    command = "scripts/gen_coverage.py" + (" --hf" if ns.hf else "") + (" --vision" if ns.vision else "")
    text = render(rows, cases, library_versions(), command)
    if ns.out.is_file():
        text += bench_section(ns.out.read_text())
    if ns.check:
        committed = {r.cells["case"] + "/" + r.cells["target"]: r.stable() for r in parse(ns.out.read_text())}
        diffs = [
            (
                r.cells["case"],
                r.cells["target"],
                committed.get(r.cells["case"] + "/" + r.cells["target"]),
                r.stable(),
            )
            for r in rows
            if committed.get(r.cells["case"] + "/" + r.cells["target"]) != r.stable()
        ]
        for d in diffs:
            print(f"DIFFERS: {d[0]}/{d[1]}: committed {d[2]}, fresh {d[3]}", file=sys.stderr)
        return 1 if diffs or bad else 0
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = ns.out.with_suffix(".md.tmp")
    tmp_out.write_text(text)
    tmp_out.replace(ns.out)
    print(f"wrote {ns.out}")
    return 1 if bad else 0


#: The heading bench/bench_coverage.py gives its table in the same page (its ``write_doc``).
BENCH_HEADING = "## Transformers architectures as users build them"


def bench_section(page: str) -> str:
    """The coverage bench's section of the page as it stands: its table takes hours to measure,
    so regenerating this script's part must not drop it."""
    if BENCH_HEADING not in page:
        return ""
    return "\n" + page[page.index(BENCH_HEADING) :].rstrip() + "\n"


if __name__ == "__main__":
    sys.exit(main())
