"""Cached re-export of an unchanged model against a cold export (issue 6: aim <= 0.2).

Cold: `dx.export(..., cache=False)` into a fresh folder. Warm: `dx.export` again into the folder
that already holds the set for the same traced program (the cache key hashes graph, weights,
shape ranges, options and versions; the reused files are re-verified from disk). Also prints the
cost of a weights-only change (a miss on the key, a hit on the structure key: the previous files
are patched with the new bytes where the manifest proved them stored exactly). Usage: python bench/bench_cache.py
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))


def main() -> None:
    import torch

    import dualexport as dx
    from _models import encoder

    model, args = encoder()
    # nn.TransformerEncoder deep-copies one layer: every layer starts with the same bytes, which
    # XNNPACK stores once. Perturb them, as training would, so each weight is its own entry.
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    cold, warm = [], []
    with tempfile.TemporaryDirectory() as d:
        out = pathlib.Path(d)
        dx.export(model, args, out_dir=out / "warmup", name="m", cache=False)
        for i in range(3):
            t = time.perf_counter()
            dx.export(model, args, out_dir=out / f"cold{i}", name="m", cache=False)
            cold.append(time.perf_counter() - t)
            t = time.perf_counter()
            res = dx.export(model, args, out_dir=out / f"cold{i}", name="m")
            warm.append(time.perf_counter() - t)
            assert all(isinstance(a.outcome, dx.Reused) for a in res.artifacts.values())
        changed, patched = [], []
        for i in range(3):  # a weights-only change: the previous files are patched
            with torch.no_grad():
                next(model.parameters()).view(-1)[i] += 1.0
            t = time.perf_counter()
            res = dx.export(model, args, out_dir=out / f"cold{i}", name="m")
            changed.append(time.perf_counter() - t)
            assert not any(isinstance(a.outcome, dx.Reused) for a in res.artifacts.values())
            patched.append(sorted(t for t, a in res.artifacts.items() if isinstance(a.outcome, dx.Patched)))
    med = statistics.median
    print("TransformerEncoder (bench/_models.encoder, weights perturbed so layers differ), 3 repeats")
    print(f"cold export  : min {min(cold):.2f} s / median {med(cold):.2f} s / max {max(cold):.2f} s")
    print(f"cached export: min {min(warm):.2f} s / median {med(warm):.2f} s / max {max(warm):.2f} s")
    print(
        f"cached/cold ratio: median {med(warm) / med(cold):.2f}x "
        f"(min {min(warm) / min(cold):.2f}x, max {max(warm) / max(cold):.2f}x)"
    )
    print(
        f"weights-only change: min {min(changed):.2f} s / median {med(changed):.2f} s / max "
        f"{max(changed):.2f} s = {med(changed) / med(cold):.2f}x cold (patched targets: {patched})"
    )


if __name__ == "__main__":
    main()
