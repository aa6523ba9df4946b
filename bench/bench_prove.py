"""What proving every file by value costs (issue 18: at most 5% of export time on the encoder).

The job proves each file it publishes, whatever made it (lowered, reused, patched): the file runs
on the example and at every range edge, and each output is judged against the shared program's.
Running the file was already part of the proof (shapes and ranges); what the value check adds is
the shared program's own outputs, computed once per export (``res.seconds["reference"]``), and
the judging of each output (timed here around ``prove._judge``). Both are measured inside the
same exports, for a cold export, a cache hit and a weights-only change, on the encoder with a
dynamic batch (so the proof runs the example and three edges).

Usage: python bench/bench_prove.py [--repeats N]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from _common import quiet


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    repeats = ap.parse_args().repeats
    quiet()
    import torch
    from torch.export import Dim

    import dualexport as dx
    import dualexport.pipeline.prove as prove
    from _models import encoder

    model, args = encoder()
    args = (args[0].expand(2, -1, -1).contiguous(),)  # a dynamic batch needs an example of at least 2
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    dynamic = ({0: Dim("batch", min=1, max=8)},)
    judged: list[float] = []
    original = prove._judge

    def timed_judge(*a, **k):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            judged.append(time.perf_counter() - t)

    prove._judge = timed_judge
    rows: dict[str, list[tuple[float, float, float]]] = {
        "cold (lowered)": [],
        "hit (reused)": [],
        "patched": [],
    }
    with tempfile.TemporaryDirectory() as d:
        out = pathlib.Path(d)
        dx.export(model, args, out_dir=out / "warmup", name="m", cache=False, dynamic_shapes=dynamic)
        for i in range(repeats):
            for label in rows:
                if label == "patched":
                    with torch.no_grad():
                        next(model.parameters()).view(-1)[i] += 1.0
                judged.clear()
                t = time.perf_counter()
                res = dx.export(
                    model,
                    args,
                    out_dir=out / f"r{i}",
                    name="m",
                    cache=label != "cold (lowered)",
                    dynamic_shapes=dynamic,
                )
                total = time.perf_counter() - t
                kinds = {type(a.outcome).__name__ for a in res.artifacts.values()}
                assert not res.errors and len(kinds) == 1, (label, kinds, res.errors)
                rows[label].append((total, res.seconds["reference"], sum(judged)))
    med = statistics.median
    print(f"encoder (bench/_models.encoder, batch Dim 1..8: example + 3 edges), {repeats} repeats")
    print(f"{'export':16} {'total s':>8} {'reference s':>12} {'judging s':>10} {'added/total':>12}")
    for label, runs in rows.items():
        tot, ref, jud = (med(r[k] for r in runs) for k in range(3))
        ratios = [(r[1] + r[2]) / r[0] for r in runs]
        print(
            f"{label:16} {tot:8.2f} {ref:12.3f} {jud:10.3f} "
            f"{med(ratios) * 100:10.2f}% (min {min(ratios) * 100:.2f}%, max {max(ratios) * 100:.2f}%)"
        )


if __name__ == "__main__":
    main()
