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
                marks.append(pytest.mark.xfail(strict=True, reason=case.xfail[target]))
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
    # Every input set (the example plus min/mid/max of each dynamic dim) was compared, every step.
    labels = {o.label for o in run.report.outputs if target in o.metrics}
    sets = {label.split("/")[0] for label in labels}
    assert len(sets) == 1 + len(run.case.all_input_sets()), f"{name}: compared {sorted(sets)}"
    if run.case.steps > 1:
        steps = {label.split("/")[1] for label in labels}
        assert len(steps) == run.case.steps, f"{name}: compared steps {sorted(steps)}"
    assert outcome.max_abs is not None and outcome.max_abs == outcome.max_abs, f"{name}: max_abs NaN"
