"""Peak memory above baseline, divided by the weight bytes, for the issue's two big models: the
201 M-parameter MLP (805 MB) and a Llama-style decoder past 2 GiB. The naive plain path
(torch.onnx.export on the module, then a second torch.export and XNNPACK lowering for
ExecuTorch, files written, no runtime load) against ``dx.export`` (one trace, both targets,
external weights, smoke runs from disk in forked children, weight manifest).

Each run is its own child process; its memory is the sum of PSS over the child and all its
descendants, sampled every 50 ms (``_tree.TreeSampler``): dx runs its smoke runs in forked
children, whose copy-on-write view of the parent's weights PSS counts once, not once per process.
The baseline is that sum after imports and the model's construction (the weights are in memory).
The parent's own VmHWM above the same baseline is printed too.

Usage: python bench/bench_memory.py [mlp|llama ...]   (default: both; llama takes ~8 min)
"""

from __future__ import annotations

import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))

REPEATS = {"mlp": 2, "llama": 1}
AIM = 1.25

CHILD = r"""
import json, os, pathlib, sys, warnings, logging
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, {bench!r})
import gc, torch, onnxruntime, executorch.exir, dualexport as dx
from _common import peak_rss_mb
from _models import mlp_201m, llama_2g, weight_bytes
from _plain import plain_onnx, plain_pte
from dualexport.fleet.memory import TreeSampler, tree_pss_mb

model, args = {{"mlp": mlp_201m, "llama": llama_2g}}[{model!r}]()
out = pathlib.Path({out!r})
gc.collect()
with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
    f.write("5")
base_rss = int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS:")).split()[1]) / 1024
base = tree_pss_mb(os.getpid())
with TreeSampler() as s:
    if {mode!r} == "plain":
        plain_onnx(model, args, out / "plain.onnx")
        plain_pte(model, args, out / "plain.pte")
    else:
        res = dx.export(model, args, out_dir=out, name="m", strict=True, cache=False)
        assert not res.errors and len(res.artifacts) == 2, res.errors
files = sum(p.stat().st_size for p in out.iterdir()) / 2**20
print(json.dumps({{"base": base, "peak": s.peak, "procs": s.peak_processes, "samples": s.samples,
                  "parent": peak_rss_mb() - base_rss, "weights": weight_bytes(model) / 2**20,
                  "files": files}}))
"""


def run(model: str, mode: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        code = CHILD.format(bench=str(pathlib.Path(__file__).parent), out=d, mode=mode, model=model)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{model}/{mode} failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main(models: list[str]) -> None:
    for model in models:
        above: dict[str, list[float]] = {"plain": [], "dx": []}
        parent: dict[str, list[float]] = {"plain": [], "dx": []}
        last: dict[str, float] = {}
        for _ in range(REPEATS[model]):
            for mode in above:
                r = run(model, mode)
                above[mode].append(r["peak"] - r["base"])
                parent[mode].append(r["parent"])
                last = r
        w = last["weights"]
        print(
            f"{model}: {w:.0f} MB of weights; baseline (tree PSS after imports and model build) "
            f"~{last['base']:.0f} MB; repeats {REPEATS[model]}, one child each"
        )
        for mode, v in above.items():
            med = statistics.median(v)
            print(
                f"  {mode:>5}: tree peak above baseline min {min(v):.0f} / median {med:.0f} / max {max(v):.0f} MB"
                f" = {med / w:.2f}x weight bytes; parent alone {statistics.median(parent[mode]) / w:.2f}x"
            )
        ratio = statistics.median(above["dx"]) / statistics.median(above["plain"])
        dxw = statistics.median(above["dx"]) / w
        print(
            f"  dx/plain: median {ratio:.2f}x; dx {dxw:.2f}x weight bytes "
            f"({'meets' if dxw <= AIM else 'misses'} the aim <= {AIM}x)"
        )


if __name__ == "__main__":
    main(sys.argv[1:] or ["mlp", "llama"])
