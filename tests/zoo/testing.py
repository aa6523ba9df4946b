"""Pytest glue shared by tests/test_zoo.py and tests/test_hf_models.py: one export per case per
session, (case, target) parameters with strict per-target xfails, and the per-target assertions."""

from __future__ import annotations

import pathlib

import pytest

from .case import TARGETS, Case
from .runner import CaseRun, run_case

__all__ = ["case_params", "case_run", "check_target"]

_RUNS: dict[str, CaseRun] = {}


def case_run(case: Case, root: pathlib.Path) -> CaseRun:
    """Export each case once per session; both targets' tests read the same run."""
    if case.name not in _RUNS:
        _RUNS[case.name] = run_case(case, root / case.name)
    return _RUNS[case.name]


def case_params(cases: tuple[Case, ...]) -> list:
    """One ``pytest.param`` per (case, target), marked slow and/or strictly xfailed as listed."""
    params = []
    for case in cases:
        for target in TARGETS:
            marks = [pytest.mark.slow] if case.slow else []
            if target in case.xfail:
                # check_target asserts each stage: an unrelated crash of the runner is not it
                marks.append(pytest.mark.xfail(strict=True, raises=AssertionError, reason=case.xfail[target]))
            params.append(pytest.param(case, target, id=f"{case.name}-{target}", marks=marks))
    return params


def check_target(run: CaseRun, target: str) -> None:
    """Assert every stage passed for ``target``, and the facts a pass/fail summary would hide."""
    outcome = run.outcomes[target]
    name = run.case.name
    assert outcome.passed, f"{name} on {target}: {outcome.failure}"
    res = run.result
    assert target in res.artifacts and target not in res.errors, f"{name}: no {target} artifact"
    assert res.artifacts[target].path.is_file(), f"{name}: {res.artifacts[target].path} missing"
    assert run.report is not None and target in run.report.runtimes, f"{name}: {target} not compared"
    # Every input set (the example, the case's own, and each declared range at min, max-1 and
    # max) was compared, every step.
    from dualexport.shared_state.contract import edge_sizes

    edges = edge_sizes(res.program.exported_program)
    assert bool(edges) == (run.case.dynamic_shapes is not None), f"{name}: edges {edges}"
    labels = {o.label for o in run.report.outputs if target in o.metrics}
    sets = {label.split("/")[0] for label in labels}
    assert len(sets) == 1 + len(run.case.all_input_sets()) + len(edges), f"{name}: compared {sorted(sets)}"
    assert {f"edge:{e.label}" for e in edges} <= sets, f"{name}: compared {sorted(sets)}"
    outcome_proof = res.artifacts[target].outcome.proof
    assert outcome_proof.edges == tuple(e.label for e in edges), f"{name}: proved {outcome_proof}"
    if edges:
        _refuses_above_the_maximum(res, target, edges[-1])
    if run.case.steps > 1:
        steps = {label.split("/")[1] for label in labels}
        assert len(steps) == run.case.steps, f"{name}: compared steps {sorted(steps)}"
    assert outcome.max_abs is not None and outcome.max_abs == outcome.max_abs, f"{name}: max_abs NaN"


def _refuses_above_the_maximum(res: object, target: str, top: object) -> None:
    """One past the top of every declared range: the runner refuses it, naming the dim."""
    import re

    import torch

    import dualexport as dx
    from dualexport.runtimes import open_runner
    from dualexport.shared_state.contract import flatten_inputs, input_specs

    program = res.program.exported_program  # type: ignore[attr-defined]
    example = flatten_inputs(program, res.program.example_args, res.program.example_kwargs)  # type: ignore[attr-defined]
    specs = input_specs(program)
    i, d = next(
        (i, d)
        for i, spec in enumerate(specs)
        for d, dim in enumerate(spec["dims"])
        if not isinstance(dim, int) and dim[1] is not None
    )
    shapes = [list(s) for s in top.inputs]  # type: ignore[attr-defined]
    shapes[i][d] = specs[i]["dims"][d][1] + 1
    flat = [torch.zeros(s, dtype=t.dtype) for s, t in zip(shapes, example, strict=True)]
    runner = open_runner(target, res.artifacts[target].path)  # type: ignore[attr-defined]
    try:
        runner.run(flat)
    except dx.InputError as exc:
        assert re.search(rf"dim {d} is {shapes[i][d]}, outside the exported range", str(exc)), str(exc)
    else:
        raise AssertionError(f"{target} ran input {i} dim {d} = {shapes[i][d]}, above the declared maximum")
