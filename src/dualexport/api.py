"""``dx.export`` and ``dx.compare``, and the result types they return: glue between the export
pipeline (``pipeline/``), the output folder (``outputs/``) and the parity check (``parity/``)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from ._stages import recording
from .errors import DualExportError, InputError, typed_errors
from .exporters import DelegationReport, ExportOptions, normalize_targets
from .outputs import artifact_set, check_name, needed_bytes, prepare_out_dir
from .parity.report import ParityReport
from .pipeline import Failed, Published, export_set
from .shared_state import SharedProgram
from .shared_state.request import validate_export_request, weight_bytes
from .weights import WeightCheck, WeightManifest, verify_manifest
from .weights.locate import holder_tensors

__all__ = ["Artifact", "ExportResult", "export", "compare"]


@dataclass(frozen=True)
class Artifact:
    """One target's files on disk, and how the export made them (``outcome``: ``Lowered``,
    ``Reused`` or ``Patched``, with what each proved)."""

    target: str
    path: pathlib.Path
    files: tuple[pathlib.Path, ...]
    ops: tuple[str, ...]
    seconds: float
    delegation: DelegationReport | None = None
    outcome: Published | None = field(default=None, repr=False)

    @property
    def details(self) -> Mapping[str, Any]:
        """The outcome's fields as a read-only mapping (for logs and older callers)."""
        if self.outcome is None:
            return MappingProxyType({})
        data = {f.name: getattr(self.outcome, f.name) for f in dataclasses.fields(self.outcome)}
        data["strategy"] = type(self.outcome).__name__.lower()
        return MappingProxyType(data)


