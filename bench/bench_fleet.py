"""Fleet export on this machine (issue 12), every figure from the CLI as a user runs it
(``dualexport batch MANIFEST --out DIR``), wall seconds from process start to exit:

1. throughput, entries per minute, of the shipped 12-entry zoo (examples/zoo.toml) with 1 and 2
   workers, each into a fresh folder; the 2-worker speed-up;
2. the cost of a second run of the unchanged manifest into the same folder, against the first
   (the issue's aim: at most 0.2x), for the 12-entry zoo and for the zoo twice over (24 entries,
   the second copy under other names), where the fixed cost (interpreter, the fork server's
   imports) is spread over more entries;
3. memory admission: the 12-entry zoo with 2 workers under a tight and a loose
   ``--memory-budget``, the PSS of the whole batch's process tree (driver, fork server, entries,
   their forked smoke runs) sampled every 50 ms: its peak against the budget, and the most
   entries that ran at once.

Usage: python bench/bench_fleet.py [--quick | --scale]   (--quick: 1 and the 12-entry re-run;
--scale: the 24-entry re-run and 3)
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

from dualexport.fleet.memory import TreeSampler

REPO = pathlib.Path(__file__).resolve().parents[1]
ZOO = REPO / "examples" / "zoo.toml"
CLI = [sys.executable, "-m", "dualexport"]
print = functools.partial(print, flush=True)  # progress shows while it runs
ENV_VARS = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def run_batch(manifest: pathlib.Path, out: pathlib.Path, *extra: str) -> tuple[float, float, dict]:
    """Wall seconds, sampled peak PSS of the process tree (MB), and batch.json."""
    import os

    env = {**os.environ, **ENV_VARS}
    t = time.perf_counter()
    proc = subprocess.Popen(
        [*CLI, "batch", str(manifest), "--out", str(out), *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    with TreeSampler(proc.pid) as sampler:
        _, err = proc.communicate()
    wall = time.perf_counter() - t
    record = json.loads((out / "batch.json").read_text())
    bad = [e["name"] for e in record["entries"] if e["status"] != "passed"]
    if proc.returncode or bad:
        raise SystemExit(f"batch failed ({proc.returncode}; {bad}):\n{err[-3000:]}")
    return wall, sampler.peak, record


def doubled(tmp: pathlib.Path) -> pathlib.Path:
    """The zoo twice over: every entry again under ``<name>_b`` (same model, other folder)."""
    text = ZOO.read_text()
    body = text[text.index("\n[models.") :]
    copy = re.sub(r"^\[models\.([A-Za-z0-9_]+)\]", r"[models.\1_b]", body, flags=re.M)
    path = tmp / "zoo24.toml"
    path.write_text(text + copy)
    return path


def concurrency(record: dict) -> int:
    """The most entries whose [start, end] intervals overlap (from batch.json's timestamps)."""
    spans = [(e["started"], e["started"] + e["seconds"]) for e in record["entries"]]
    return max(sum(s <= t < end for s, end in spans) for t, _ in spans)


def main(quick: bool, scale_only: bool) -> None:
    n = len(re.findall(r"^\[models\.", ZOO.read_text(), flags=re.M))
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        if not scale_only:
            throughput(n, tmp)
        if not quick:
            scale(n, tmp)


def throughput(n: int, tmp: pathlib.Path) -> None:
    walls = {}
    for workers in (1, 2):
        wall, _, _ = run_batch(ZOO, tmp / f"w{workers}", "--workers", str(workers))
        walls[workers] = wall
        print(f"zoo ({n} entries), {workers} worker(s): {wall:.1f} s = {n / wall * 60:.1f} entries/min")
    print(f"2 workers / 1 worker wall: {walls[2] / walls[1]:.2f}x")
    for workers in (2, 1):
        again, _, rec = run_batch(ZOO, tmp / f"w{workers}", "--workers", str(workers))
        outcomes = sorted({t["outcome"] for e in rec["entries"] for t in e["targets"].values()})
        carried = sum(e["carried"] for e in rec["entries"])
        print(
            f"second run, unchanged zoo, {workers} worker(s): {again:.1f} s = {again / walls[workers]:.2f}x "
            f"the first (aim <= 0.20x); outcomes {outcomes}, checks carried {carried}/{n}"
        )


def scale(n: int, tmp: pathlib.Path) -> None:
    zoo24 = doubled(tmp)
    first, _, _ = run_batch(zoo24, tmp / "z24", "--workers", "2")
    second, _, _ = run_batch(zoo24, tmp / "z24", "--workers", "2")
    print(
        f"zoo twice over ({2 * n} entries), 2 workers: first {first:.1f} s, second {second:.1f} s "
        f"= {second / first:.2f}x"
    )

    for budget in (1500, 6000):
        wall, peak, rec = run_batch(ZOO, tmp / f"b{budget}", "--workers", "2", "--memory-budget", str(budget))
        print(
            f"--memory-budget {budget} MB, 2 workers: peak PSS of the batch's process tree "
            f"{peak:.0f} MB ({peak / budget:.2f}x the budget; "
            f"{'under' if peak <= budget else 'OVER'}), at most {concurrency(rec)} entries at once, "
            f"{wall:.1f} s"
        )


if __name__ == "__main__":
    main("--quick" in sys.argv, "--scale" in sys.argv)
