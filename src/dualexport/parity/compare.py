"""Run eager, ONNX Runtime and ExecuTorch on the same inputs and measure how far they are apart."""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram

from .._versions import library_versions
from ..errors import DualExportError, ParityError
from ..runtimes import open_runner
from ..runtimes.eager import EagerRunner
from ..shared_state.contract import check_input_shapes, flatten_inputs, is_stateful
from ..shared_state.fingerprint import ranges_kept
from .judge import judge, output_tolerance, quantization_noise
from .metrics import FloatAgreement, float_agreement
from .report import Divergence, OutputParity, ParityReport
from .tolerances import quantized_node_tolerance, tolerance_for

__all__ = ["run_parity", "InputSet", "error_histogram"]

logger = logging.getLogger(__name__)

InputSet = tuple[str, tuple[Any, ...], dict[str, Any]]


def error_histogram(
    actual: torch.Tensor, reference: torch.Tensor, bins: int = 24
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Histogram of log10(|actual - reference|) over finite elements; exact zeros go to the
    first bin (edge -12), so a perfect match is one tall bar on the left."""
    if actual.shape != reference.shape or actual.numel() == 0:
        return ((), ())
    d = (actual.double() - reference.double()).abs().reshape(-1)
    d = d[torch.isfinite(d)]
    logd = torch.log10(d.clamp_min(1e-12))
    lo, hi = -12.0, max(0.0, float(logd.max()) if logd.numel() else 0.0)
    counts = torch.histc(logd, bins=bins, min=lo, max=hi)
    step = (hi - lo) / bins
    edges = tuple(round(lo + i * step, 4) for i in range(bins + 1))
    return edges, tuple(int(c) for c in counts)


def run_parity(
    program: ExportedProgram,
    artifacts: Mapping[str, pathlib.Path],
    input_sets: Sequence[InputSet],
    *,
    rtol: float | None = None,
    atol: float | None = None,
    steps: int = 1,
    tolerance_overrides: Mapping[int, tuple[float, float]] | None = None,
    decomposed: Mapping[str, ExportedProgram] | None = None,
    localize: bool = True,
    float_program: ExportedProgram | None = None,
    decompose_options: Mapping[str, Any] | None = None,
) -> ParityReport:
    """Every (input set, step, output) compared for every runtime against eager, and runtime vs
    runtime. A stateful program is run ``steps`` times from a fresh state for each input set.
    For an int8 program, ``float_program`` (what it was quantized from) measures the reference's
    own quantization noise, the yardstick of its outputs (``quantized_tolerance``).
    ``decompose_options``: per runtime, the ``ExportOptions`` its file was made with, for
    localizing against the same decomposition when ``decomposed`` does not hold it."""
    if steps < 1:
        raise ParityError(f"steps must be >= 1, got {steps}")
    runtimes = tuple(artifacts)
    outputs: list[OutputParity] = []
    errors: dict[str, str] = {}
    failing: dict[str, list[torch.Tensor]] = {}  # runtime -> flat inputs of its first failing set
    from ..shared_state.quantize import quantized_outputs

    quant_steps = quantized_outputs(program)
    flats = _checked_inputs(program, input_sets)
    # Building the eager module and loading the runtimes dominate a small compare: do it once,
    # and again per input set only where state must start over.
    if not input_sets:
        raise ParityError("no input set to compare", hint="pass the example inputs at least")
    stateful = is_stateful(program)
    eager = EagerRunner(program, *input_sets[0][1:])
    floats = (
        EagerRunner(float_program, *input_sets[0][1:]) if float_program is not None and quant_steps else None
    )
    runners: dict[str, Any] = {}
    for index, ((set_label, _args, _kwargs), flat) in enumerate(zip(input_sets, flats, strict=True)):
        if index and stateful:
            eager.reset()
            if floats is not None:
                floats.reset()
        _open_runners(artifacts, runners, errors, reopen=stateful)
        for step in range(steps):
            ref = eager.run(flat)
            float_outs = floats.run(flat) if floats is not None else None
            noise = quantization_noise(ref, float_outs) if float_outs is not None else {}
            got = _run_runtimes(runners, flat, len(ref), errors)
            judged = _Judged(quant_steps, noise, rtol, atol, tolerance_overrides, float_outs)
            for i, r in enumerate(ref):
                label = f"{set_label}" + (f"/step{step}" if steps > 1 else "") + f"/out{i}"
                row = judged.output(i, label, r, got)
                outputs.append(row)
                for rt, m in row.metrics.items():
                    if not m.ok and rt not in failing and step == 0:
                        failing[rt] = flat
    divergences: dict[str, Divergence | None] = {rt: None for rt in runtimes}
    if localize:
        for rt, flat in failing.items():
            where = (
                pathlib.Path(artifacts[rt]),
                (decomposed or {}).get(rt),
                (decompose_options or {}).get(rt),
            )
            divergences[rt] = _localize_or_note(program, rt, flat, where, errors, rtol=rtol, atol=atol)
    first = {rt: (d.node if d is not None else None) for rt, d in divergences.items()}
    return ParityReport(
        tuple(outputs),
        runtimes,
        first,
        divergences,
        tuple(s[0] for s in input_sets),
        steps,
        library_versions(),
        errors,
    )


def _checked_inputs(program: ExportedProgram, input_sets: Sequence[InputSet]) -> list[list[torch.Tensor]]:
    """Each input set flattened the way the program takes it, its shapes checked first."""
    flats = []
    for set_label, args, kwargs in input_sets:
        flat = flatten_inputs(program, args, kwargs)
        check_input_shapes(program, flat, set_label)
        flats.append(flat)
    return flats


def _open_runners(
    artifacts: Mapping[str, pathlib.Path], runners: dict[str, Any], errors: dict[str, str], *, reopen: bool
) -> None:
    """Open each runtime's file into ``runners`` (again when ``reopen``: a stateful program
    starts each input set from a fresh state); one that fails to load is written to ``errors``."""
    for rt, path in artifacts.items():
        if rt in errors or (rt in runners and not reopen):
            continue
        try:
            runners[rt] = open_runner(rt, pathlib.Path(path))
        except DualExportError as exc:
            errors[rt] = str(exc)


def _run_runtimes(
    runners: Mapping[str, Any], flat: list[torch.Tensor], outputs: int, errors: dict[str, str]
) -> dict[str, list[torch.Tensor]]:
    """Each runtime's outputs for one input set; a runtime that fails, or returns a different
    number of outputs than eager's ``outputs``, is written to ``errors`` and left out."""
    got: dict[str, list[torch.Tensor]] = {}
    for rt, runner in runners.items():
        if rt in errors:
            continue
        try:
            got[rt] = runner.run(flat)
        except DualExportError as exc:
            errors[rt] = str(exc)
            continue
        if len(got[rt]) != outputs:
            errors[rt] = f"{rt} returned {len(got[rt])} outputs, eager returned {outputs}"
            del got[rt]
    return got


