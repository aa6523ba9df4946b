"""Dual-export wall time: ``dx.export`` (one trace, both targets, weight manifest, smoke runs)
against the plain path (torch.onnx.export on the module + a separate torch.export and
to_edge_transform_and_lower + to_executorch), side by side: dx.export as it was before pruning and
forking (serial, every XNNPACK backend pass), with pruned backend passes only, with pruning and the
forked XNNPACK worker (the default when a core is free; every default pass on), and with every
pass off (``optimize=False``).

Usage: python bench/bench_export_time.py
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import fmt_s, quiet, ratio, samples

REPEATS = 3


def main() -> None:
    quiet()
    import dualexport as dx
    from _models import ENC_D, ENC_LAYERS, ENC_SEQ, encoder
    from _plain import plain_dual
    from dualexport.exporters.base import ExportOptions

    model, args = encoder()
    print(
        f"TransformerEncoder {ENC_LAYERS} layers d={ENC_D} seq {ENC_SEQ} (issue: d=512, reduced "
        f"to fit 2 cores); repeats {REPEATS}, no warm-up, paths interleaved"
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp)
        before = ExportOptions(prune_backend_passes=False, parallel=False)
        runs = {
            "plain (onnx.export + export + lower)": lambda: plain_dual(model, args, out),
            "dx.export serial, all backend passes": lambda: dx.export(
                model, args, out_dir=out / "old", name="m", strict=True, cache=False, options=before
            ),
            "dx.export default (passes, pruned, forked)": lambda: dx.export(
                model,
                args,
                out_dir=out / "dx",
                name="m",
                strict=True,
                cache=False,
                options=ExportOptions(parallel=True),
            ),
            "dx.export default, serial": lambda: dx.export(
                model,
                args,
                out_dir=out / "ser",
                name="m",
                strict=True,
                cache=False,
                options=ExportOptions(parallel=False),
            ),
            "dx.export every pass off (pruned, forked)": lambda: dx.export(
                model,
                args,
                out_dir=out / "opt",
                name="m",
                strict=True,
                cache=False,
                optimize=False,
                options=ExportOptions(parallel=True),
            ),
        }
        acc: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(REPEATS):  # interleaved, so machine load hits every path alike
            for k, fn in runs.items():
                acc[k].append(samples(fn, repeats=1)[0])
    stats = {k: (min(v), sorted(v)[len(v) // 2], max(v)) for k, v in acc.items()}
    for k, v in stats.items():
        print(f"{k:<42}: {fmt_s(v)}")
    plain = stats["plain (onnx.export + export + lower)"]
    for k, v in stats.items():
        if not k.startswith("plain"):
            print(f"dual-export wall time ratio {k:<42} / plain: {ratio(v, plain)}")
    print("(dx.export also writes the weight manifest, the .pt2 and smoke-runs both files from disk)")


if __name__ == "__main__":
    main()
