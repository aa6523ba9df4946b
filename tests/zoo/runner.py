"""Run one zoo case through every stage and record, per target, how far it got.

The stages follow ExecuTorch's XNNPACK tester: export (one ``dx.export`` call for both targets),
a structural check per target (delegation table / ONNX op set), the weight check from disk, and
last the numeric comparison against eager on every input set. The first stage that fails is the
target's failure; the pytest test and the coverage script both read the same ``TargetOutcome``.
"""

from __future__ import annotations

import pathlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch

import dualexport as dx

from .case import TARGETS, Case

__all__ = ["TargetOutcome", "CaseRun", "run_case"]

#: Ops every XNNPACK program keeps outside the delegate: the ``getitem`` that unpacks the
#: delegate call's outputs.
_ALWAYS_OUTSIDE = frozenset({"getitem"})


@dataclass
class TargetOutcome:
    """What happened to one target of one case."""

    target: str
    stage: str = "export"  # the last stage reached: export, structure, weights, parity, done
    failure: str | None = None
    max_abs: float | None = None
    export_seconds: float | None = None
    delegated_nodes: int | None = None
    total_nodes: int | None = None
    subgraphs: int | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None and self.stage == "done"

    def fail(self, stage: str, message: str) -> None:
        if self.failure is None:
            self.stage, self.failure = stage, f"[{stage}] {message}"


@dataclass
class CaseRun:
    """Every target's outcome of one case, plus the objects a test may want to inspect further."""

    case: Case
    outcomes: dict[str, TargetOutcome]
    result: Any = None
    report: Any = None
    capture_seconds: float | None = None
    notes: list[str] = field(default_factory=list)


def _describe(exc: BaseException) -> str:
    """The exception and its root cause on one line: the root is what names the library limit."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    if root is not exc:
        text += f" <- {type(root).__name__}: {str(root).splitlines()[0][:300] if str(root) else ''}"
    return text


def _check_structure(case: Case, target: str, res: Any, out: TargetOutcome) -> None:
    art = res.artifacts[target]
    if target == "xnnpack":
        d = art.delegation
        if d is None:
            out.fail("structure", "no delegation report for xnnpack")
            return
        out.subgraphs = d.subgraphs
        out.delegated_nodes = d.delegated_nodes
        out.total_nodes = d.delegated_nodes + d.non_delegated_nodes
        if d.subgraphs < 1:
            out.fail("structure", "nothing was delegated to XNNPACK")
        elif case.xnnpack_subgraphs is not None and d.subgraphs != case.xnnpack_subgraphs:
            out.fail(
                "structure",
                f"expected {case.xnnpack_subgraphs} delegated subgraph(s), got "
                f"{d.subgraphs}; non-delegated ops: {d.non_delegated_ops()}",
            )
        else:
            outside = set(d.non_delegated_ops())
            if case.xnnpack_allowed_non_delegated is not None:
                extra = sorted(outside - _ALWAYS_OUTSIDE - case.xnnpack_allowed_non_delegated)
                if extra:
                    out.fail("structure", f"ops left outside the XNNPACK delegate: {extra}")
            missed = sorted(outside & case.xnnpack_must_delegate)
            absent = sorted(op for op in case.xnnpack_must_delegate if op not in d.by_op)
            if missed or absent:
                out.fail(
                    "structure",
                    f"ops that must be delegated: outside {missed}, absent from the program {absent}",
                )
    else:
        missing = sorted(case.onnx_ops - set(art.ops))
        if missing:
            out.fail("structure", f"ONNX graph lacks expected ops {missing}; has {sorted(art.ops)}")


def run_case(case: Case, out_dir: pathlib.Path, targets: tuple[str, ...] = TARGETS) -> CaseRun:
    """Export ``case`` once for ``targets`` and take every target through every stage."""
    torch.manual_seed(0)
    outcomes = {t: TargetOutcome(t) for t in targets}
    run = CaseRun(case, outcomes)
    model = case.factory().eval()
    args, kwargs = case.inputs()
    dyn = case.dynamic_shapes() if case.dynamic_shapes else None
    t0 = time.perf_counter()
    try:
        quant: dict[str, Any] = {}
        if case.int8_calibration:
            quant = {"quantize": "int8", "calibration": [case.inputs() for _ in range(case.int8_calibration)]}
        res = dx.export(
            model,
            args,
            kwargs or None,
            target=targets,
            out_dir=out_dir,
            name=case.name,
            dynamic_shapes=dyn,
            **quant,
        )
    except Exception as exc:  # capture failed: every target fails at the export stage
        msg = _describe(exc)
        for o in outcomes.values():
            o.fail("export", msg)
            o.export_seconds = time.perf_counter() - t0
        return run
    run.result = res
    run.capture_seconds = res.seconds.get("capture")
    for t, o in outcomes.items():
        o.export_seconds = res.seconds.get(t)
        if t in res.errors:
            o.fail("export", _describe(res.errors[t]))
            continue
        if t not in res.artifacts:
            o.fail("export", "no artifact and no error")
            continue
        o.stage = "structure"
        _check_structure(case, t, res, o)

    live = [o for o in outcomes.values() if o.failure is None]
    if live:
        for o in live:
            o.stage = "weights"
        try:
            res.verify_weights()
        except Exception as exc:
            msg = " ".join(str(exc).split())[:600]
            # A WeightMismatchError names the target of each problem: blame only those (a
            # target that already failed may be the one named), or every live target if none is.
            named = [t for t in outcomes if f"{t}:" in str(exc)]
            blamed = [o for o in live if o.target in named] if named else live
            for o in blamed:
                o.fail("weights", msg)

    live = [o for o in outcomes.values() if o.failure is None]
    if live:
        for o in live:
            o.stage = "parity"
        rtol, atol = case.tolerance or (None, None)
        try:
            report = dx.compare(res, inputs=case.all_input_sets(), rtol=rtol, atol=atol, steps=case.steps)
        except Exception as exc:
            msg = _describe(exc)
            for o in live:
                o.fail("parity", msg)
            report = None
        run.report = report
        if report is not None:
            for o in live:
                if o.target in report.errors:
                    o.fail("parity", f"{o.target} failed to run: {report.errors[o.target][:400]}")
                    continue
                rows = [p for p in report.outputs if o.target in p.metrics]
                if not rows:
                    o.fail("parity", "no output was compared")
                    continue
                o.max_abs = max(p.metrics[o.target].max_abs for p in rows)
                bad = [p for p in rows if not p.metrics[o.target].ok]
                if bad:
                    worst = max(bad, key=lambda p: p.metrics[o.target].max_abs)
                    m, tol = worst.metrics[o.target], worst.tolerance[o.target]
                    o.fail(
                        "parity",
                        f"{len(bad)}/{len(rows)} outputs out of tolerance; worst "
                        f"{worst.label} {list(worst.shape)} max_abs {m.max_abs:.3g} "
                        f"(rtol {tol.rtol:g}, atol {tol.atol:g})",
                    )
    for o in outcomes.values():
        if o.failure is None:
            o.stage = "done"
    return run
