"""dualexport's .pte files against optimum-executorch's, measured in one run (issue 19, item 7).

optimum-executorch pins a transformers release candidate, so it lives in a venv of its own
(``python -m venv V; V/bin/pip install optimum-executorch torch==2.13.0 executorch==1.4.1``:
it resolves to optimum-executorch 1.1.0 with transformers 5.0.0rc1 and the same torch and
ExecuTorch as ours). Its files are made by its CLI on the local model folder that
``bench/llm_generation.py --out DIR`` saved (``DIR/hf``), with its fast path on (custom SDPA and
the cache updated in place by a custom op, ``--use_custom_sdpa --use_custom_kv_cache``), fp32 and
``--qlinear 8da4w --qlinear_group_size 32``:

    optimum-cli export executorch -m DIR/hf --task text-generation --recipe xnnpack \\
        --use_custom_sdpa --use_custom_kv_cache --max_seq_len 512 [--qlinear 8da4w ...] -o DIR/oet_fp32

Each file is measured in a child process of its own, ``--repeat`` rounds with every file once per
round (medians, and the range of decode): prefill tokens/s over the prompt, decode tokens/s as the
median of single-token greedy steps (the same loop as ``bench/llm_generation.py``; optimum's
files are driven through its own ``ExecuTorchModelForCausalLM.forward``).

Run: ``python bench/optimum_executorch.py --out DIR --optimum-python V/bin/python`` after
``bench/llm_generation.py --out DIR`` (its dualexport files ``DIR/dx_fp32/m.pte``,
``DIR/dx_int4/m.pte`` are the ones measured); not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))


def measure_optimum(folder: str, prompt: list[int], new: int) -> dict[str, Any]:
    """In optimum-executorch's venv: its model class, its forward, our timing loop."""
    import torch
    from optimum.executorch import ExecuTorchModelForCausalLM

    from _common import greedy_timing
    from llm_generation import _row, _rss_mb

    base = _rss_mb()
    model = ExecuTorchModelForCausalLM.from_pretrained(folder)

    class Session:
        """``step(ids) -> logits [n, vocab]`` over optimum's forward; its cache is a buffer the
        file updates in place, so a reset only moves the position back."""

        position = 0

        def step(self, ids: list[int]) -> Any:
            n = len(ids)
            logits = model.forward(
                input_ids=torch.tensor([ids], dtype=torch.long),
                cache_position=torch.arange(self.position, self.position + n, dtype=torch.long),
            )
            self.position += n
            return logits.reshape(-1, logits.shape[-1])

        def reset(self) -> None:
            self.position = 0

    prefill, steps, tokens = greedy_timing(Session(), prompt, new)
    return _row(len(prompt) / prefill, steps, tokens, base)


def _child(python: str, kind: str, path: str, prompt: list[int], new: int) -> dict[str, Any]:
    script = HERE / ("optimum_executorch.py" if kind == "optimum" else "llm_generation.py")
    args = [python, str(script), "--measure", kind, path, "--prompt-ids", ",".join(map(str, prompt))]
    args += ["--new", str(new)]
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        tail = run.stderr.strip().splitlines()
        return {"error": tail[-1] if tail else f"exit {run.returncode}"}
    row: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="the folder bench/llm_generation.py --out wrote")
    ap.add_argument("--optimum-python", help="the python of the venv with optimum-executorch")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--prompt-ids", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.measure:
        prompt_ids = [int(x) for x in ns.prompt_ids.split(",")]
        print(json.dumps(measure_optimum(ns.measure[1], prompt_ids, ns.new)))
        return
    if not ns.out or not ns.optimum_python:
        ap.error("--out and --optimum-python are required")
    out = pathlib.Path(ns.out)
    vocab = json.loads((out / "hf" / "config.json").read_text())["vocab_size"]
    import torch

    prompt = torch.randint(3, vocab, (ns.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    files = {
        "dualexport fp32": (sys.executable, "dx", str(out / "dx_fp32" / "m.pte")),
        "optimum-executorch fp32": (ns.optimum_python, "optimum", str(out / "oet_fp32")),
        "dualexport int4": (sys.executable, "dx", str(out / "dx_int4" / "m.pte")),
        "optimum-executorch int4 (8da4w)": (ns.optimum_python, "optimum", str(out / "oet_int4")),
    }
    from llm_generation import _median_rows

    runs = [{name: _child(*f, prompt, ns.new) for name, f in files.items()} for _ in range(ns.repeat)]
    rows = _median_rows(runs)
    print(f"ExecuTorch, {ns.repeat} rounds, prompt {ns.prompt}, {ns.new} new tokens, {os.cpu_count()} cores")
    print(f"{'file':34s} {'prefill tok/s':>13s} {'decode tok/s':>12s} {'decode range':>13s} {'peak RSS':>9s}")
    for name, row in rows.items():
        if "error" in row:
            print(f"{name:34s} FAILED: {row['error']}")
            continue
        lo, hi = row["spread"]
        print(
            f"{name:34s} {row['prefill']:13.1f} {row['decode']:12.2f} {lo:6.2f}-{hi:<6.2f} "
            f"{row['rss']:7.0f} MB (after imports {row['base']:.0f})"
        )
    for precision, theirs in (
        ("fp32", "optimum-executorch fp32"),
        ("int4", "optimum-executorch int4 (8da4w)"),
    ):
        a, b = rows[f"dualexport {precision}"], rows[theirs]
        if "error" in a or "error" in b:
            continue
        same = sum(x == y for x, y in zip(a["tokens"], b["tokens"], strict=False))
        print(
            f"dualexport / optimum-executorch {precision}: decode {a['decode'] / b['decode']:.2f}x, "
            f"prefill {a['prefill'] / b['prefill']:.2f}x; greedy tokens equal {same}/{len(a['tokens'])}"
        )


if __name__ == "__main__":
    main()
