"""Generation speed and memory of ``dx.export_llm`` files against what a user would pick instead,
measured in one run (issue 19, item 7).

One decoder (SmolLM2-135M's shape by default, random seeded weights), fp32 and int4, on both
runtimes:

* **dualexport**: ``dx.export_llm(model, max_seq_len=...)`` and ``quantize="int4"`` (8-bit dynamic
  activations, int4 weights in groups of 32; one set of codes in both files; the .onnx at
  ``MatMulNBits`` accuracy level 4, the entry point's default: ONNX Runtime's int8 kernel
  quantizes the float activations itself); on ONNX Runtime also the int4 .onnx made with
  ``ExportOptions(onnx_int4_accuracy_level=0)`` (fp32 arithmetic on the dequantized weights: the
  program's own numerics, opt-in);
* **ONNX Runtime anchor**: onnxruntime-genai's model builder (``python -m
  onnxruntime_genai.models.builder -i FOLDER -p fp32|int4 -e cpu``) on the same weights saved as a
  local model folder, run by onnxruntime-genai's own generator loop;
* **ExecuTorch anchor**: the plain library path on the same cache wrapper: ``torch.export``,
  ``to_edge_transform_and_lower(XnnpackPartitioner())``, ``to_executorch``; int4 as ExecuTorch's
  ``export_llama -qmode 8da4w`` quantizes (torchao ``quantize_`` with
  ``Int8DynamicActivationIntxWeightConfig(int4, PerGroup(32))`` on every linear the group divides).

Each file is measured in a child process of its own (peak RSS is that process's; the figure after
imports is printed beside it, since the dualexport runners import torch and onnxruntime-genai does
not): prefill tokens/s over the prompt, decode tokens/s as the median of single-token steps, and the
greedy tokens (the fp32 rows should agree with each other). Export times are wall seconds on this
machine.

Run: ``python bench/llm_generation.py [--layers N] [--prompt P] [--new N] [--max-seq-len T]
[--runtimes ORT|ExecuTorch]`` (one runtime: only its files are exported and measured); each
file is measured in ``--repeat`` rounds (default 3; medians, and the range of decode); not part
of ``make bench`` (six exports of a 135M model take tens of minutes on 2 cores).
``--layers 4`` keeps the shape of every layer and shortens the stack. On 2 cores the exports of the
full model take most of an hour; ``--out DIR --reuse`` keeps finished exports, so a second run with
``--only "plain ExecuTorch int4"`` (same ``--out``) can export on the other core meanwhile, and the
measuring run waits for it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import types
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
sys.path.insert(0, str(pathlib.Path(__file__).parent))


# ----------------------------------------------------------------------------- the model
def save_folder(model: Any, folder: pathlib.Path) -> None:
    """The model as a local folder the builder reads: weights, config and a word-level tokenizer
    (the builder writes the tokenizer beside the model; generation here feeds ids directly)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    model.save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(model.config.vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2"
    )
    fast.save_pretrained(folder)


# ----------------------------------------------------------------------------- the exports
def export_dualexport(
    model: Any,
    out: pathlib.Path,
    max_seq_len: int,
    quantize: str | None,
    targets: tuple[str, ...] = ("onnx", "xnnpack"),
    accuracy_level: int | None = None,
) -> dict[str, Any]:
    import dualexport as dx
    from dualexport.exporters.base import ExportOptions

    t = time.perf_counter()
    res = dx.export_llm(
        model,
        max_seq_len=max_seq_len,
        out_dir=out,
        name="m",
        target=targets,
        quantize=quantize,
        options=ExportOptions(onnx_int4_accuracy_level=accuracy_level),
    )
    seconds = time.perf_counter() - t
    row: dict[str, Any] = {"seconds": seconds}
    if res.errors:  # a row of the table, not the end of the run
        row["error"] = "; ".join(f"{t}: {str(e).splitlines()[0]}" for t, e in res.errors.items())
    if "onnx" in res.artifacts:
        row["onnx"] = str(res.artifacts["onnx"].path)
    if "xnnpack" in res.artifacts:
        d = res.artifacts["xnnpack"].delegation
        row["pte"] = str(res.artifacts["xnnpack"].path)
        row["delegation"] = f"{100 * d.delegated_share:.1f}% in {d.subgraphs} subgraph(s)" if d else "?"
    return row


