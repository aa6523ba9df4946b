"""Artifact latency per call: ONNX Runtime, ExecuTorch and eager PyTorch, for the plain path's
files and for dx.export's files with DEFAULT_PASSES, measured side by side in one run.

Usage: python bench/bench_latency.py
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import fmt, quiet, ratio


def main() -> None:
    quiet()
    import torch

    import dualexport as dx
    from _models import ENC_D, ENC_LAYERS, ENC_SEQ, MODELS
    from _plain import et_runner, latency, ort_runner, plain_onnx, plain_pte
    from dualexport.shared_state.passes import DEFAULT_PASSES

    print(
        f"per-call latency, min/median/max over 3 batches of calls after a warm-up; encoder "
        f"{ENC_LAYERS} layers d={ENC_D} seq {ENC_SEQ} (issue: d=512); BERT tiny config"
    )
    for name, build in MODELS.items():
        model, args = build()
        calls = 20 if name == "encoder" else 100
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp)
            plain_onnx(model, args, out / "plain.onnx")
            plain_pte(model, args, out / "plain.pte")
            res = dx.export(model, args, out_dir=out, name="opt", transforms=DEFAULT_PASSES, strict=True)
            lat = {}
            with torch.no_grad():  # first: ORT/ExecuTorch thread pools would compete with it
                lat["eager"] = latency(lambda m=model, a=args: m(*a), calls=calls)
            lat["ort plain"] = latency(ort_runner(out / "plain.onnx", args), calls=calls)
            lat["ort dx+passes"] = latency(ort_runner(res.artifacts["onnx"].path, args), calls=calls)
            lat["et plain"] = latency(et_runner(out / "plain.pte", args), calls=calls)
            lat["et dx+passes"] = latency(et_runner(res.artifacts["xnnpack"].path, args), calls=calls)
        print(f"\n== {name}")
        for k, v in lat.items():
            print(f"{k:>14}: {fmt(v)}")
        print(f"ORT latency ratio dx+passes/plain       : {ratio(lat['ort dx+passes'], lat['ort plain'])}")
        print(f"ExecuTorch latency ratio dx+passes/plain: {ratio(lat['et dx+passes'], lat['et plain'])}")
        print(f"ExecuTorch dx+passes / eager            : {ratio(lat['et dx+passes'], lat['eager'])}")
        print(f"ORT dx+passes / eager                   : {ratio(lat['ort dx+passes'], lat['eager'])}")


if __name__ == "__main__":
    main()
