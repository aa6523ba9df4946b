"""The CLI's decoder commands (``export-llm``, ``generate``), registered by ``cli.py``.

In a module of their own so the two commands can change without touching the others; the exit
codes are cli.py's (0 ok, 1 a check failed, 2 bad input: raised errors are mapped by cli.main,
3 a target failed).
"""

from __future__ import annotations

import argparse
from typing import Any

from .display import StageProgress, console, print_delegation, print_timings, print_weights
from .errors import InputError, WeightMismatchError

__all__ = ["add_llm_commands"]

_OK, _CHECK_FAILED, _TARGET_FAILED = 0, 1, 3


def _print_quantization(out: Any, res: Any) -> None:
    """What was quantized, what stayed float32 and why, and each file's size against the same
    weights in float32."""
    import pathlib

    from .llm.quantize import quantization_summary

    summary = quantization_summary(res.program.exported_program)
    for line in summary.lines():
        out.print(f"quantized: {line}", markup=False)
    if not summary.float_linears:
        out.print("quantized: every linear")
    for t, art in res.artifacts.items():
        size = sum(pathlib.Path(f).stat().st_size for f in art.files if pathlib.Path(f).is_file())
        out.print(
            f"{t}: {size / 1e6:.1f} MB = {size / max(summary.fp32_bytes, 1):.2f}x the float32 weights "
            f"({summary.fp32_bytes / 1e6:.1f} MB)"
        )


def _tokenizer_source(ns: argparse.Namespace) -> Any:
    """``--tokenizer``, else the model reference when it holds one (a .gguf file, a folder with
    the tokenizer's files); None otherwise (a config .json, MODULE:ATTR)."""
    import pathlib

    from .llm.loading import is_hub_id

    if ns.tokenizer:
        return ns.tokenizer
    if is_hub_id(ns.model):
        return ns.model
    path = pathlib.Path(ns.model)
    if path.suffix == ".gguf" and path.is_file():
        return path
    if path.is_dir() and any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return path
    return None


def _print_deploy(out: Any, deploy: Any) -> None:
    """The deploy folder's files, each file's proof, and what was not written."""
    if deploy is None:
        return
    from .llm.deploy.folder import RUNNER_TARGETS

    for target, proof in deploy.proofs.items():
        took = deploy.seconds.get(RUNNER_TARGETS.get(target, target))
        out.print(
            f"[green]{target}[/] (runner file): {proof.file}, proven against {proof.against} on "
            f"{len(proof.walks)} generation walks ({proof.describe()})"
            + (f" ({took:.1f} s)" if took is not None else "")
        )
        attention = deploy.attention.get(target)
        if attention:
            out.print(f"  attention: {attention}", markup=False)
        delegation = deploy.delegation.get(target)
        if delegation is not None:
            out.print(
                f"  XNNPACK: {delegation.subgraphs} delegate(s), "
                f"{100 * delegation.delegated_share:.1f}% of compute ops",
                markup=False,
            )
        found = deploy.weights.get(target)
        if found:
            counts = ", ".join(f"{n} {status}" for status, n in sorted(found.items()))
            out.print(f"  weights (read back from the file): {counts}", markup=False)
    for target, why in deploy.skipped.items():
        out.print(f"[yellow]{target}[/]: no runner file: {why}")
    shipped = ", ".join(p.name for p in deploy.files)
    out.print(f"deploy folder {deploy.folder}: {shipped}", markup=False)


