"""``make demo``: export the shipped TinyConvNet to both targets and print the delegation table,
the weight check and the parity table (the same as the CLI's ``export --compare``)."""

from __future__ import annotations

import argparse
import sys

from .cli import main as cli_main


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="demo_out")
    ns = p.parse_args()
    return cli_main(["export", "dualexport.examples:TinyConvNet", "--input", "1x3x32x32:float32",
                     "--target", "onnx,xnnpack", "--out", ns.out, "--name", "tinyconvnet", "--compare"])


if __name__ == "__main__":
    sys.exit(main())
