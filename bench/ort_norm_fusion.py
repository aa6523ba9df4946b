"""ONNX Runtime decode speed of an ``export_llm`` .onnx with and without its RMSNorms written in
the form ORT fuses (``onnx_fixes.pooled_means_as_last_dim_means`` and the ``x * rsqrt`` ->
``x / sqrt`` rule of ``onnx_passes.py``), both files exported and measured in the same run.

Why: issue 19's ORT decode gap against onnxruntime-genai. Before, each RMSNorm stayed nine nodes
in ORT's optimized session (two Reshapes around a ReduceMean, Pow, Add, Sqrt, Reciprocal, Mul,
Mul); now it is one ``SimplifiedLayerNormalization``.

Run: ``python bench/ort_norm_fusion.py [--layers N] [--prompt P] [--new N]`` (SmolLM2-135M's
shape, fp32, max_seq_len 512 by default); not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import pathlib
import statistics
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import add_decoder_args, greedy_timing, quiet


@contextlib.contextmanager
def _unfused() -> Iterator[None]:
    """The ONNX target as it was: the pooled mean kept, no rsqrt rule."""
    import types

    import dualexport.exporters.onnx_fixes as fixes
    import dualexport.exporters.onnx_passes as passes

    saved = fixes.pooled_means_as_last_dim_means, passes._rsqrt_product_as_division
    fixes.pooled_means_as_last_dim_means = lambda program: program  # type: ignore[assignment]
    passes._rsqrt_product_as_division = lambda: types.SimpleNamespace(rules=())  # type: ignore[assignment]
    try:
        yield
    finally:
        fixes.pooled_means_as_last_dim_means, passes._rsqrt_product_as_division = saved


def _optimized_ops(path: pathlib.Path) -> collections.Counter[str]:
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.optimized_model_filepath = str(path.with_suffix(".optimized.onnx"))
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    model = onnx.load(so.optimized_model_filepath, load_external_data=False)
    return collections.Counter(n.op_type for n in model.graph.node)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_decoder_args(ap)
    ap.add_argument("--rounds", type=int, default=3, help="alternating measurements of each file")
    ns = ap.parse_args()
    quiet()
    import torch

    import dualexport as dx
    from _models import smollm2_135m
    from dualexport.llm import DecoderSession

    out = pathlib.Path(ns.out or tempfile.mkdtemp(prefix="ort_norm_fusion_"))
    model = smollm2_135m(ns.layers)
    prompt = torch.randint(
        3, model.config.vocab_size, (ns.prompt,), generator=torch.Generator().manual_seed(1)
    )
    files: dict[str, pathlib.Path] = {}
    for label in ("fused", "unfused"):
        with _unfused() if label == "unfused" else contextlib.nullcontext():
            res = dx.export_llm(
                model, max_seq_len=ns.max_seq_len, out_dir=out / label, name="m", target=("onnx",)
            )
        files[label] = pathlib.Path(res.artifacts["onnx"].path)
    print(f"SmolLM2-135M shape, {ns.layers} layers, fp32, max_seq_len {ns.max_seq_len}, prompt {ns.prompt}")
    for label, path in files.items():
        ops = _optimized_ops(path)
        print(
            f"  {label:8s} ORT optimized graph: {sum(ops.values())} nodes, "
            f"SimplifiedLayerNormalization {ops['SimplifiedLayerNormalization']}, ReduceMean {ops['ReduceMean']}"
        )
    sessions = {label: DecoderSession.open(path) for label, path in files.items()}
    decode: dict[str, list[float]] = {label: [] for label in files}
    prefill: dict[str, list[float]] = {label: [] for label in files}
    tokens: dict[str, list[int]] = {}
    for _ in range(ns.rounds):
        for label, session in sessions.items():
            session.reset()
            p, steps, toks = greedy_timing(session, prompt.tolist(), ns.new)
            decode[label].append(1 / statistics.median(steps))
            prefill[label].append(len(prompt) / p)
            tokens[label] = toks
    rows: dict[str, Any] = {
        label: (statistics.median(decode[label]), statistics.median(prefill[label])) for label in files
    }
    for label, (d, p) in rows.items():
        print(f"  {label:8s} decode {d:8.2f} tok/s   prefill {p:8.1f} tok/s")
    same = sum(a == b for a, b in zip(tokens["fused"], tokens["unfused"], strict=True))
    print(
        f"fused / unfused: decode {rows['fused'][0] / rows['unfused'][0]:.2f}x, "
        f"prefill {rows['fused'][1] / rows['unfused'][1]:.2f}x; greedy tokens equal {same}/{ns.new}"
    )


if __name__ == "__main__":
    main()