def _cmd_export_llm(ns: argparse.Namespace) -> int:
    from .exporters.base import ExportOptions
    from .llm import export_llm, load_decoder

    out = console()
    model = load_decoder(ns.model, seed=ns.seed, attention=ns.attention)
    with StageProgress(out, f"exporting {ns.model} (max_seq_len {ns.max_seq_len}) to {ns.target}"):
        res = export_llm(
            model,
            max_seq_len=ns.max_seq_len,
            out_dir=ns.out,
            name=ns.name,
            target=ns.target,
            quantize=None if ns.quantize == "none" else ns.quantize,
            optimize=not ns.plain,
            options=ExportOptions(onnx_int4_accuracy_level=ns.ort_int4_accuracy_level),
            deploy=not ns.no_deploy,
            tokenizer=_tokenizer_source(ns) if not ns.no_deploy else None,
            explicit_pte=ns.explicit_pte,
        )
    print_timings(out, res.timings)
    for t, art in res.artifacts.items():
        out.print(f"[green]{t}[/]: {art.path} ({art.seconds:.1f} s)")
    for t, err in res.errors.items():
        out.print(f"[bold red]{t} failed[/]: {err}")
    print_delegation(out, res)
    if ns.quantize != "none" and res.program is not None:
        _print_quantization(out, res)
    code = _OK
    check, werr = None, None
    try:
        check = res.verify_weights()
    except WeightMismatchError as exc:
        werr, code = exc, _CHECK_FAILED
    print_weights(out, res.manifest, check, werr)
    _print_deploy(out, res.deploy)
    if ns.compare and res.artifacts:
        from .llm.parity import generation_parity
        from .outputs import atomic_write_text

        report = generation_parity(res, model, max_new_tokens=ns.compare_tokens)
        out.print(report.to_markdown(), markup=False)
        atomic_write_text(res.out_dir / f"{res.name}.generation.json", report.to_json())
        if not report.ok:
            code = _CHECK_FAILED
    return _TARGET_FAILED if res.errors else code


def _ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError as exc:
        raise InputError(
            f"--ids {text!r} is not a comma-separated list of ints", hint="e.g. --ids 1,2,3"
        ) from exc


def _deploy_file(path: Any, runtime: str) -> Any:
    """The file of ``runtime`` in a deploy folder, or ``path`` itself when it is a file."""
    if not path.is_dir():
        return path
    suffix = ".pte" if runtime == "xnnpack" else ".onnx"
    files = sorted(path.glob(f"*{suffix}"))
    if not files:
        raise InputError(f"{path} holds no {suffix} file", hint="pass a folder written by export-llm")
    return files[0]


def _cmd_generate(ns: argparse.Namespace) -> int:
    import pathlib

    from .llm import generate

    out = console()
    path = pathlib.Path(ns.file)
    if (ns.prompt is None) == (ns.ids is None):
        raise InputError("pass --prompt TEXT or --ids 1,2,3 (one of them)", hint="e.g. --prompt 'Hello'")
    if ns.ids is not None:
        if ns.chat:
            raise InputError("--chat applies to --prompt", hint="drop --chat, or pass --prompt TEXT")
        prompt_ids = _ids(ns.ids)
        tokens = generate(
            _deploy_file(path, ns.runtime),
            prompt_ids,
            max_new_tokens=ns.max_new_tokens,
            stop_at_eos=not ns.no_eos,
        )
        ids = [int(t) for t in tokens[0]]
        out.print(f"prompt: {ids[: len(prompt_ids)]}\nnew:    {ids[len(prompt_ids) :]}", markup=False)
        return _OK
    if not path.is_dir():
        text = generate(
            path, ns.prompt, max_new_tokens=ns.max_new_tokens, stop_at_eos=not ns.no_eos, chat=ns.chat
        )
        out.print(text, markup=False)
        return _OK
    from .llm.deploy.runners import RUNTIMES, run_runner
    from .llm.deploy.tokenizer import folder_tokenizer, render_chat

    prompt = render_chat(folder_tokenizer(path), ns.prompt) if ns.chat else ns.prompt
    answer = run_runner(path, prompt, runtime=ns.runtime, max_new_tokens=ns.max_new_tokens)
    out.print(answer.text, markup=False)
    out.print(
        f"[dim]{RUNTIMES[ns.runtime]}: {answer.new_tokens} tokens after a {answer.prompt_tokens}-token "
        f"prompt; first token {answer.first_token_s * 1000:.0f} ms, decode {answer.decode_tok_s:.1f} tok/s[/]"
    )
    return _OK


