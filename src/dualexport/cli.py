"""The ``dualexport`` command: export MODULE:ATTR or a .pt2 to both targets, or re-check a folder.

Exit codes (README): 0 all good, 1 a parity or weight check failed, 2 bad usage or input,
3 a target failed to export, 4 an internal error (a bug in dualexport or a library it drives; the
message says so). With ``export --strict`` any target failure raises and nothing is committed.
``-v`` (before or after the subcommand) logs progress, shows other libraries' warnings and log
lines (captured otherwise) and prints each error's chained causes.
"""

from __future__ import annotations

import argparse
import gc
import logging
import pathlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .display import StageProgress, console, print_export, print_parity, print_weights
from .errors import DualExportError, InputError, InternalError, ParityError, UserError, WeightMismatchError

if TYPE_CHECKING:
    from .loading import load_model, parse_input_spec

__all__ = ["main", "parse_input_spec", "load_model"]


def __getattr__(name: str) -> Any:
    """``parse_input_spec`` and ``load_model`` (from ``loading``, which imports torch) on first
    use: ``dualexport batch`` must reach its fork server before torch is imported."""
    if name in ("parse_input_spec", "load_model"):
        from . import loading

        return getattr(loading, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_TARGET_FAILED, EXIT_INTERNAL = 0, 1, 2, 3, 4
#: Ctrl-C, as shells report a process ended by SIGINT (128 + 2)
EXIT_INTERRUPTED = 130

EXIT_CODES = """exit codes:
  0  all good
  1  a parity or weight check failed
  2  bad usage or input (the message says what to try)
  3  a target failed to export (its error names the op, the node and the model line)
  4  an internal error: a bug in dualexport or a library it drives, not in your input
  130  interrupted (Ctrl-C): nothing of the run was published"""


def _export_source(ns: argparse.Namespace) -> tuple[Any, tuple[Any, ...] | None, Any]:
    """The model (a module, or a program from a .pt2), its example inputs (None: the program's
    own) and the dynamic shapes, from ``MODEL``, ``--input`` and ``--dynamic``."""
    from .loading import (
        build_dynamic_shapes,
        is_program_ref,
        load_model,
        load_program,
        parse_dynamic,
        parse_input,
    )

    specs = [parse_input(s) for s in ns.input]
    if is_program_ref(ns.model):
        if ns.dynamic:
            raise InputError(
                "--dynamic was given with a .pt2: a program's dynamic ranges are the ones it was exported with",
                hint="drop --dynamic, or export the module with the ranges you want and save that program",
            )
        program = load_program(ns.model)
        args = tuple(spec.make(seed=i) for i, spec in enumerate(specs)) if specs else None
        return program, args, None
    model = load_model(ns.model)
    if not specs:
        raise InputError(
            "at least one --input SHAPE:DTYPE is required", hint="e.g. --input 1x3x224x224:float32"
        )
    args = tuple(spec.make(seed=i) for i, spec in enumerate(specs))
    dynamic = build_dynamic_shapes([parse_dynamic(d) for d in ns.dynamic], specs, model=model)
    return model, args, dynamic


def _calibration(ns: argparse.Namespace, source: Any, args: tuple[Any, ...] | None) -> list[Any] | None:
    """``--calibration FILE`` or ``--calibration-random N`` (only with ``--quantize``)."""
    given = ns.calibration is not None or ns.calibration_random is not None
    if ns.quantize is None:
        if given:
            raise InputError(
                "--calibration/--calibration-random were given without --quantize",
                hint="add --quantize int8, or drop the calibration option",
            )
        return None
    if ns.quantize == "int8-dynamic":
        if given:
            raise InputError(
                "--quantize int8-dynamic quantizes activations at run time and takes no calibration",
                hint="drop --calibration/--calibration-random, or use --quantize int8 (static)",
            )
        return None
    if ns.calibration is not None and ns.calibration_random is not None:
        raise InputError("--calibration and --calibration-random were both given", hint="pass one of them")
    if not given:
        raise InputError(
            f"--quantize {ns.quantize} needs calibration data",
            hint="pass --calibration FILE (a torch.save'd list of input tuples) or --calibration-random N",
        )
    from .loading import load_calibration, random_calibration

    if ns.calibration is not None:
        return load_calibration(ns.calibration)
    if args is None:  # a program's own example inputs
        example = getattr(source, "example_inputs", None)
        args = tuple(example[0]) if example is not None else ()
    if not args:
        raise InputError(
            "--calibration-random needs example inputs to shape the sets",
            hint="pass --input SHAPE:DTYPE, or --calibration FILE",
        )
    return random_calibration(args, ns.calibration_random)


def _options(items: Sequence[str]) -> Any:
    """``--option FIELD=VALUE`` (repeatable) into ``dx.ExportOptions``: booleans as true/false,
    integers, and none/auto for the fields whose default None means "decide"."""
    import dataclasses

    from .exporters import ExportOptions

    if not items:
        return None
    fields = {f.name: str(f.type) for f in dataclasses.fields(ExportOptions)}
    values: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key, text = key.strip().replace("-", "_"), text.strip().lower()
        kind = fields.get(key)
        if not sep or kind is None:
            raise InputError(
                f"--option {item!r}: expected FIELD=VALUE with FIELD one of ExportOptions' fields",
                hint="fields: " + ", ".join(fields),
            )
        if text in ("none", "auto") and "None" in kind:
            values[key] = None
        elif kind.startswith("bool") and text in ("true", "yes", "1", "on", "false", "no", "0", "off"):
            values[key] = text in ("true", "yes", "1", "on")
        elif kind.startswith("int") and text.lstrip("-").isdigit():
            values[key] = int(text)
        else:
            raise InputError(
                f"--option {item!r}: {key} takes {kind}, not {text!r}",
                hint="booleans as true/false, integers as digits, none/auto where the type allows None",
            )
    return ExportOptions(**values)


def _cmd_export(ns: argparse.Namespace) -> int:
    from . import api
    from .loading import load_callable

    out = console()
    source, args, dynamic = _export_source(ns)
    calibration = _calibration(ns, source, args)
    transforms = [load_callable(ref) for ref in ns.transform]
    with StageProgress(out, f"exporting {ns.model} to {ns.target}"):
        res = api.export(
            source,
            args,
            target=ns.target,
            out_dir=ns.out,
            name=ns.name,
            dynamic_shapes=dynamic,
            transforms=transforms,
            quantize=ns.quantize,
            calibration=calibration,
            strict=ns.strict,
            require_full_delegation=ns.require_full_delegation,
            optimize=not ns.plain,
            cache=not ns.no_cache,
            options=_options(ns.option),
            bundle=ns.bundle,
        )
    from .reporting import CompareSettings, check_export

    with out.status("checking the files ..."):
        checked = check_export(res, compare=CompareSettings() if ns.compare else None, page=ns.html)
    print_export(out, res, checked.weights, checked.weight_error)
    if checked.report is not None:
        print_parity(out, checked.report)
    if checked.parity_error is not None:
        raise checked.parity_error
    if checked.page is not None:
        out.print(f"report: {checked.page}")
    code = EXIT_OK if checked.ok else EXIT_CHECK_FAILED
    if res.errors:
        code = EXIT_TARGET_FAILED
        if any(isinstance(e, InternalError) for e in res.errors.values()):
            code = EXIT_INTERNAL
        if ns.verbose:
            for err in res.errors.values():
                _print_causes(err)
    return code


#: A batch's exit code: the worst entry decides (a target that failed outranks bad input, which
#: outranks a failed check).
_BATCH_EXIT = {
    "passed": EXIT_OK,
    "check_failed": EXIT_CHECK_FAILED,
    "invalid": EXIT_USAGE,
    "error": EXIT_USAGE,
    "failed": EXIT_TARGET_FAILED,
    "timeout": EXIT_TARGET_FAILED,
    "killed": EXIT_TARGET_FAILED,
}
_EXIT_RANK = {EXIT_OK: 0, EXIT_CHECK_FAILED: 1, EXIT_USAGE: 2, EXIT_TARGET_FAILED: 3}


def _cmd_batch(ns: argparse.Namespace) -> int:
    if ns.ray is None:  # the local engine: its fork server imports the stack while this process does
        from ._forkserver import prestart

        prestart(ns.manifest)
    from .display import BatchProgress, print_batch
    from .fleet import batch

    out = console()
    engine = "ray" if ns.ray is not None else "local"
    address = None if ns.ray in (None, "local") else ns.ray
    with BatchProgress(out) as progress:
        record = batch(
            ns.manifest,
            ns.out,
            workers=ns.workers,
            engine=engine,
            address=address,
            memory_budget_mb=ns.memory_budget,
            compare_to=ns.compare_to,
            shared_dir=ns.shared_dir,
            retries=ns.retries,
            only=ns.only or None,
            progress=progress,
        )
    print_batch(out, record, pathlib.Path(ns.out))
    codes = [_BATCH_EXIT.get(e.status, EXIT_TARGET_FAILED) for e in record.entries]
    return max(codes, key=lambda c: _EXIT_RANK[c], default=EXIT_OK)


def _cmd_compare(ns: argparse.Namespace) -> int:
    from .outputs import atomic_write_text
    from .parity.folder import compare_dir

    out = console()
    report, check, werr, name = compare_dir(
        pathlib.Path(ns.dir),
        name=ns.name,
        rtol=ns.rtol,
        atol=ns.atol,
        steps=ns.steps,
        inputs=ns.inputs,
        generate=ns.generate,
    )
    if check is not None or werr is not None:
        from .parity.folder import load_manifest

        print_weights(out, load_manifest(pathlib.Path(ns.dir), name), check, werr)
    print_parity(out, report)
    atomic_write_text(pathlib.Path(ns.dir) / f"{name}.parity.json", report.to_json())
    if ns.html:
        report.save_html(pathlib.Path(ns.dir) / f"{name}.parity.html")
    return EXIT_OK if report.ok and werr is None else EXIT_CHECK_FAILED


def _cmd_selftest(ns: argparse.Namespace) -> int:
    from .parity.selftest import run_selftest

    out = console()
    report, name = run_selftest(pathlib.Path(ns.dir), name=ns.name)
    print_parity(out, report)
    for o in report.outputs:
        for rt, m in o.metrics.items():
            if not m.ok:
                out.print(f"[red]{rt}: {o.label} differs from eager's recorded output[/]", markup=True)
    return EXIT_OK if report.ok else EXIT_CHECK_FAILED


def _print_causes(exc: BaseException) -> None:
    """The chain behind an error (``-v``): each cause's type and message, innermost last."""
    cause, depth = exc.__cause__ or exc.__context__, 0
    while cause is not None and depth < 8:
        text = str(cause).strip().splitlines()
        console().print(
            f"  caused by {type(cause).__name__}: " + ("\n    ".join(text[:12]) if text else ""), markup=False
        )
        cause, depth = cause.__cause__ or cause.__context__, depth + 1


def _run(ns: argparse.Namespace) -> int:
    """Run the command; other libraries' warnings and log lines are captured unless ``-v``
    (a batch's own processes print nothing to this terminal, so it runs as it is)."""
    if ns.func is _cmd_batch:
        return int(ns.func(ns))
    from ._quiet import library_output

    with library_output(show=ns.verbose) as captured:
        code = int(ns.func(ns))
    if captured and not ns.verbose:
        console().print(f"[dim]{len(captured)} message(s) from other libraries hidden: -v shows them[/]")
    return code


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser: one subcommand parser per command, each with the shared ``-v``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="log progress, show other libraries' warnings and log lines, and print each error's "
        "chained causes",
    )
    p = argparse.ArgumentParser(
        prog="dualexport",
        description=__doc__.splitlines()[0],
        parents=[common],
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    _add_export(sub, common)
    _add_compare(sub, common)
    _add_selftest(sub, common)
    _add_batch(sub, common)
    from .cli_llm import add_llm_commands  # export-llm, generate

    add_llm_commands(sub, common, EXIT_CODES)
    return p


def _add_export(sub: Any, common: argparse.ArgumentParser) -> None:
    """``dualexport export``: what to export and how."""
    e = sub.add_parser(
        "export",
        help="export MODULE:ATTR to ONNX and ExecuTorch/XNNPACK",
        parents=[common],
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.add_argument(
        "model",
        help="MODULE:ATTR (an nn.Module instance, class or zero-argument factory), or a .pt2 "
        "written by torch.export.save (the program is exported as it is: no second trace)",
    )
    e.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="SHAPE:DTYPE",
        help="an example input, e.g. 1x3x224x224:float32, or 2x8:int64:0..999 for token ids "
        "(repeat for several; a .pt2 defaults to its own example inputs)",
    )
    e.add_argument(
        "--dynamic",
        action="append",
        default=[],
        metavar="INPUT.DIM=[NAME:]MIN..MAX",
        help="make a dim dynamic, e.g. 0.1=1..64 (equal NAMEs share one dim; repeat for several)",
    )
    e.add_argument("--target", default="onnx,xnnpack", help="onnx, xnnpack or onnx,xnnpack")
    e.add_argument("--out", default="dualexport_out", help="output folder")
    e.add_argument("--name", default="model", help="file name stem of the artifacts")
    e.add_argument("--compare", action="store_true", help="run the parity check after export")
    e.add_argument(
        "--html",
        action="store_true",
        help="write <name>.report.html: delegation, weights, parity (with --compare), timings, versions",
    )
    e.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 3) when any target fails, and keep the previous artifacts",
    )
    e.add_argument(
        "--plain",
        action="store_true",
        help="turn every dualexport pass off (canonicalizations, constant folding, each target's "
        "own pipeline): the programs the plain libraries would lower",
    )
    _add_export_extras(e)
    e.set_defaults(func=_cmd_export)


