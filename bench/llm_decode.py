"""Decode and prefill speed of ``dx.export_llm`` files, both runtimes, at max_seq_len 512, printed
as ratios against the plain design measured in the same run (issue 19, step 1: the cache design).

Three exports of one decoder (SmolLM2-135M's shape by default, random seeded weights):

* **(a) dualexport**: ``dx.export_llm`` (explicit cache in/out, one XNNPACK delegate);
* **(a) plain**: ``dx.export_llm(optimize=False)``: the same explicit-cache program as the libraries
  lower it (transformers' SDPA, ``index_copy`` cache update, no dualexport pass);
* **(b) buffers**: the cache in mutable buffers updated in place with ``index_copy_`` (no cache
  input/output): ExecuTorch updates them in place, dualexport's ONNX exporter lifts them to
  state inputs/outputs that its runner feeds back (``OrtRunner.state``).

Run: ``python bench/llm_decode.py [--layers N] [--prompt P] [--new N]``; not part of ``make bench``
(three exports of a 135M model take tens of minutes on 2 cores). ``--layers 6`` keeps the shape of
every layer and shortens the stack.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time
import types
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))

import torch  # noqa: E402

import dualexport as dx  # noqa: E402
from dualexport.llm import DecoderSession  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import add_decoder_args, greedy_timing  # noqa: E402
from _models import smollm2_135m  # noqa: E402


class BufferCacheDecoder(torch.nn.Module):
    """Design (b): ``forward(input_ids, cache_position) -> logits`` with the cache in one pair of
    buffers per layer (a slice of one buffer would be written back whole, once per layer)."""

    def __init__(self, model: torch.nn.Module, layers: int, kv_heads: int, t: int, d: int) -> None:
        super().__init__()
        self.model, self.layers = model, layers
        for i in range(layers):
            self.register_buffer(f"k{i}", torch.zeros(1, kv_heads, t, d))
            self.register_buffer(f"v{i}", torch.zeros(1, kv_heads, t, d))

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        from dualexport.llm.cache import ExplicitCache

        ks = [getattr(self, f"k{i}") for i in range(self.layers)]
        vs = [getattr(self, f"v{i}") for i in range(self.layers)]
        cache = ExplicitCache(ks, vs, cache_position, [False] * self.layers)  # type: ignore[arg-type]
        for layer, k, v in zip(cache.explicit, ks, vs, strict=True):
            layer.update = _in_place(k, v, cache_position)  # type: ignore[method-assign]
        out = self.model(input_ids=input_ids, position_ids=cache_position.unsqueeze(0), past_key_values=cache)
        return out.logits


def _in_place(k: torch.Tensor, v: torch.Tensor, position: torch.Tensor) -> Any:
    def update(key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        k.index_copy_(2, position, key)
        v.index_copy_(2, position, value)
        return k, v

    return update


def run_a(path: pathlib.Path, prompt: list[int], new: int) -> tuple[float, float, list[int]]:
    prefill, steps, tokens = greedy_timing(DecoderSession.open(path), prompt, new)
    return len(prompt) / prefill, 1 / statistics.median(steps), tokens


def run_b(target: str, path: pathlib.Path, prompt: list[int], new: int) -> tuple[float, float, list[int]]:
    from dualexport.runtimes import open_runner

    def fresh() -> Any:
        return open_runner(target, path, isolated=False)

    runner = fresh()
    runner.run([torch.tensor([prompt[:4]]), torch.arange(4)])  # warm-up (then a fresh cache)
    runner = fresh()
    t0 = time.perf_counter()
    logits = runner.run([torch.tensor([prompt]), torch.arange(len(prompt))])[0][0, -1]
    prefill = time.perf_counter() - t0
    tokens, steps, pos = [], [], len(prompt)
    for _ in range(new):
        tokens.append(int(logits.argmax()))
        t = time.perf_counter()
        logits = runner.run([torch.tensor([[tokens[-1]]]), torch.tensor([pos])])[0][0, -1]
        steps.append(time.perf_counter() - t)
        pos += 1
    return len(prompt) / prefill, 1 / statistics.median(steps), tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_decoder_args(ap)
    ns = ap.parse_args()
    out = pathlib.Path(ns.out or tempfile.mkdtemp(prefix="llm_decode_"))
    model = smollm2_135m(ns.layers)
    prompt = torch.randint(0, 49152, (ns.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    print(
        f"SmolLM2-135M shape, {ns.layers} layers, max_seq_len {ns.max_seq_len}, prompt {ns.prompt}, "
        f"{ns.new} new tokens, torch threads {torch.get_num_threads()}, files in {out}"
    )
    exports: dict[str, Any] = {}
    for name, optimize in (("a", True), ("a_plain", False)):
        t = time.perf_counter()
        res = dx.export_llm(
            model, max_seq_len=ns.max_seq_len, out_dir=out / name, name="m", optimize=optimize
        )
        d = res.artifacts["xnnpack"].delegation if "xnnpack" in res.artifacts else None
        print(
            f"export {name}: {time.perf_counter() - t:.0f} s "
            f"({', '.join(f'{k} {v:.0f} s' for k, v in res.seconds.items())}); errors {dict(res.errors)}; "
            + (f"XNNPACK {d.subgraphs} subgraphs, {100 * d.delegated_share:.1f}% delegated" if d else "")
        )
        exports[name] = res
    from dualexport.llm.wrapper import probe_layout

    layout = probe_layout(model, ns.max_seq_len)
    buffers = BufferCacheDecoder(
        model, layout.layers, layout.kv_heads, ns.max_seq_len, layout.head_dim
    ).eval()
    seq = torch.export.Dim("seq", min=1, max=ns.max_seq_len - 1)
    t = time.perf_counter()
    with torch.no_grad():
        res_b = dx.export(
            buffers,
            (torch.zeros(1, 8, dtype=torch.long), torch.arange(8)),
            dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
            out_dir=out / "b",
            name="m",
        )
    d = res_b.artifacts["xnnpack"].delegation if "xnnpack" in res_b.artifacts else None
    print(
        f"export b: {time.perf_counter() - t:.0f} s; errors {dict(res_b.errors)}; "
        + (f"XNNPACK {d.subgraphs} subgraphs, {100 * d.delegated_share:.1f}% delegated" if d else "")
    )
    rows: dict[tuple[str, str], tuple[float, float, list[int]]] = {}
    for target, suffix in (("onnx", ".onnx"), ("xnnpack", ".pte")):
        for name in ("a", "a_plain"):
            rows[name, target] = run_a(out / name / f"m{suffix}", prompt, ns.new)
        if target in res_b.artifacts:
            rows["b", target] = run_b(target, res_b.artifacts[target].path, prompt, ns.new)
    for (name, target), (pre, dec, toks) in rows.items():
        same = toks == rows["a", target][2]
        print(
            f"{target:8s} {name:8s} prefill {pre:8.1f} tok/s   decode {dec:6.2f} tok/s   "
            f"tokens {'= (a)' if same else '!= (a)'}"
        )
    for target in ("onnx", "xnnpack"):
        a, plain = rows["a", target], rows["a_plain", target]
        line = f"{target}: (a) / (a) plain: prefill {a[0] / plain[0]:.2f}x, decode {a[1] / plain[1]:.2f}x"
        if ("b", target) in rows:
            b = rows["b", target]
            line += f"; (b) / (a): prefill {b[0] / a[0]:.2f}x, decode {b[1] / a[1]:.2f}x"
        print(line)


if __name__ == "__main__":
    main()