def _add_deploy_arguments(e: argparse.ArgumentParser) -> None:
    """export-llm's options of the deploy folder."""
    e.add_argument(
        "--tokenizer",
        default=None,
        help="the tokenizer to ship (a model folder or .gguf file); default: the model's own",
    )
    e.add_argument(
        "--no-deploy",
        action="store_true",
        help="write only dualexport's explicit-cache files (no runner files, no tokenizer)",
    )
    e.add_argument(
        "--explicit-pte",
        action="store_true",
        help="also make the explicit-cache .pte of a deploy export (by default its only .pte is "
        "the runner file, made and proven from the shared program)",
    )


def add_llm_commands(sub: Any, common: argparse.ArgumentParser, epilog: str) -> None:
    """Add ``export-llm`` and ``generate`` to the CLI's subparsers."""
    fmt = argparse.RawDescriptionHelpFormatter
    e = sub.add_parser(
        "export-llm",
        help="export a decoder for generation (cache in/out, prefill and decode from one program)",
        parents=[common],
        epilog=epilog,
        formatter_class=fmt,
    )
    e.add_argument(
        "model",
        help="a transformers config .json (random seeded weights), a local model folder, a .gguf file, "
        "a Hugging Face Hub id (org/name; from the local cache when offline), or MODULE:ATTR",
    )
    e.add_argument("--max-seq-len", type=int, required=True, help="positions the cache holds (prompt + new)")
    e.add_argument("--out", default="dualexport_out", help="output folder")
    e.add_argument("--name", default="model", help="file name stem of the artifacts")
    e.add_argument("--target", default="onnx,xnnpack", help="onnx, xnnpack or onnx,xnnpack")
    e.add_argument("--quantize", default="none", choices=("none", "int8", "int4", "int4-sym"))
    e.add_argument(
        "--ort-int4-accuracy-level",
        type=int,
        default=None,
        choices=(0, 4),
        help="quantized .onnx: 4 is ONNX Runtime's int8 kernel (default: the activations quantized "
        "per block inside it, proven against the program quantizing them so); 0 computes the "
        "program's own per-token activations in float (2.7x slower per linear)",
    )
    e.add_argument("--seed", type=int, default=0, help="seed of random weights (config files)")
    e.add_argument(
        "--attention",
        default=None,
        choices=("sdpa", "eager"),
        help="attention of the reference model (config files, model folders); default: transformers' own",
    )
    e.add_argument(
        "--compare",
        action="store_true",
        help="generation parity: greedy tokens of both files vs the model, teacher-forced logits",
    )
    e.add_argument(
        "--compare-tokens", type=int, default=8, metavar="N", help="new tokens per prompt (--compare)"
    )
    e.add_argument("--plain", action="store_true", help="turn every dualexport pass off")
    _add_deploy_arguments(e)
    e.set_defaults(func=_cmd_export_llm)
    g = sub.add_parser(
        "generate",
        help="greedy generation from an export-llm folder through the runtime's own LLM runner "
        "(or from one file through dualexport's loop)",
        parents=[common],
        epilog=epilog,
        formatter_class=fmt,
    )
    g.add_argument("file", help="the folder export-llm wrote (its runners), or one .onnx or .pte of it")
    g.add_argument("--prompt", default=None, help="the prompt as text (tokenized by the folder's tokenizer)")
    g.add_argument("--chat", action="store_true", help="wrap --prompt in the tokenizer's chat template")
    g.add_argument(
        "--runtime",
        default="xnnpack",
        choices=("xnnpack", "onnx"),
        help="for a folder: ExecuTorch's TextLLMRunner (xnnpack) or onnxruntime-genai (onnx)",
    )
    g.add_argument("--ids", default=None, help="prompt token ids instead of text, e.g. 1,2,3")
    g.add_argument("-n", "--max-new-tokens", type=int, default=20)
    g.add_argument("--no-eos", action="store_true", help="do not stop at the model's end-of-sequence ids")
    g.set_defaults(func=_cmd_generate)