def export_plain_executorch(model: Any, out: pathlib.Path, max_seq_len: int, int4: bool) -> dict[str, Any]:
    """The libraries alone on the same wrapper (``index_copy`` cache update, no dualexport pass)."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from dualexport.llm.wrapper import DecoderWithCache, dynamic_shapes, example_inputs, probe_layout

    t = time.perf_counter()
    layout = probe_layout(model, max_seq_len)
    if int4:
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
        from torchao.quantization.granularity import PerGroup

        model = copy.deepcopy(model)
        quantize_(
            model,
            Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)),
            filter_fn=lambda m, _: isinstance(m, torch.nn.Linear) and m.weight.shape[1] % 32 == 0,
        )
    wrapper = DecoderWithCache(model, layout.sliding, "index_copy").eval()
    with torch.no_grad():
        program = torch.export.export(wrapper, example_inputs(layout), dynamic_shapes=dynamic_shapes(layout))
        lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
        et = lowered.to_executorch()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "m.pte"
    path.write_bytes(et.buffer)
    return {"seconds": time.perf_counter() - t, "pte": str(path), "layout": layout.to_json()}


def export_genai(folder: pathlib.Path, out: pathlib.Path, precision: str) -> dict[str, Any]:
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(out)]
    cmd += ["-p", precision, "-e", "cpu", "-c", str(out.parent / "genai_cache")]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"onnxruntime-genai builder failed:\n{run.stderr[-3000:]}")
    return {"seconds": time.perf_counter() - t, "folder": str(out)}


def _export_once(folder: pathlib.Path, export: Any, *, reuse: bool) -> dict[str, Any]:
    """One export, or with ``--reuse`` the one already in ``folder`` (its ``export.json``, written
    last): two runs sharing ``--out`` split the exports between the cores, and the run that measures
    waits for a folder another run is still writing (its ``.exporting`` marker)."""
    done, busy = folder / "export.json", folder / ".exporting"
    if reuse:
        while busy.exists() and not done.exists():
            time.sleep(10)
        if done.exists():
            row: dict[str, Any] = json.loads(done.read_text())
            return row
        folder.mkdir(parents=True, exist_ok=True)
        busy.touch()
    try:
        row = export()
    finally:
        busy.unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps(row))
    return row


# ----------------------------------------------------------------------------- measuring (child)
def _rss_mb() -> float:
    """This process's peak RSS (VmHWM starts again at exec; ``ru_maxrss`` would carry the
    parent's peak, the exporting process's, into every child)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def measure_dualexport_session(
    path: str, layout_json: str | None, prompt: list[int], new: int
) -> dict[str, Any]:
    import torch  # noqa: F401  (imports counted in the baseline)

    from _common import greedy_timing
    from dualexport.llm import DecoderSession
    from dualexport.llm.layout import LlmLayout
    from dualexport.runtimes import open_runner

    base = _rss_mb()
    if layout_json is None:
        session = DecoderSession.open(path)
    else:
        session = DecoderSession(
            open_runner("xnnpack", path, isolated=False), LlmLayout.from_json(layout_json)
        )
    prefill, steps, tokens = greedy_timing(session, prompt, new)
    return _row(len(prompt) / prefill, steps, tokens, base)


def measure_genai(folder: str, prompt: list[int], new: int) -> dict[str, Any]:
    import numpy as np
    import onnxruntime_genai as og

    base = _rss_mb()
    model = og.Model(folder)

    def generator(max_length: int) -> Any:
        params = og.GeneratorParams(model)
        # greedy; min_length keeps an end-of-sequence id of the random weights from stopping early
        params.set_search_options(do_sample=False, max_length=max_length, min_length=max_length)
        return og.Generator(model, params)

    warm = generator(8)
    warm.append_tokens(np.array([prompt[:4]], dtype=np.int32))
    del warm
    gen = generator(len(prompt) + new)
    t0 = time.perf_counter()
    gen.append_tokens(np.array([prompt], dtype=np.int32))
    prefill = time.perf_counter() - t0
    tokens, steps = [int(gen.get_next_tokens()[0])], []
    for _ in range(new - 1):
        t = time.perf_counter()
        gen.generate_next_token()
        steps.append(time.perf_counter() - t)
        tokens.append(int(gen.get_next_tokens()[0]))
    return _row(len(prompt) / prefill, steps, tokens, base)


def _row(prefill: float, steps: list[float], tokens: list[int], base: float) -> dict[str, Any]:
    return {
        "prefill": prefill,
        "decode": 1 / statistics.median(steps),
        "tokens": tokens,
        "rss": _rss_mb(),
        "base": base,
    }