@dataclass(frozen=True)
class _Judged:
    """What judges the outputs of one run: the int8 outputs' quantization steps and the
    reference's own quantization noise, and the caller's tolerances."""

    quant_steps: Mapping[int, float | None]
    noise: Mapping[int, Any]
    rtol: float | None
    atol: float | None
    overrides: Mapping[int, tuple[float, float]] | None
    #: an int8 program's float model's outputs (what quantization costs; not judged)
    float_outs: Sequence[torch.Tensor] | None = None

    def against_float(
        self, i: int, ref: torch.Tensor, got: Mapping[str, list[torch.Tensor]]
    ) -> dict[str, FloatAgreement]:
        """The quantized reference ("eager") and each runtime against the float model's output."""
        if self.float_outs is None or i >= len(self.float_outs):
            return {}
        out = {}
        for who, value in {"eager": ref, **{rt: outs[i] for rt, outs in got.items()}}.items():
            agreement = float_agreement(value, self.float_outs[i])
            if agreement is not None:
                out[who] = agreement
        return out

    def output(
        self, i: int, label: str, ref: torch.Tensor, got: Mapping[str, list[torch.Tensor]]
    ) -> OutputParity:
        """Output ``i`` of every runtime against eager's ``ref``, and runtime vs runtime."""
        metrics, tols, hists = {}, {}, {}
        for rt, outs in got.items():
            tol = output_tolerance(
                rt,
                i,
                ref.dtype,
                quant_steps=self.quant_steps,
                noise=self.noise,
                rtol=self.rtol,
                atol=self.atol,
                overrides=self.overrides,
            )
            metrics[rt] = judge(tol, outs[i], ref)
            tols[rt] = tol
            if ref.dtype.is_floating_point:
                hists[rt] = error_histogram(outs[i], ref)
        cross = None
        if len(got) == 2:
            a, b = (got[rt][i] for rt in got)
            cross = tolerance_for("cross", ref.dtype, rtol=self.rtol, atol=self.atol).judge(a, b.to(a.dtype))
        return OutputParity(
            i,
            label,
            tuple(ref.shape),
            str(ref.dtype).replace("torch.", ""),
            metrics,
            tols,
            cross,
            hists,
            self.against_float(i, ref, got),
        )


