"""The dualexport model zoo: a catalogue of small cases, run on both targets by tests/test_zoo.py
and tabulated into docs/coverage.md by scripts/gen_coverage.py."""

from __future__ import annotations

from .case import TARGETS, Case, InputSet
from .models import ZOO
from .runner import CaseRun, TargetOutcome, run_case

__all__ = ["TARGETS", "Case", "InputSet", "ZOO", "CaseRun", "TargetOutcome", "run_case"]
