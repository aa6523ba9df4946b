"""What the group offsets of ``int4`` cost XNNPACK per decode step, against ``int4-sym`` (the
scheme of ExecuTorch's own 8da4w export) measured in the same run (issue 50).

A stack of SmolLM2-135M-shaped projections (q, k, v, o, gate, up, down per layer; hidden 576,
kv 192, intermediate 1536; a 49152-row head), random weights, one token per call (decode), each
scheme quantized by ``llm.quantize.quantize_linears`` and lowered by dualexport's XNNPACK exporter.
``int4`` holds a 4-bit GGUF grid exactly with one float offset per group of 32, which the program
writes as ``linear(group_sums(x), offsets)`` plus an ``add`` per projection: 18 small ops per layer
that XNNPACK dispatches one by one. Variants: the head 8-bit or 4-bit, q/k/v and gate/up packed
into one projection each, and ExecuTorch's threadpool at 1 or 2 threads (its per-op dispatch is
what the small ops pay).

Run: ``python bench/xnnpack_offsets.py [--layers 30] [--repeat 7] [--out DIR]`` (lowering the
eight files takes a few minutes on 2 cores; ``--out`` keeps them for a second run). Prints each
file's median time per call (min of the rounds' medians too) and its ratio to ``int4-sym`` at the
same packing and threads.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import statistics
import sys
import time

import torch
from torch import nn

HIDDEN, KV, INTER, VOCAB = 576, 192, 1536, 49152


class Block(nn.Module):
    def __init__(self, packed: bool) -> None:
        super().__init__()
        self.packed = packed
        if packed:
            self.qkv = nn.Linear(HIDDEN, HIDDEN + 2 * KV, bias=False)
            self.gu = nn.Linear(HIDDEN, 2 * INTER, bias=False)
        else:
            self.q = nn.Linear(HIDDEN, HIDDEN, bias=False)
            self.k = nn.Linear(HIDDEN, KV, bias=False)
            self.v = nn.Linear(HIDDEN, KV, bias=False)
            self.g = nn.Linear(HIDDEN, INTER, bias=False)
            self.u = nn.Linear(HIDDEN, INTER, bias=False)
        self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.d = nn.Linear(INTER, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            q, k, v = self.qkv(x).split([HIDDEN, KV, KV], -1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        x = x + self.o(q + torch.cat([k, v, k], -1))
        if self.packed:
            g, u = self.gu(x).split([INTER, INTER], -1)
        else:
            g, u = self.g(x), self.u(x)
        return x + self.d(g * u)


class Stack(nn.Module):
    def __init__(self, layers: int, packed: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(packed) for _ in range(layers))
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def lower(scheme: object, layers: int, packed: bool, path: pathlib.Path) -> None:
    from dualexport import ExportOptions
    from dualexport.exporters.xnnpack import XnnpackExporter
    from dualexport.llm.quantize import quantize_linears

    torch.manual_seed(0)
    model = Stack(layers, packed).eval()
    for p in model.parameters():
        p.data.mul_(0.3)
    program = quantize_linears(torch.export.export(model, (torch.randn(1, 1, HIDDEN),)), scheme)  # type: ignore[arg-type]
    exporter = XnnpackExporter()
    options = ExportOptions()
    exporter.lower(exporter.decompose(program, options), path.parent, path.stem, options)


def main() -> int:
    import torchao.quantization.quant_primitives  # noqa: F401  (torch.ops.torchao)

    from dualexport.llm.quantize import SCHEMES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=7, help="rounds (medians of 40 calls each)")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/xnnpack_offsets"))
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    schemes = {
        "int4-sym": SCHEMES["int4-sym"],
        "int4 (default: offsets, 8-bit head)": SCHEMES["int4"],
        "int4 offsets, 4-bit head": dataclasses.replace(SCHEMES["int4"], head=None),
        "int4-sym, 8-bit head": dataclasses.replace(SCHEMES["int4-sym"], head="int8"),
    }
    files: dict[tuple[str, bool], pathlib.Path] = {}
    for i, (label, scheme) in enumerate(schemes.items()):
        for packed in (False, True):
            path = ns.out / f"s{i}_{ns.layers}{'_packed' if packed else ''}.pte"
            if not path.exists():
                print(f"lowering {label}{' (packed)' if packed else ''} ...", flush=True)
                lower(scheme, ns.layers, packed, path)
            files[label, packed] = path
    from executorch.extension.pybindings import portable_lib

    x = torch.randn(1, 1, HIDDEN)
    print(f"\n{ns.layers} layers, one token per call, medians of {ns.repeat} rounds")
    print(f"{'threads':>7} {'packed':>6}  {'file':<38} {'ms/call':>8} {'min':>7} {'vs int4-sym':>11}")
    for threads in (2, 1):
        portable_lib._unsafe_reset_threadpool(threads)
        mods = {key: portable_lib._load_for_executorch(str(path)) for key, path in files.items()}
        times: dict[tuple[str, bool], list[float]] = {key: [] for key in mods}
        for _ in range(ns.repeat):
            for key, mod in mods.items():
                calls = []
                for _ in range(40):
                    t = time.perf_counter()
                    mod.forward((x,))
                    calls.append(time.perf_counter() - t)
                times[key].append(statistics.median(calls[5:]) * 1e3)
        for (label, packed), values in times.items():
            base = statistics.median(times["int4-sym", packed])
            med = statistics.median(values)
            print(
                f"{threads:>7} {'yes' if packed else 'no':>6}  {label:<38} {med:>8.3f} {min(values):>7.3f} "
                f"{med / base:>10.2f}x",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
