"""Cost of ``dx.compare`` against one plain ORT + ExecuTorch run of the same inputs.

Prints time ratios (median, with min/max) measured side by side in one run, and the peak RSS of
each path measured in its own child process. Usage: python bench/bench_compare.py
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import fmt, timed

CHILD = r"""
import json, sys, pathlib, torch
sys.path.insert(0, {bench!r})
from _common import peak_rss_mb
import dualexport as dx
from dualexport.examples import TinyConvNet
out = pathlib.Path({out!r})
x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
mode = {mode!r}
if mode == "plain":
    import onnxruntime as ort
    from executorch.runtime import Runtime
    base = peak_rss_mb()
    s = ort.InferenceSession(str(out / "m.onnx"), providers=["CPUExecutionProvider"])
    s.run(None, {{s.get_inputs()[0].name: x.numpy()}})
    Runtime.get().load_program(str(out / "m.pte")).load_method("forward").execute([x])
else:
    from dualexport.parity.folder import compare_dir
    base = peak_rss_mb()
    compare_dir(out, name="m")
print(json.dumps({{"peak": peak_rss_mb(), "base": base}}))
"""


def main() -> None:
    import onnxruntime as ort
    import torch
    from executorch.runtime import Runtime

    import dualexport as dx
    from dualexport.examples import TinyConvNet

    with tempfile.TemporaryDirectory() as d:
        out = pathlib.Path(d)
        x = torch.randn(1, 3, 32, 32)
        res = dx.export(TinyConvNet(), (x,), out_dir=out, name="m")
        assert not res.errors

        def plain() -> None:
            s = ort.InferenceSession(str(out / "m.onnx"), providers=["CPUExecutionProvider"])
            s.run(None, {s.get_inputs()[0].name: x.numpy()})
            Runtime.get().load_program(str(out / "m.pte")).load_method("forward").execute([x])

        def ours() -> None:
            dx.compare(res)

        t_plain, t_ours = timed(plain), timed(ours)
        print(f"plain ORT + ExecuTorch run : {fmt(t_plain)}")
        print(f"dx.compare (eager+ORT+ET)  : {fmt(t_ours)}")
        print(
            f"time ratio compare/plain   : median {t_ours[1] / t_plain[1]:.2f}x "
            f"(min {t_ours[0] / t_plain[0]:.2f}x, max {t_ours[2] / t_plain[2]:.2f}x)"
        )
        rss = {}
        for mode in ("plain", "compare"):
            code = CHILD.format(bench=str(pathlib.Path(__file__).parent), out=str(out), mode=mode)
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            data = json.loads(proc.stdout.strip().splitlines()[-1])
            rss[mode] = data["peak"] - data["base"]
        print(
            f"peak RSS above import baseline: plain {rss['plain']:.0f} MB, compare {rss['compare']:.0f} MB "
            f"(ratio {rss['compare'] / max(rss['plain'], 1):.2f}x)"
        )


if __name__ == "__main__":
    main()
