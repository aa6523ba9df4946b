"""XNNPACK delegated-node share and subgraph count, lowering time and ExecuTorch latency: the plain
path (torch.export + to_edge_transform_and_lower) against the same lowering of the program after
dualexport's shared-program passes (``DEFAULT_PASSES``), and that lowering again with dualexport's
pruned XNNPACK backend passes (what ``dx.export(optimize=True)`` runs), side by side in one run.

Lowering time of the optimized sides includes the passes. Usage: python bench/bench_delegation.py
"""

from __future__ import annotations

import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import fmt, fmt_s, quiet, ratio

REPEATS = 3


def main() -> None:
    quiet()
    import torch

    from _models import ENC_D, ENC_LAYERS, ENC_SEQ, MODELS
    from _plain import delegation, et_runner, latency, plain_lower
    from dualexport.exporters.backend_passes import pruned_backend_passes
    from dualexport.shared_state.passes import optimize

    print(
        f"repeats: {REPEATS} (no warm-up); encoder reduced to {ENC_LAYERS} layers d={ENC_D} "
        f"seq {ENC_SEQ} (issue: d=512); BERT tiny config (2 layers, hidden 32, seq 8)"
    )
    for name, build in MODELS.items():
        model, args = build()
        times: dict[str, list[float]] = {"plain": [], "optimized": [], "opt+pruned": []}
        pass_s: list[float] = []
        edges = {}
        for _ in range(REPEATS):
            ep = torch.export.export(model, args)
            t = time.perf_counter()
            edges["plain"] = plain_lower(ep)
            times["plain"].append(time.perf_counter() - t)
            ep = torch.export.export(model, args)
            t = time.perf_counter()
            opt = optimize(ep)
            pass_s.append(time.perf_counter() - t)
            edges["optimized"] = plain_lower(opt)
            times["optimized"].append(time.perf_counter() - t)
            ep = torch.export.export(model, args)
            t = time.perf_counter()
            with pruned_backend_passes():
                edges["opt+pruned"] = plain_lower(optimize(ep))
            times["opt+pruned"].append(time.perf_counter() - t)
        stats = {k: (min(v), sorted(v)[len(v) // 2], max(v)) for k, v in times.items()}
        print(f"\n== {name}")
        for k, edge in edges.items():
            d = delegation(edge)
            print(
                f"{k:>10}: {d.subgraphs:3d} subgraph(s), {d.delegated_nodes} delegated, "
                f"{d.non_delegated_nodes} not ({d.delegated_share:.1%}); "
                f"outside: {', '.join(d.non_delegated_ops()) or '-'}"
            )
        print(f"lowering plain     : {fmt_s(stats['plain'])}")
        print(
            f"lowering optimized : {fmt_s(stats['optimized'])} (passes {min(pass_s):.2f}-{max(pass_s):.2f} s)"
        )
        print(f"lowering opt+pruned: {fmt_s(stats['opt+pruned'])}")
        print(f"lowering time ratio optimized/plain : {ratio(stats['optimized'], stats['plain'])}")
        print(f"lowering time ratio opt+pruned/plain: {ratio(stats['opt+pruned'], stats['plain'])}")
        with tempfile.TemporaryDirectory() as tmp:
            lat = {}
            with torch.no_grad():  # first: ORT/ExecuTorch thread pools would compete with it
                lat["eager"] = latency(lambda m=model, a=args: m(*a), calls=20)
            for k, edge in edges.items():
                path = pathlib.Path(tmp) / f"{k}.pte"
                with open(path, "wb") as f:
                    edge.to_executorch().write_to_file(f)
                lat[k] = latency(et_runner(path, args), calls=50 if name == "bert" else 20)
        for k, v in lat.items():
            print(f"latency {k:>9}: {fmt(v)} per call")
        print(f"ExecuTorch latency ratio optimized/plain: {ratio(lat['optimized'], lat['plain'])}")
        print(f"ExecuTorch latency ratio opt+pruned/plain: {ratio(lat['opt+pruned'], lat['plain'])}")


if __name__ == "__main__":
    main()