@dataclass(frozen=True)
class ExportResult:
    """What one ``dx.export`` made. ``print(res)`` shows the summary the CLI prints; in a
    notebook it renders as tables. ``library_messages``: the other libraries' warnings and log
    lines captured during the export (shown as they happen only when dualexport logs at INFO)."""

    program: SharedProgram
    artifacts: Mapping[str, Artifact]
    errors: Mapping[str, DualExportError]
    manifest: WeightManifest
    out_dir: pathlib.Path
    name: str
    seconds: Mapping[str, float] = field(default_factory=dict)
    library_messages: tuple[str, ...] = field(default=(), repr=False)
    #: ``dx.export_llm``'s deploy folder (``dualexport.llm.deploy.DeployFolder``): the files the
    #: runtimes' own LLM runners load; None for ``dx.export`` and ``export_llm(deploy=False)``
    deploy: Any = None
    #: each stage's wall seconds and the process tree's peak memory while it ran
    #: (``dualexport._stages.StageTiming``), in the order they ended
    timings: tuple[Any, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors

    def __str__(self) -> str:
        from .display import summary_text

        return summary_text(self)

    def _repr_html_(self) -> str:
        from .display import export_result_html

        return export_result_html(self)

    def verify_weights(self) -> WeightCheck:
        """Re-read every artifact from disk; raise WeightMismatchError naming each entry that a
        file or the holder no longer matches."""
        return verify_manifest(self.manifest, self.out_dir, holder_tensors(self.program.exported_program))


def _artifact(outcome: Published, out_dir: pathlib.Path) -> Artifact:
    moved = outcome.with_files(tuple(out_dir / f.name for f in outcome.files))
    return Artifact(moved.target, moved.path, moved.files, moved.ops, moved.seconds, moved.delegation, moved)


def _options(options: ExportOptions | None, optimize: bool) -> ExportOptions:
    options = options or ExportOptions()
    return options if optimize else options.plain()


def _source(model: Any) -> Any:
    """A module or a program as given; a path is loaded as a program (``torch.export.load``)."""
    if isinstance(model, (str, os.PathLike)):
        from .loading import load_program

        return load_program(model)
    return model


def export(
    model: torch.nn.Module | torch.export.ExportedProgram | str | os.PathLike[str],
    args: tuple[Any, ...] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    target: str | Sequence[str] = ("onnx", "xnnpack"),
    out_dir: str | os.PathLike[str] = "dualexport_out",
    name: str = "model",
    dynamic_shapes: Any = None,
    transforms: Sequence[Callable[..., Any]] = (),
    quantize: str | None = None,
    calibration: Iterable[tuple[Any, ...]] | None = None,
    strict: bool = False,
    require_full_delegation: bool = False,
    optimize: bool = True,
    cache: bool = True,
    options: ExportOptions | None = None,
    bundle: bool = False,
) -> ExportResult:
    """Trace once, transform once, run one job per target from the one shared program, and
    commit ``<name>.onnx`` / ``<name>.pte`` / ``<name>.weights.json`` (and side files) into
    ``out_dir`` as one set.

    A failing target does not stop the others (its error is in ``res.errors``, and none of its
    files is published) unless ``strict=True``, which raises the first target error and commits
    nothing. ``optimize=False`` turns every dualexport pass off (``ExportOptions.plain()``): the
    programs the plain libraries would lower, canonicalizations included. ``bundle=True`` also
    writes self-test bundles (``<name>.bpte``, ``<name>_onnx_tests/``) that
    ``dualexport selftest DIR`` and a device run.

    ``model`` is an ``nn.Module`` (traced once, ``args`` required), or an ExportedProgram or the
    path of a ``.pt2`` written by ``torch.export.save``: that program becomes the shared program
    without a second trace (its ``state_dict`` is the holder's dict, ``args`` default to its
    ``example_inputs``, its dynamic ranges are its ``range_constraints``; ``dynamic_shapes`` must
    be None). Other libraries' warnings and log lines are captured into
    ``res.library_messages`` (shown as they happen when dualexport logs at INFO).
    """
    from ._quiet import library_output

    with library_output() as captured, typed_errors("export"):
        res = _export(
            _source(model),
            args,
            kwargs,
            target=target,
            out_dir=out_dir,
            name=name,
            dynamic_shapes=dynamic_shapes,
            transforms=transforms,
            quantize=quantize,
            calibration=calibration,
            strict=strict,
            require_full_delegation=require_full_delegation,
            optimize=optimize,
            cache=cache,
            options=options,
            bundle=bundle,
        )
        return dataclasses.replace(res, library_messages=tuple(captured))


def _export(
    model: Any,
    args: tuple[Any, ...] | None,
    kwargs: Mapping[str, Any] | None,
    *,
    target: str | Sequence[str],
    out_dir: str | os.PathLike[str],
    name: str,
    dynamic_shapes: Any,
    transforms: Sequence[Callable[..., Any]],
    quantize: str | None,
    calibration: Iterable[tuple[Any, ...]] | None,
    strict: bool,
    require_full_delegation: bool,
    optimize: bool,
    cache: bool,
    options: ExportOptions | None,
    bundle: bool,
) -> ExportResult:
    targets = normalize_targets(target)
    validate_export_request(
        model, args, kwargs, quantize=quantize, calibration=calibration, dynamic_shapes=dynamic_shapes
    )
    name = check_name(name)
    out = prepare_out_dir(out_dir)
    # One set: staged in tx.dir, committed together on a clean exit; an exception (strict=True
    # included) or a kill leaves the previous set as it was.
    with (
        recording() as timings,
        artifact_set(out, name, need_bytes=needed_bytes(weight_bytes(model), len(targets))) as tx,
    ):
        done = export_set(
            model,
            args,
            kwargs,
            targets=targets,
            set_dir=tx.dir,
            previous_dir=tx.out_dir if cache else None,
            name=name,
            dynamic_shapes=dynamic_shapes,
            transforms=transforms,
            quantize=quantize,
            calibration=calibration,
            options=_options(options, optimize),
            require_full_delegation=require_full_delegation,
            bundle=bundle,
        )
        errors = {t: o.error for t, o in done.outcomes.items() if isinstance(o, Failed)}
        if strict and errors:
            raise next(iter(errors.values()))
    artifacts = {t: _artifact(o, tx.out_dir) for t, o in done.outcomes.items() if not isinstance(o, Failed)}
    return ExportResult(
        done.program,
        MappingProxyType(artifacts),
        MappingProxyType(errors),
        done.manifest,
        tx.out_dir,
        name,
        done.seconds,
        timings=tuple(timings),
    )


def compare(
    res: ExportResult,
    inputs: Iterable[Any] | str | os.PathLike[str] | None = None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    steps: int = 1,
    tolerances: Mapping[int, tuple[float, float]] | None = None,
    generate: int = 0,
    edges: bool = True,
) -> ParityReport:
    """Eager (the shared program) vs ONNX Runtime vs ExecuTorch, from the files on disk.

    ``inputs``: extra argument tuples, or a .npz/.pt file of them. ``tolerances``: per output
    index ``(rtol, atol)``, over the table's defaults. ``generate``: that many extra random seeds,
    plus large-magnitude and all-zero sets shaped like the example (integer inputs stay in range).
    ``edges``: also every declared dynamic range at its min, max-1 and max. Other libraries'
    output is captured as in :func:`export`.
    """
    from ._quiet import library_output

    with library_output(), typed_errors("compare"):
        return _compare(
            res,
            inputs,
            rtol=rtol,
            atol=atol,
            steps=steps,
            tolerances=tolerances,
            generate=generate,
            edges=edges,
        )


def _compare(
    res: ExportResult,
    inputs: Iterable[Any] | str | os.PathLike[str] | None,
    *,
    rtol: float | None,
    atol: float | None,
    steps: int,
    tolerances: Mapping[int, tuple[float, float]] | None,
    generate: int,
    edges: bool,
) -> ParityReport:
    from .parity.compare import run_parity
    from .parity.inputs import edge_input_sets, extra_input_sets
    from .shared_state.contract import flatten_inputs

    shared = res.program
    program = shared.exported_program
    example_flat = flatten_inputs(program, shared.example_args, shared.example_kwargs)
    sets = [("example", shared.example_args, shared.example_kwargs)]
    sets += extra_input_sets(program, example_flat, inputs, generate)
    if edges:
        sets += edge_input_sets(program, example_flat)
    paths = {t: a.path for t, a in res.artifacts.items()}
    if not paths:
        raise InputError(
            "no artifact to compare: every target failed",
            hint="look at res.errors for why each target failed",
        )
    return run_parity(
        program,
        paths,
        sets,
        rtol=rtol,
        atol=atol,
        steps=steps,
        decomposed=shared.decomposed,
        tolerance_overrides=tolerances,
        float_program=shared.float_program,
    )
