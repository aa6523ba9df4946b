"""Peak RSS above baseline, divided by the weight bytes, for a big MLP: the naive plain path
(torch.onnx.export(model) in memory, then a second torch.export for ExecuTorch) against
``dx.export``; each run in its own child process, paths alternating. ``dx`` runs serially
(``parallel=False``); ``dx forked`` lowers XNNPACK in a forked worker, and its figure is an upper
bound: the parent's peak plus the worker's peak, both above the baseline (VmHWM of
one process would hide the worker's memory).

The issue's model has 201 M parameters (805 MB); this one ~50 M (~200 MB) to fit the time.
Usage: python bench/bench_memory.py
"""

from __future__ import annotations

import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))

REPEATS = 3

CHILD = r"""
import json, os, pathlib, sys, warnings, logging
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
sys.path.insert(0, {bench!r})
import torch, onnxruntime, executorch.exir, dualexport as dx
from _common import peak_rss_mb
from _models import big_mlp, weight_bytes
from _plain import plain_onnx, plain_pte

def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

model, args = big_mlp()
out = pathlib.Path({out!r})
with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
    f.write("5")
base = rss_mb()
if {mode!r} == "plain":
    plain_onnx(model, args, out / "plain.onnx")
    plain_pte(model, args, out / "plain.pte")
else:
    from dualexport.exporters.base import ExportOptions
    res = dx.export(model, args, out_dir=out, name="m", strict=True, cache=False,
                    options=ExportOptions(parallel={mode!r} == "dx forked"))
    assert res.artifacts["xnnpack"].outcome.forked == ({mode!r} == "dx forked")
import resource
child_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({{"base": base, "peak": peak_rss_mb(), "weights": weight_bytes(model),
                  "child": child_mb}}))
"""


def run(mode: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        code = CHILD.format(bench=str(pathlib.Path(__file__).parent), out=d, mode=mode)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    above: dict[str, list[float]] = {"plain": [], "dx": [], "dx forked": []}
    weights_mb = 0.0
    base = 0.0
    for _ in range(REPEATS):
        for mode in above:
            r = run(mode)
            worker = max(0.0, r["child"] - r["base"]) if mode == "dx forked" else 0.0
            above[mode].append(r["peak"] - r["base"] + worker)
            weights_mb, base = r["weights"] / 2**20, r["base"]
    print(
        f"MLP ~50M params ({weights_mb:.0f} MB of weights; issue: 201M / 805 MB); "
        f"baseline RSS after imports and model build ~{base:.0f} MB; repeats {REPEATS}, one child each"
    )
    for mode, v in above.items():
        lo, med, hi = min(v), statistics.median(v), max(v)
        print(
            f"{mode:>9}: peak above baseline min {lo:.0f} / median {med:.0f} / max {hi:.0f} MB = "
            f"{med / weights_mb:.2f}x weight bytes (min {lo / weights_mb:.2f}x, max {hi / weights_mb:.2f}x)"
        )
    p = statistics.median(above["plain"])
    for mode in ("dx", "dx forked"):
        print(f"peak-above-baseline ratio {mode}/plain: median {statistics.median(above[mode]) / p:.2f}x")


if __name__ == "__main__":
    main()
