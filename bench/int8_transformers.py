"""int8 on transformers, both runtimes, against what a user would run instead, in one run
(issue 24, item 5).

Models (random seeded weights, transformers' default attention): a BERT-base-shaped encoder
(hidden 768, 12 heads, FFN 3072, ``input_ids`` + padding ``attention_mask``, sequence 128), a
ViT-S-shaped classifier backbone (hidden 384, 6 heads, FFN 1536, 224 px, patch 16) and a
135M decoder (SmolLM2-135M's shape, full-sequence forward, 128 tokens). ``--layers N`` keeps each
layer's shape and shortens the stack (the published table says which it used).

Per model and runtime, latency per call (median over rounds that visit every file in turn, so a
load spike lands on all of them) and file sizes of:

* dualexport float, static int8 (PT2E, 8 calibration batches) and dynamic int8 (``int8-dynamic``:
  per-channel int8 weights, activations quantized at run time), each on ONNX Runtime and ExecuTorch;
* ONNX Runtime's own ``quantize_dynamic`` (per-channel int8 weights) on plain ``torch.onnx.export``'s
  float file;
* ExecuTorch's plain PT2E flow (``prepare_pt2e``/``convert_pt2e`` with the XNNPACKQuantizer's
  dynamic per-channel config, ``to_edge_transform_and_lower``), where it works (text models fail
  with the mask's integer ops: the failure is printed).

Each file's output is compared with the float model's (cosine), so a fast but wrong file shows.

The exports can share the machine (``--phase export --out DIR``); the timing wants it idle
(``--phase measure --out DIR``, which reads ``DIR/<model>/files.json``) and prints the markdown table.

Run: ``python bench/int8_transformers.py [--layers N] [--models bert vit decoder]``; not part of
``make bench`` (a BERT-base exported three times takes tens of minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time
import types
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
sys.path.insert(0, str(pathlib.Path(__file__).parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from _common import quiet  # noqa: E402
from _models import smollm2_135m  # noqa: E402
from _plain import latency_rounds, ort_runner, plain_lower, plain_onnx  # noqa: E402


# ----------------------------------------------------------------------------- models
class _Text(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)
        return out[0]


class _Vision(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=False)[0]


def _text_inputs(vocab: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, seq), generator=g)
    mask = torch.ones(1, seq, dtype=torch.long)
    mask[0, seq - seq // 8 :] = 0  # a padded tail
    return ids, mask


def bert(layers: int) -> tuple[nn.Module, Callable[[int], tuple[torch.Tensor, ...]]]:
    import transformers

    cfg = transformers.BertConfig(num_hidden_layers=layers)  # bert-base-uncased's shape
    torch.manual_seed(0)
    return _Text(transformers.BertModel(cfg, add_pooling_layer=False).eval()).eval(), lambda s: _text_inputs(
        cfg.vocab_size, 128, s
    )


def vit(layers: int) -> tuple[nn.Module, Callable[[int], tuple[torch.Tensor, ...]]]:
    import transformers

    cfg = transformers.ViTConfig(
        hidden_size=384, num_hidden_layers=layers, num_attention_heads=6, intermediate_size=1536
    )
    torch.manual_seed(0)
    model = _Vision(transformers.ViTModel(cfg, add_pooling_layer=False).eval()).eval()
    return model, lambda s: (torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(s)),)


def decoder(layers: int) -> tuple[nn.Module, Callable[[int], tuple[torch.Tensor, ...]]]:
    model = smollm2_135m(min(layers, 30))
    return _Text(model).eval(), lambda s: _text_inputs(model.config.vocab_size, 128, s)


MODELS = {"bert": bert, "vit": vit, "decoder": decoder}


# ----------------------------------------------------------------------------- files
def _dx(model: nn.Module, args: tuple[Any, ...], out: pathlib.Path, quantize: str | None, calib: Any) -> Any:
    import dualexport as dx

    t = time.perf_counter()
    res = dx.export(model, args, out_dir=out, name="m", quantize=quantize, calibration=calib, cache=False)
    seconds = time.perf_counter() - t
    if res.errors:
        return f"failed: {dict(res.errors)}"
    return {t: res.artifacts[t].path for t in res.artifacts}, seconds


def _ort_quantize_dynamic(model: nn.Module, args: tuple[Any, ...], out: pathlib.Path) -> pathlib.Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out.mkdir(parents=True, exist_ok=True)
    plain_onnx(model, args, out / "plain.onnx")
    quantize_dynamic(
        str(out / "plain.onnx"), str(out / "plain.int8.onnx"), weight_type=QuantType.QInt8, per_channel=True
    )
    return out / "plain.int8.onnx"


def _plain_pt2e(model: nn.Module, args: tuple[Any, ...], out: pathlib.Path) -> pathlib.Path:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
    )
    graph = torch.export.export(model, args).module()
    prepared = prepare_pt2e(graph, quantizer)
    prepared(*args)
    converted = convert_pt2e(prepared)
    edge = plain_lower(torch.export.export(converted, args))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "plain.int8.pte"
    with open(path, "wb") as f:
        edge.to_executorch().write_to_file(f)
    return path


def _float_output(model: nn.Module, args: tuple[Any, ...]) -> torch.Tensor:
    with torch.no_grad():
        return model(*args).float()


def et_runner(path: pathlib.Path, inputs: list[torch.Tensor]) -> Callable[[], Any]:
    """dualexport's ExecuTorch runner for every .pte (a big program keeps its weights in a .ptd,
    which ``executorch.runtime`` 1.4.1 cannot take: it crashes loading the method without it)."""
    from dualexport.runtimes.executorch import ExecuTorchRunner

    runner = ExecuTorchRunner(path)
    return lambda: runner.run(inputs)


def _file_mb(path: pathlib.Path) -> float:
    """What a user ships: the file and its weights beside it (``.onnx.data``, a big program's ``.ptd``)."""
    parts = {path, *path.parent.glob(path.name + ".*")} | (
        {path.with_suffix(".ptd")} if path.suffix == ".pte" else set()
    )
    return sum(p.stat().st_size for p in parts if p.is_file()) / 1e6


def _cosine(a: Any, b: torch.Tensor) -> float:
    a = torch.as_tensor(a).float().flatten()
    return min(1.0, float(torch.nn.functional.cosine_similarity(a.double(), b.flatten().double(), dim=0)))


# ----------------------------------------------------------------------------- the run
LABELS = ("dx float", "dx static int8", "dx dynamic int8", "ORT quantize_dynamic", "plain PT2E dynamic")


def export_model(name: str, layers: int, out: pathlib.Path) -> None:
    """Every file of one model, listed in ``out/name/files.json`` for the measuring phase."""
    model, inputs = MODELS[name](layers)
    args = inputs(0)
    params = sum(p.numel() for p in model.parameters())
    print(f"\n== {name}: {layers} layers, {params / 1e6:.0f} M parameters", flush=True)
    calib = [inputs(s) for s in range(1, 9)]
    listing: dict[str, Any] = {
        "layers": layers,
        "params_m": params / 1e6,
        "files": {},
        "seconds": {},
        "fails": {},
    }
    for label, quantize in (
        ("dx float", None),
        ("dx static int8", "int8"),
        ("dx dynamic int8", "int8-dynamic"),
    ):
        done = _dx(
            model, args, out / name / label.replace(" ", "_"), quantize, calib if quantize == "int8" else None
        )
        if isinstance(done, str):
            listing["fails"][label] = done
            print(f"{label}: {done}")
            continue
        paths, seconds = done
        listing["files"][label] = {t: str(p) for t, p in paths.items()}
        listing["seconds"][label] = seconds
        print(f"export {label:22s} {seconds:6.1f} s", flush=True)
    for label, make in (
        ("ORT quantize_dynamic", lambda: {"onnx": _ort_quantize_dynamic(model, args, out / name / "ort")}),
        ("plain PT2E dynamic", lambda: {"xnnpack": _plain_pt2e(model, args, out / name / "pt2e")}),
    ):
        t = time.perf_counter()
        try:
            listing["files"][label] = {k: str(v) for k, v in make().items()}
            listing["seconds"][label] = time.perf_counter() - t
            print(f"export {label:22s} {listing['seconds'][label]:6.1f} s", flush=True)
        except Exception as exc:  # the plain flow's own failure is a result here
            listing["fails"][label] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            print(f"{label}: fails: {listing['fails'][label]}")
    (out / name / "files.json").write_text(json.dumps(listing, indent=1))


def measure_model(name: str, out: pathlib.Path, calls: int, rounds: int) -> list[str]:
    """Latency of every file of one model, per runtime in interleaved rounds; markdown rows."""
    listing = json.loads((out / name / "files.json").read_text())
    model, inputs = MODELS[name](listing["layers"])
    args = inputs(0)
    want = _float_output(model, args)
    del model
    rows = []
    for target, make_runner in (("onnx", ort_runner), ("xnnpack", et_runner)):
        runners: dict[str, Callable[[], Any]] = {}
        cosine: dict[str, float] = {}
        size: dict[str, float] = {}
        for label in LABELS:
            path_s = listing["files"].get(label, {}).get(target)
            if path_s is None:
                continue
            path = pathlib.Path(path_s)
            runners[label] = make_runner(path, list(args))
            cosine[label] = _cosine(runners[label]()[0], want)
            size[label] = _file_mb(path)
        medians = latency_rounds(runners, calls=calls, rounds=rounds)
        base = medians.get("dx float")
        runtime = "ONNX Runtime" if target == "onnx" else "ExecuTorch"
        for label, median in medians.items():
            vs_float = f"{median / base:.2f}x" if base else ""
            vs_anchor = ""
            anchor = "ORT quantize_dynamic" if target == "onnx" else "plain PT2E dynamic"
            if label == "dx dynamic int8" and anchor in medians:
                vs_anchor = f"{median / medians[anchor]:.2f}x"
            row = (
                f"| {name} ({listing['layers']} layers, {listing['params_m']:.0f} M) | {runtime} | {label} | "
                f"{size[label]:.1f} | {cosine[label]:.5f} | {median * 1e3:.2f} | {vs_float} | {vs_anchor} |"
            )
            print(row, flush=True)
            rows.append(row)
        for label in LABELS:
            if label in listing["fails"] and (
                label.startswith("dx") or (label == "ORT quantize_dynamic") == (target == "onnx")
            ):
                rows.append(
                    f"| {name} | {runtime} | {label} | fails: {listing['fails'][label][:90]} | | | | |"
                )
        del runners
    return rows


HEADER = (
    "| model | runtime | file | MB | cosine vs float | median ms | / dx float | dx dynamic / plain |\n"
    "|---|---|---|---:|---:|---:|---:|---:|"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12, help="layers per model (the decoder keeps at most 30)")
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--calls", type=int, default=5, help="calls per file per round")
    ap.add_argument("--rounds", type=int, default=11, help="rounds, each visiting every file of a runtime")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--phase",
        choices=("all", "export", "measure"),
        default="all",
        help="export the files (may share the machine), measure them (wants it idle), or both",
    )
    ns = ap.parse_args()
    quiet()
    out = pathlib.Path(ns.out or tempfile.mkdtemp(prefix="int8_transformers_"))
    print(f"{os.cpu_count()} cores, torch threads {torch.get_num_threads()}, files in {out}")
    if ns.phase in ("all", "export"):
        for name in ns.models:
            export_model(name, ns.layers, out)
    if ns.phase in ("all", "measure"):
        rows = [row for name in ns.models for row in measure_model(name, out, ns.calls, ns.rounds)]
        print("\n" + HEADER + "\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
