"""XNNPACK delegation of the torchvision classifier set: dualexport's default export against the
plain path (torch.export + to_edge_transform_and_lower), per model and the median; with
``--dynamic`` both export a dynamic batch (``Dim("batch", 1..8)``, how classifiers are served) and
dualexport's files are proven at the range's edges (1, 7 and 8).

Usage: python bench/bench_vision_delegation.py [--dynamic] [tv_MODEL ...]
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "tests"))
from _common import quiet


def main(argv: list[str]) -> None:
    quiet()
    import types

    sys.modules.setdefault(
        "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
    )
    import torch

    import dualexport as dx
    from _plain import delegation, plain_lower
    from zoo.vision import VISION_CASES

    dynamic = "--dynamic" in argv
    argv = [a for a in argv if a != "--dynamic"]
    dyn = ({0: torch.export.Dim("batch", min=1, max=8)},) if dynamic else None
    rows = []
    for case in VISION_CASES:
        if argv and case.name not in argv:
            continue
        model = case.factory()
        args, _ = case.inputs()
        if dynamic and args[0].shape[0] < 2:  # torch.export specializes a size-1 example
            args = (torch.cat([args[0], args[0].flip(-1)]), *args[1:])
        try:
            t = time.perf_counter()
            plain = delegation(plain_lower(torch.export.export(model, args, dynamic_shapes=dyn)))
            plain_cell = f"{100 * plain.delegated_share:5.1f}% in {plain.subgraphs:3d}"
            plain_share: float | None = plain.delegated_share
        except Exception as exc:  # the plain path fails on some (RegNet): say so
            plain_cell, plain_share = f"FAILS ({type(exc).__name__})", None
        plain_s = time.perf_counter() - t
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            res = dx.export(model, args, out_dir=tmp, name="m", strict=True, cache=False, dynamic_shapes=dyn)
            dx_s = time.perf_counter() - t
            ok = dx.compare(res).ok
        if "xnnpack" not in res.artifacts:
            print(f"{case.name:24s} dx: no XNNPACK file ({res.errors})", flush=True)
            continue
        d = res.artifacts["xnnpack"].delegation
        rows.append((case.name, d.delegated_share, d.subgraphs, plain_share))
        print(
            f"{case.name:24s} dx {100 * d.delegated_share:5.1f}% in {d.subgraphs:3d} subgraph(s), parity "
            f"{'ok' if ok else 'FAIL'} ({dx_s:.0f} s)   plain {plain_cell} ({plain_s:.0f} s lowering)",
            flush=True,
        )
    shares = [r[1] for r in rows]
    plain_shares = [r[3] for r in rows if r[3] is not None]
    print(
        f"\n{'dynamic batch 1..8' if dynamic else 'static'}: median delegated share: dx {100 * statistics.median(shares):.1f}% over {len(shares)} models; "
        f"plain {100 * statistics.median(plain_shares):.1f}% over the {len(plain_shares)} it lowers"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
