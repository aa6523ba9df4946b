"""Peak memory above baseline, divided by the weight bytes, for the issue's two big models: the
201 M-parameter MLP (805 MB) and a Llama-style decoder past 2 GiB. The naive plain path
(torch.onnx.export on the module, then a second torch.export and XNNPACK lowering for
ExecuTorch, files written, no runtime load) against ``dx.export`` (one trace, both targets,
external weights, smoke runs from disk in forked children, weight manifest).

Each run is its own child process, measured after imports and the model's construction (the
weights are in memory: the baseline).
The peak is the larger of the process's VmHWM and its largest child's (RUSAGE_CHILDREN), above
the baseline RSS: dx's runtime children run while the exporter idles, and a forked child's VmHWM
counts the pages it shares with its parent, so this bounds the tree's peak from above; the
sampled PSS sum (every 50 ms) can miss short spikes and is printed beside it. The exporter
process alone is its own VmHWM. "et-load": ExecuTorch's runtime loading dx's .pte/.ptd and
running once, alone in a process: the floor of any export that proves its file by loading it.

Usage: python bench/bench_memory.py [mlp|llama ...]   (default: both; llama takes ~8 min)
"""

from __future__ import annotations

import json
import pathlib
import shutil
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
if {mode!r} == "et-load":  # the floor: ExecuTorch loading dx's files, alone in a process
    from executorch.extension.pybindings import portable_lib
    with TreeSampler() as s:
        m = portable_lib._load_for_executorch(str(out / "m.pte"), data_path=str(out / "m.ptd"))
        m.forward(list(args))
    print(json.dumps({{"base": base, "peak": s.peak, "procs": 1, "samples": s.samples,
                      "parent": peak_rss_mb() - base_rss, "child": 0.0,
                      "weights": weight_bytes(model) / 2**20, "files": 0}}))
    raise SystemExit(0)
with TreeSampler() as s:
    if {mode!r} == "plain":
        plain_onnx(model, args, out / "plain.onnx")
        plain_pte(model, args, out / "plain.pte")
    else:
        res = dx.export(model, args, out_dir=out, name="m", strict=True, cache=False)
        assert not res.errors and len(res.artifacts) == 2, res.errors
files = sum(p.stat().st_size for p in out.iterdir()) / 2**20
import resource
child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({{"base": base, "peak": s.peak, "procs": s.peak_processes, "samples": s.samples,
                  "parent": peak_rss_mb() - base_rss, "child": max(0.0, child - base_rss),
                  "weights": weight_bytes(model) / 2**20, "files": files}}))
"""


def run(model: str, mode: str, out: str) -> dict[str, float]:
    code = CHILD.format(bench=str(pathlib.Path(__file__).parent), out=out, mode=mode, model=model)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{model}/{mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(models: list[str]) -> None:
    out = pathlib.Path(tempfile.mkdtemp(prefix="bench-memory-"))
    try:
        _main(models, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _main(models: list[str], out: pathlib.Path) -> None:
    for model in models:
        modes = ("plain", "dx", "et-load")
        tree: dict[str, list[float]] = {m: [] for m in modes}
        sampled: dict[str, list[float]] = {m: [] for m in modes}
        parent: dict[str, list[float]] = {m: [] for m in modes}
        last: dict[str, float] = {}
        for _ in range(REPEATS[model]):
            for mode in modes:
                if mode != "et-load":  # et-load reads the files dx just wrote
                    shutil.rmtree(out, ignore_errors=True)
                    out.mkdir()
                r = run(model, mode, str(out))
                # children run while the parent idles, and a forked child's VmHWM counts the pages
                # it shares with the parent: the larger of the two peaks bounds the tree's
                tree[mode].append(max(r["parent"], r["child"]))
                sampled[mode].append(r["peak"] - r["base"])
                parent[mode].append(r["parent"])
                last = r
        w = last["weights"]
        med = {m: statistics.median(tree[m]) / w for m in modes}
        print(
            f"{model}: {w:.0f} MB of weights; baseline (after imports and model build) "
            f"~{last['base']:.0f} MB PSS; repeats {REPEATS[model]}, one child process each"
        )
        for mode in modes:
            print(
                f"  {mode:>7}: peak above baseline {med[mode]:.2f}x weight bytes "
                f"(min {min(tree[mode]) / w:.2f}x, max {max(tree[mode]) / w:.2f}x); "
                f"exporter process alone {statistics.median(parent[mode]) / w:.2f}x; "
                f"sampled tree PSS {statistics.median(sampled[mode]) / w:.2f}x"
            )
        dxp = statistics.median(parent["dx"]) / w
        print(
            f"  dx/plain: {med['dx'] / med['plain']:.2f}x; exporter process dx/plain "
            f"{dxp / (statistics.median(parent['plain']) / w):.2f}x; aim <= {AIM}x: exporter process "
            f"{dxp:.2f}x ({'meets' if dxp <= AIM else 'misses'}), with the runtime proofs {med['dx']:.2f}x "
            f"({'meets' if med['dx'] <= AIM else 'misses'}; ExecuTorch loading the .pte alone needs "
            f"{med['et-load']:.2f}x)"
        )


if __name__ == "__main__":
    main(sys.argv[1:] or ["mlp", "llama"])
