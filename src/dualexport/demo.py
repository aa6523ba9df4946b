"""``make demo``: export the shipped TinyConvNet to both targets and print the delegation table,
the weight check and the parity table (what the CLI's ``export --compare`` prints)."""

from __future__ import annotations

import argparse
import sys

import torch

from . import api
from .display import console, print_delegation, print_parity, print_weights
from .examples import TinyConvNet


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="demo_out")
    ns = p.parse_args()
    out = console()
    res = api.export(
        TinyConvNet(),
        (torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)),),
        out_dir=ns.out,
        name="tinyconvnet",
    )
    for t, art in res.artifacts.items():
        out.print(f"[green]{t}[/]: {art.path} ({art.seconds:.1f} s)")
    for t, err in res.errors.items():
        out.print(f"[bold red]{t} failed[/]: {err}")
    print_delegation(out, res)
    check = res.verify_weights()
    print_weights(out, res.manifest, check, None)
    report = api.compare(res)
    print_parity(out, report)
    return 0 if report.ok and not res.errors else 1


if __name__ == "__main__":
    sys.exit(main())