def _localize_or_note(
    program: ExportedProgram,
    runtime: str,
    flat: list[torch.Tensor],
    where: tuple[pathlib.Path, ExportedProgram | None, Any],
    errors: dict[str, str],
    *,
    rtol: float | None,
    atol: float | None,
) -> Divergence | None:
    """:func:`_localize` (``where``: the runtime's file, its decomposed program if held, the
    options its file was made with), or None with the reason in ``errors``: localization is a
    diagnosis, it never hides the parity result."""
    path, decomposed, options = where
    try:
        return _localize(program, runtime, path, flat, decomposed, rtol=rtol, atol=atol, options=options)
    except Exception as exc:
        logger.warning("could not localize the %s divergence: %s", runtime, exc)
        errors.setdefault(f"{runtime}-localization", f"{type(exc).__name__}: {exc}")
        return None


def _localize(
    program: ExportedProgram,
    runtime: str,
    path: pathlib.Path,
    flat: list[torch.Tensor],
    decomposed: ExportedProgram | None,
    *,
    rtol: float | None,
    atol: float | None,
    options: Any = None,
) -> Divergence | None:
    from ..exporters import get_exporter
    from .localize import first_divergence, onnx_values, reference_values, shared_name_map, xnnpack_values

    # The debug lowering runs kernels against the shared program's shape environment: whatever
    # it narrows is put back (it is a diagnosis, not an artifact).
    with ranges_kept(program) as narrowed:
        if decomposed is None:
            # the decomposition the export used: its options (a --plain export has no passes)
            decomposed = get_exporter(runtime).decompose(program, options)
        reference = reference_values(program, flat)
        shared_names = {n.name for n in program.graph.nodes}
        if runtime == "onnx":
            names = [n.name for n in decomposed.graph.nodes if n.op == "call_function"]
            observed = onnx_values(path, names, flat)
            name_map = shared_name_map(decomposed, shared_names)
        else:
            observed, tapped = xnnpack_values(decomposed, flat)
            name_map = shared_name_map(tapped, shared_names)
    if narrowed:
        logger.warning(
            "localizing %s narrowed the program's ranges (%s); restored", runtime, "; ".join(narrowed)
        )
    from ..shared_state.quantize import is_quantized

    node_tol = quantized_node_tolerance() if is_quantized(program) and rtol is None and atol is None else None
    return first_divergence(
        program, reference, runtime, observed, name_map, rtol=rtol, atol=atol, node_tolerance=node_tol
    )