def _add_export_extras(e: argparse.ArgumentParser) -> None:
    """``export``'s quantization, transform, delegation, option, cache and bundle flags."""
    e.add_argument(
        "--quantize",
        choices=["int8", "int8-dynamic"],
        default=None,
        help="int8: PT2E static per-channel quantization of the shared program, for both targets "
        "(needs --calibration or --calibration-random); int8-dynamic: int8 linear weights, "
        "activations quantized at run time (no calibration)",
    )
    e.add_argument(
        "--calibration",
        metavar="FILE",
        default=None,
        help="calibration inputs for --quantize: a torch.save'd list of input tuples "
        "(loaded with weights_only=True)",
    )
    e.add_argument(
        "--calibration-random",
        type=int,
        metavar="N",
        default=None,
        help="calibrate --quantize on N random input sets shaped like the example inputs",
    )
    e.add_argument(
        "--transform",
        action="append",
        default=[],
        metavar="MODULE:FN",
        help="a graph transform applied once to the shared program: FN takes a torch.fx.GraphModule "
        "and edits it, or takes and returns an ExportedProgram (repeat for several, applied in order)",
    )
    e.add_argument(
        "--require-full-delegation",
        action="store_true",
        help="fail the xnnpack target (exit 3) when any compute op is left to the portable runtime",
    )
    e.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="an ExportOptions field, e.g. onnx_external_data=false or parallel=false (repeat for several)",
    )
    e.add_argument(
        "--no-cache",
        action="store_true",
        help="lower every target again instead of reusing or patching the files already in --out",
    )
    e.add_argument(
        "--bundle",
        action="store_true",
        help="also write self-test bundles (<name>.bpte, <name>_onnx_tests/) for the device",
    )


