"""The default artifacts against the plain libraries', side by side in one run, per model:

- XNNPACK delegated share and subgraph count (dualexport's default export, every pass on, against
  torch.export + to_edge_transform_and_lower);
- per-call latency of each artifact in its runtime: ONNX Runtime (dualexport's .onnx against
  plain ``torch.onnx.export``'s, optimizer on), ExecuTorch (against the plain .pte), and
  ExecuTorch / ONNX Runtime for dualexport's files;
- the dual-export wall time: ``dx.export(cache=False)`` (one trace, both targets, manifest, proofs)
  against the plain path (torch.onnx.export + torch.export + lowering + serialization).

Models: the issue's TransformerEncoder (6 layers, d=512, seq 32, static) and tiny BERT, GPT-2, ViT
and Llama (the HF zoo's configs, random weights, static shapes), plus two torchvision classifiers.
Usage: python bench/bench_default_artifacts.py [MODEL ...]
"""

from __future__ import annotations

import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "tests"))
from _common import fmt, quiet, ratio


def _models() -> dict:
    import torch

    from _models import Encoder

    def encoder():  # the size
        torch.manual_seed(0)
        return Encoder(6, 512, 8, 2048).eval(), (torch.randn(1, 32, 512),)

    def hf(name: str):
        def build():
            from zoo.hf import HF_CASES

            case = next(c for c in HF_CASES if c.name == name)
            torch.manual_seed(0)
            args, _ = case.inputs()
            return case.factory().eval(), args

        return build

    def vision(name: str):
        def build():
            from zoo.vision import VISION_CASES

            case = next(c for c in VISION_CASES if c.name == name)
            args, _ = case.inputs()
            return case.factory(), args

        return build

    return {
        "encoder-6x512": encoder,
        "bert": hf("hf_bert"),
        "gpt2": hf("hf_gpt2"),
        "vit": hf("hf_vit"),
        "llama": hf("hf_llama"),
        "mobilenet_v2": vision("tv_mobilenet_v2"),
        "resnet18": vision("tv_resnet18"),
    }


def main(argv: list[str]) -> None:
    quiet()
    import types

    sys.modules.setdefault(
        "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
    )
    import torch

    import dualexport as dx
    from _plain import delegation, et_runner, latency, ort_runner, plain_onnx, plain_pte

    models = _models()
    chosen = argv or list(models)
    print("latency: per call, min/median/max over 3 batches after a warm-up; export: one cold run each")
    summary = []
    for name in chosen:
        model, args = models[name]()
        calls = 20 if name.startswith(("encoder", "resnet", "mobilenet")) else 100
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp)
            t = time.perf_counter()
            plain_onnx(model, args, out / "plain.onnx")
            edge = plain_pte(model, args, out / "plain.pte")
            plain_s = time.perf_counter() - t
            plain_d = delegation(edge)
            del edge
            t = time.perf_counter()
            res = dx.export(model, args, out_dir=out / "dx", name="m", strict=True, cache=False)
            dx_s = time.perf_counter() - t
            d = res.artifacts["xnnpack"].delegation
            lat = {}
            with torch.no_grad():
                lat["eager"] = latency(lambda m=model, a=args: m(*a), calls=calls)
            lat["ort plain"] = latency(ort_runner(out / "plain.onnx", args), calls=calls)
            lat["ort dx"] = latency(ort_runner(res.artifacts["onnx"].path, args), calls=calls)
            lat["et plain"] = latency(et_runner(out / "plain.pte", args), calls=calls)
            lat["et dx"] = latency(et_runner(res.artifacts["xnnpack"].path, args), calls=calls)
        print(f"\n== {name}")
        print(
            f"XNNPACK delegation    dx: {100 * d.delegated_share:5.1f}% in {d.subgraphs} subgraph(s)   "
            f"plain: {100 * plain_d.delegated_share:5.1f}% in {plain_d.subgraphs}"
        )
        for k, v in lat.items():
            print(f"{k:>10}: {fmt(v)}")
        ort_r = lat["ort dx"][1] / lat["ort plain"][1]
        et_r = lat["et dx"][1] / lat["et plain"][1]
        print(f"ORT latency dx/plain        : {ratio(lat['ort dx'], lat['ort plain'])}")
        print(f"ExecuTorch latency dx/plain : {ratio(lat['et dx'], lat['et plain'])}")
        print(f"ExecuTorch / ORT (dx files) : {ratio(lat['et dx'], lat['ort dx'])}")
        print(
            f"dual-export wall time       : dx {dx_s:.1f} s, plain {plain_s:.1f} s, ratio {dx_s / plain_s:.2f}x"
        )
        summary.append(
            (
                name,
                d.delegated_share,
                d.subgraphs,
                plain_d.delegated_share,
                plain_d.subgraphs,
                ort_r,
                et_r,
                dx_s / plain_s,
            )
        )
    print(
        "\nmodel            dx share  subgraphs  plain share  subgraphs  ORT dx/plain  ET dx/plain  wall dx/plain"
    )
    for n, s, g, ps, pg, o, e, w in summary:
        print(
            f"{n:16s} {100 * s:7.1f}%  {g:9d}  {100 * ps:10.1f}%  {pg:9d}  {o:12.2f}x  {e:11.2f}x  {w:12.2f}x"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
