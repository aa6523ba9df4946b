"""``make demo``: export the shipped TinyConvNet to both targets and print the delegation table,
the weight check and the parity table (what the CLI's ``export --compare`` prints)."""

from __future__ import annotations

import argparse
import sys

import torch

from . import api
from .display import console, print_export, print_parity
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
    print_export(out, res, res.verify_weights())
    report = api.compare(res)
    print_parity(out, report)
    return 0 if report.ok and not res.errors else 1


if __name__ == "__main__":
    sys.exit(main())