def _add_compare(sub: Any, common: argparse.ArgumentParser) -> None:
    """``dualexport compare``: the weight and parity checks again on a folder."""
    c = sub.add_parser(
        "compare",
        help="re-run the weight and parity checks on a folder",
        parents=[common],
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("dir")
    c.add_argument("--name", default=None, help="which export in the folder (default: the only one)")
    c.add_argument("--rtol", type=float, default=None)
    c.add_argument("--atol", type=float, default=None)
    c.add_argument("--steps", type=int, default=1, help="calls per input set (stateful models)")
    c.add_argument("--inputs", default=None, help="extra inputs: a .npz or .pt file (no pickle)")
    c.add_argument(
        "--generate",
        type=int,
        default=0,
        metavar="N",
        help="N extra random seeds plus large-magnitude and all-zero inputs",
    )
    c.add_argument("--html", action="store_true", help="also write <name>.parity.html")
    c.set_defaults(func=_cmd_compare)


def _add_selftest(sub: Any, common: argparse.ArgumentParser) -> None:
    """``dualexport selftest``: run a folder's self-test bundles."""
    t = sub.add_parser(
        "selftest",
        help="run the self-test bundles of a folder (written by export --bundle)",
        parents=[common],
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("dir")
    t.add_argument("--name", default=None, help="which export in the folder (default: the only one)")
    t.set_defaults(func=_cmd_selftest)


def _add_batch(sub: Any, common: argparse.ArgumentParser) -> None:
    """``dualexport batch``: a manifest of models, here or on a Ray cluster."""
    b = sub.add_parser(
        "batch",
        help="export every model of a TOML manifest (a zoo) to both targets, here or on a Ray cluster",
        parents=[common],
        epilog=EXIT_CODES + "\n  (a batch exits with its worst entry's code; 0 only when every entry passed)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("manifest", help="the TOML manifest (see examples/zoo.toml)")
    b.add_argument(
        "--out", required=True, help="output folder: one subfolder per entry, batch.json, batch.html"
    )
    b.add_argument("--workers", type=int, default=None, help="entries at once (default: the cores)")
    b.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run on the Ray cluster at ADDRESS (e.g. 127.0.0.1:6379); 'local' starts a local Ray",
    )
    b.add_argument(
        "--memory-budget",
        type=float,
        metavar="MB",
        default=None,
        help="memory of the whole batch (this process, the fork server, running entries) in MB; entries are admitted while it holds (default: what the batch holds at start + 80%% of the available memory)",
    )
    b.add_argument("--compare-to", metavar="OLD", default=None, help="an earlier run's batch.json or folder")
    b.add_argument(
        "--shared-dir",
        metavar="PATH",
        default=None,
        help="(Ray) a folder every node sees: files return through it instead of the object store",
    )
    b.add_argument("--retries", type=int, default=2, help="(Ray) attempts more when a worker dies")
    b.add_argument("--only", action="append", metavar="NAME", help="run only this entry (repeat for several)")
    b.set_defaults(func=_cmd_batch)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code not in (0, None) else EXIT_OK
    ns.verbose = getattr(ns, "verbose", False)
    logging.basicConfig(
        level=logging.INFO if ns.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    error: DualExportError
    try:
        return _run(ns)
    except KeyboardInterrupt:
        # The export's own cleanup already ran on the way out (staging removed, lock released,
        # workers killed): say what is on disk.
        console().print(
            "[bold red]interrupted[/]: nothing of this run was published; the output folder holds "
            "the previous set (or nothing)",
            markup=True,
        )
        return EXIT_INTERRUPTED
    except UserError as exc:
        code, error, label = EXIT_USAGE, exc, "error"
    except (WeightMismatchError, ParityError) as exc:
        code, error, label = EXIT_CHECK_FAILED, exc, "check failed"
    except InternalError as exc:
        code, error, label = EXIT_INTERNAL, exc, "internal error"
    except DualExportError as exc:
        code, error, label = EXIT_TARGET_FAILED, exc, "error"
    except Exception as exc:  # not anticipated: say so plainly instead of a bare traceback
        logging.getLogger(__name__).info("internal error", exc_info=True)
        console().print(
            f"[bold red]internal error[/] (a bug in dualexport or a library it drives, "
            f"not in your input): {type(exc).__name__}: {exc}\nWhat to try: rerun with -v "
            "and report the traceback",
            markup=True,
        )
        return EXIT_INTERNAL
    console().print(f"[bold red]{label}[/]: ", end="")
    console().print(str(error), markup=False)
    if ns.verbose:
        _print_causes(error)
    return code


def run() -> None:
    """The console script: ``main``, then exit without the interpreter's final collection of
    everything the export built (FX graphs, lowered programs: 2 to 12 s of garbage collection at
    exit measured here, which made Ctrl-C look ignored)."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
