"""Prove a target's file from disk before it is staged: the ranges it records are the declared
ones, and it computes the shared program's outputs, within the target's tolerance, on the
example and at the edges of every declared range.

Why from the file, at the edges and by value: a lowering can narrow a range without any error (a
kernel's size question became a guard; ExecuTorch then plans memory for the narrowed maximum),
and the only evidence is a file that refuses the top of the range; and a file made any other way
than a fresh lowering (a reused file, a weights-only patch) can run and still compute another
model (a tied weight patched in one of its two copies). So whatever strategy made the file, it
is run on the reference inputs and each output judged with the criterion ``dx.compare`` uses
(parity/judge.py) against the shared program's own outputs.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import DualExportError, ProofMismatchError, RangeNarrowedError, RuntimeExecutionError
from ..parity.judge import judge, output_tolerance
from ..parity.tolerances import tolerance_for
from ..runtimes import open_runner
from ..shared_state.contract import InputSpec
from .outcome import Proof, ValueCheck
from .reference import ProofSet, Reference

__all__ = ["prove_file"]


def _as_ranges(spec: InputSpec) -> list[tuple[int, int | None]]:
    return [
        (d, d) if isinstance(d, int) else (int(d[0]), None if d[1] is None else int(d[1]))
        for d in spec["dims"]
    ]


def _check_onnx(runner: Any, specs: Sequence[InputSpec], name: str) -> str:
    recorded = runner.input_specs
    declared = json.loads(json.dumps(list(specs)))
    if recorded != declared:
        raise RangeNarrowedError(
            f"{name} records the input ranges {recorded}, but the program declares {declared}",
            target="onnx",
            hint="report this: the file would refuse or accept sizes it should not",
        )
    return "metadata equals the declared ranges"


def _check_pte(runner: Any, specs: Sequence[InputSpec], name: str) -> str:
    declared = [_as_ranges(s) for s in specs]
    recorded = [
        [(int(lo), None if hi is None else int(hi)) for lo, hi in dims] for dims in (runner.ranges or [])
    ]
    if recorded != declared:
        raise RangeNarrowedError(
            f"{name} records the input ranges {recorded}, but the program declares {declared}",
            target="xnnpack",
            hint="report this: the file would refuse or accept sizes it should not",
        )
    planned = runner.planned_sizes()
    if planned is None:
        return "ranges method equals the declared ranges (memory plan not readable)"
    if len(planned) != len(declared):
        raise RangeNarrowedError(
            f"{name} plans memory for {len(planned)} inputs, but the program takes {len(declared)}",
            target="xnnpack",
            hint="report this: the file does not take the program's inputs",
        )
    for i, (dims, sizes) in enumerate(zip(declared, planned, strict=True)):
        if len(sizes) != len(dims):
            raise RangeNarrowedError(
                f"{name} plans input {i} with {len(sizes)} dims, but the program declares {len(dims)}",
                target="xnnpack",
                hint="report this: the file does not take the program's inputs",
            )
        for d, ((lo, hi), cap) in enumerate(zip(dims, sizes, strict=True)):
            if hi is not None and cap < hi:
                raise RangeNarrowedError(
                    f"{name} plans input {i} dim {d} for at most {cap}, but the declared range is "
                    f"[{lo}, {hi}]: ExecuTorch would refuse sizes {cap + 1}..{hi}",
                    target="xnnpack",
                    hint="declare a range the lowering can honour (a smaller Dim max), or export "
                    "target='onnx' alone; nothing of this target was written",
                )
    return "ranges method and memory plan cover the declared ranges"


def _run(runner: Any, case: ProofSet, target: str, name: str) -> list[torch.Tensor]:
    try:
        outs = runner.run(list(case.inputs))
    except DualExportError as exc:
        raise RuntimeExecutionError(
            f"{name} does not run {case.where}: {exc.message}", target=target, hint=exc.hint
        ) from exc
    if len(outs) != len(case.outputs):
        raise RuntimeExecutionError(
            f"{name} returns {len(outs)} outputs {case.where}; the program returns {len(case.outputs)}",
            target=target,
            hint="the file does not compute the program's outputs; report the model",
        )
    return outs


#: the second stage of a quantized file's proof (pipeline/forced_proof.py): judges a set the
#: end-to-end criterion refused, linear by linear, and returns its check or raises
Forced = Callable[[pathlib.Path, ProofSet, Sequence[torch.Tensor], ProofMismatchError], ValueCheck]


def _judge(
    target: str, name: str, case: ProofSet, outs: list[torch.Tensor], reference: Reference, strict: bool
) -> ValueCheck:
    worst_abs, worst_snr = 0.0, float("inf")
    for k, (got, want) in enumerate(zip(outs, case.outputs, strict=True)):
        shape = case.shapes[k] if k < len(case.shapes) else None
        if tuple(got.shape) != tuple(want.shape) or (shape is not None and tuple(got.shape) != shape):
            raise RuntimeExecutionError(
                f"{name} returns output {k} of shape {tuple(got.shape)} {case.where}; the program "
                f"gives {tuple(want.shape)}",
                target=target,
                hint="the file was specialized to the example's sizes; report the model",
            )
        tol = (
            tolerance_for(target, want.dtype)
            if strict
            else output_tolerance(target, k, want.dtype, quant_steps=reference.quant_steps, noise=case.noise)
        )
        m = judge(tol, got, want)
        if not m.ok:
            raise ProofMismatchError(
                f"{name} computes output {k} {case.where} differently from {reference.label}: "
                f"max_abs {m.max_abs:.3g}, SNR {m.snr_db:.1f} dB, {m.mismatch_pct:.2f}% of elements "
                f"outside the tolerance ({tol.source})",
                target=target,
                hint="the file does not compute the program it was made from; it was not published",
            )
        worst_abs = max(worst_abs, m.max_abs)
        worst_snr = min(worst_snr, m.snr_db)
    return ValueCheck(case.label, len(outs), worst_abs, worst_snr)


def prove_file(
    target: str,
    path: pathlib.Path,
    specs: Sequence[InputSpec],
    reference: Reference,
    forced: Forced | None = None,
) -> Proof:
    """Load ``path`` in its runtime; check the ranges it records against ``specs`` (the pinned
    contract); run it on every proof set (a fresh load per set for a stateful program) and judge
    each output against the shared program's (or the approximation ``reference`` is of). Raises the target's error
    (``RangeNarrowedError``, ``RuntimeExecutionError``, ``ProofMismatchError``,
    ``RuntimeLoadError``) when any of it fails. ``forced``: the second stage a set the
    end-to-end criterion refused goes to (a quantized program's file, checked linear by linear);
    with it, the end-to-end criterion is the float one (a file that computes the program up to
    float rounding passes at once; any other goes to the stage that judges each linear tightly),
    not the looser bound of the program's quantization noise."""
    runner = open_runner(target, path, lean=True)
    ranges = (_check_onnx if target == "onnx" else _check_pte)(runner, specs, path.name)
    values = []
    for index, case in enumerate(reference.sets):
        if index and reference.stateful:
            runner = open_runner(target, path, lean=True)
        outs = _run(runner, case, target, path.name)
        try:
            values.append(_judge(target, path.name, case, outs, reference, strict=forced is not None))
        except ProofMismatchError as exc:
            if forced is None:
                raise
            values.append(forced(path, case, outs, exc))
    edges = tuple(c.label for c in reference.sets if c.label != "example")
    return Proof(ranges=ranges, edges=edges, values=tuple(values), against=reference.label)
