"""Prove a target's file from disk before it is staged: the ranges it records are the declared
ones, and it runs at the example and at the edges of every declared range.

Why from the file and at the edges: a lowering can narrow a range without any error (a kernel's
size question became a guard; ExecuTorch then plans memory for the narrowed maximum), and the
only evidence is a file that refuses the top of the range. So the job reads the ranges back out of
the file (ONNX metadata; the .pte's ranges method and its memory plan) and runs the file at min,
max-1 and max, whatever strategy made it (lowered, forked, reused, patched).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import DualExportError, RangeNarrowedError, RuntimeExecutionError
from ..parity.inputs import inputs_with_shapes
from ..runtimes import open_runner
from ..shared_state.contract import EdgeSizes, InputSpec
from .outcome import Proof

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
    for i, (dims, sizes) in enumerate(zip(declared, planned, strict=False)):
        for d, ((lo, hi), cap) in enumerate(zip(dims, sizes, strict=False)):
            if hi is not None and cap < hi:
                raise RangeNarrowedError(
                    f"{name} plans input {i} dim {d} for at most {cap}, but the declared range is "
                    f"[{lo}, {hi}]: ExecuTorch would refuse sizes {cap + 1}..{hi}",
                    target="xnnpack",
                    hint="declare a range the lowering can honour (a smaller Dim max), or export "
                    "target='onnx' alone; nothing of this target was written",
                )
    return "ranges method and memory plan cover the declared ranges"


def _run(runner: Any, flat: list[torch.Tensor], target: str, name: str, where: str) -> list[torch.Tensor]:
    try:
        outs = runner.run(flat)
    except DualExportError as exc:
        raise RuntimeExecutionError(
            f"{name} does not run {where}: {exc.message}", target=target, hint=exc.hint
        ) from exc
    if not outs:
        raise RuntimeExecutionError(f"{name} ran {where} but returned no outputs", target=target)
    return outs


def prove_file(
    target: str,
    path: pathlib.Path,
    specs: Sequence[InputSpec],
    edges: Sequence[EdgeSizes],
    example: list[torch.Tensor],
) -> Proof:
    """Load ``path`` in its runtime; check the ranges it records against ``specs`` (the pinned
    contract); run it at the example and at each edge, checking the output shapes the contract
    gives. Raises the target's error (``RangeNarrowedError``, ``RuntimeExecutionError``,
    ``RuntimeLoadError``) when any of it fails."""
    runner = open_runner(target, path, lean=True)
    ranges = (_check_onnx if target == "onnx" else _check_pte)(runner, specs, path.name)
    _run(runner, example, target, path.name, "on the example inputs")
    ran = []
    for i, edge in enumerate(edges):
        where = f"at the {edge.label} of its declared ranges ({', '.join(f'{k}={v}' for k, v in edge.symbols.items())})"
        outs = _run(runner, inputs_with_shapes(example, edge.inputs, i), target, path.name, where)
        if len(outs) == len(edge.outputs):
            for k, (got, want) in enumerate(zip(outs, edge.outputs, strict=True)):
                if want is not None and tuple(got.shape) != want:
                    raise RuntimeExecutionError(
                        f"{path.name} returns output {k} of shape {tuple(got.shape)} {where}; the "
                        f"program gives {want}",
                        target=target,
                        hint="the file was specialized to the example's sizes; report the model",
                    )
        ran.append(edge.label)
    return Proof(ranges=ranges, edges=tuple(ran))