def measure(kind: str, path: str, layout: str | None, prompt: list[int], new: int) -> dict[str, Any]:
    """One file in a fresh child process: its own peak RSS, no cache shared with another run."""
    args = [sys.executable, __file__, "--measure", kind, path, "--prompt-ids", ",".join(map(str, prompt))]
    args += ["--new", str(new)] + (["--layout", layout] if layout else [])
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        return {
            "error": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit {run.returncode}"
        }
    row: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return row


def child(ns: argparse.Namespace) -> None:
    prompt = [int(x) for x in ns.prompt_ids.split(",")]
    kind, path = ns.measure
    if kind == "genai":
        row = measure_genai(path, prompt, ns.new)
    else:
        row = measure_dualexport_session(path, ns.layout, prompt, ns.new)
    print(json.dumps(row))


# ----------------------------------------------------------------------------- the run
def main() -> None:
    from _common import add_decoder_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_decoder_args(ap)
    ap.add_argument("--runtimes", default="ORT,ExecuTorch", help="ORT, ExecuTorch or both")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="with --out: keep exports already in it (each folder's export.json); another run "
        "exporting the same folder is waited for",
    )
    ap.add_argument("--only", help="export only the files whose name contains this, then stop")
    ap.add_argument(
        "--repeat", type=int, default=3, help="measuring rounds (each file once per round; medians)"
    )
    ap.add_argument("--measure", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--prompt-ids", help=argparse.SUPPRESS)
    ap.add_argument("--layout", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.measure:
        return child(ns)
    _run(ns)


def _run(ns: argparse.Namespace) -> None:
    import logging
    import warnings

    import torch

    from _models import smollm2_135m  # imports torch: not in the measuring children

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    out = pathlib.Path(ns.out or tempfile.mkdtemp(prefix="llm_generation_"))
    model = smollm2_135m(ns.layers)
    params = sum(p.numel() for p in model.parameters())
    prompt = torch.randint(
        3, model.config.vocab_size, (ns.prompt,), generator=torch.Generator().manual_seed(1)
    )
    prompt_ids = prompt.tolist()
    print(
        f"SmolLM2-135M shape, {ns.layers} layers ({params / 1e6:.0f} M parameters), max_seq_len "
        f"{ns.max_seq_len}, prompt {ns.prompt}, {ns.new} new tokens, {os.cpu_count()} cores, files in {out}",
        flush=True,
    )
    save_folder(model, out / "hf")
    runtimes = {r.strip() for r in ns.runtimes.split(",")}
    ort, et = "ORT" in runtimes, "ExecuTorch" in runtimes
    targets = tuple(t for t, on in (("onnx", ort), ("xnnpack", et)) if on)
    jobs: dict[str, tuple[pathlib.Path, Any]] = {}
    for precision in ("fp32", "int4"):
        quantize = None if precision == "fp32" else "int4"
        d = out / f"dx_{precision}"
        jobs[f"dualexport {precision}"] = (
            d,
            lambda d=d, q=quantize: export_dualexport(model, d, ns.max_seq_len, q, targets),
        )
        if ort and quantize:
            d = out / f"dx_{precision}_l0"
            jobs[f"dualexport {precision} level 0"] = (
                d,
                lambda d=d, q=quantize: export_dualexport(
                    model, d, ns.max_seq_len, q, ("onnx",), accuracy_level=0
                ),
            )
        if et:
            d = out / f"et_{precision}"
            jobs[f"plain ExecuTorch {precision}"] = (
                d,
                lambda d=d, p=precision: export_plain_executorch(model, d, ns.max_seq_len, p == "int4"),
            )
        if ort:
            d = out / f"genai_{precision}"
            jobs[f"onnxruntime-genai {precision}"] = (
                d,
                lambda d=d, p=precision: export_genai(out / "hf", d, p),
            )
    only = [name for name in jobs if ns.only is None or ns.only in name]
    exports = {name: _export_once(*jobs[name], reuse=ns.reuse) for name in only}
    if ns.only is not None:
        return
    for name, e in exports.items():
        extra = f", XNNPACK {e['delegation']}" if "delegation" in e else ""
        extra += f", FAILED: {e['error']}" if "error" in e else ""
        print(f"export {name:24s} {e['seconds']:7.1f} s{extra}", flush=True)
    runs = [_measure_all(exports, prompt_ids, ns.new, ort, et) for _ in range(ns.repeat)]
    _print(_median_rows(runs))


def _median_rows(runs: list[dict[Any, Any]]) -> dict[Any, Any]:
    """Each file's median prefill and decode over the rounds (every file measured once per round,
    so a slow spell of the machine falls on all of them), with the decode range beside it."""
    rows: dict[Any, Any] = {}
    for key, first in runs[0].items():
        ok = [r[key] for r in runs if "error" not in r[key]]
        if not ok:
            rows[key] = first
            continue
        decode = [r["decode"] for r in ok]
        rows[key] = {
            **ok[0],
            "prefill": statistics.median(r["prefill"] for r in ok),
            "decode": statistics.median(decode),
            "rss": max(r["rss"] for r in ok),
            "spread": (min(decode), max(decode)),
        }
    return rows


def _measure_all(
    exports: dict[str, dict[str, Any]], prompt: list[int], new: int, ort: bool, et: bool
) -> dict[tuple[str, str], Any]:
    rows: dict[tuple[str, str], Any] = {}
    for precision in ("fp32", "int4"):
        dx_files = exports[f"dualexport {precision}"]
        if ort:
            genai = exports[f"onnxruntime-genai {precision}"]
            rows["ORT", f"dualexport {precision}"] = measure("dx", dx_files["onnx"], None, prompt, new)
            level0 = exports.get(f"dualexport {precision} level 0")
            if level0:
                rows["ORT", f"dualexport {precision} level 0"] = (
                    {"error": f"export: {level0['error']}"}
                    if "error" in level0
                    else measure("dx", level0["onnx"], None, prompt, new)
                )
            rows["ORT", f"onnxruntime-genai {precision}"] = measure(
                "genai", genai["folder"], None, prompt, new
            )
        if et:
            plain = exports[f"plain ExecuTorch {precision}"]
            rows["ExecuTorch", f"dualexport {precision}"] = measure("dx", dx_files["pte"], None, prompt, new)
            rows["ExecuTorch", f"plain ExecuTorch {precision}"] = measure(
                "dx", plain["pte"], plain["layout"], prompt, new
            )
    return rows


def _print(rows: dict[tuple[str, str], Any]) -> None:
    print(
        f"\n{'runtime':11s} {'file':26s} {'prefill tok/s':>13s} {'decode tok/s':>12s} {'peak RSS':>9s} "
        f"{'(after imports)':>15s}  {'decode range':>13s}  greedy tokens vs dualexport's ONNX file"
    )
    for (runtime, name), row in rows.items():
        if "error" in row:
            print(f"{runtime:11s} {name:26s} FAILED: {row['error']}")
            continue
        precision = "int4" if "int4" in name else "fp32"
        reference = rows.get(("ORT", f"dualexport {precision}"), {}).get("tokens") or []
        same = sum(a == b for a, b in zip(row["tokens"], reference, strict=False))
        lo, hi = row.get("spread", (row["decode"], row["decode"]))
        print(
            f"{runtime:11s} {name:26s} {row['prefill']:13.1f} {row['decode']:12.2f} {row['rss']:7.0f} MB "
            f"{row['base']:12.0f} MB  {lo:6.2f}-{hi:<6.2f}  {same}/{len(row['tokens'])} equal"
        )
    print()
    for runtime, anchor in (("ORT", "onnxruntime-genai"), ("ExecuTorch", "plain ExecuTorch")):
        if (runtime, "dualexport fp32") not in rows:
            continue
        for ours_name, precision in (
            ("dualexport fp32", "fp32"),
            ("dualexport int4", "int4"),
            ("dualexport int4 level 0", "int4"),
        ):
            ours, theirs = rows.get((runtime, ours_name)), rows[runtime, f"{anchor} {precision}"]
            if ours is None or "error" in ours or "error" in theirs:
                continue
            print(
                f"{runtime:10s} {ours_name}: / {anchor} {precision}: decode "
                f"{ours['decode'] / theirs['decode']:.2f}x, prefill {ours['prefill'] / theirs['prefill']:.2f}x, "
                f"peak RSS above imports {(ours['rss'] - ours['base']) / max(theirs['rss'] - theirs['base'], 1):.2f}x"
            )
        fp32, int4 = rows[runtime, "dualexport fp32"], rows[runtime, "dualexport int4"]
        if "error" not in fp32 and "error" not in int4:
            print(
                f"{runtime:10s} dualexport int4 / fp32: decode {int4['decode'] / fp32['decode']:.2f}x, "
                f"prefill {int4['prefill'] / fp32['prefill']:.2f}x"
            )


if __name__ == "__main__":
    main()
