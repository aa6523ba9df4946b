"""What runs after an export, in one order, for the CLI and the fleet alike: verify the weights
from disk, check parity (``<name>.parity.json``), write the export page (``<name>.report.html``).

Why one function: the CLI and the fleet's worker each ran these steps in their own order with
their own error handling, so a fix in one (a compare that cannot run, the parity file written
before the page) missed the other. Here each step's failure is a value of the result, never an
exception: the caller decides the exit code or the entry's status from it.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import DualExportError, WeightMismatchError
from ..outputs import atomic_write_text

if TYPE_CHECKING:
    from ..api import ExportResult
    from ..parity.report import ParityReport
    from ..weights import WeightCheck

__all__ = ["Checked", "CompareSettings", "check_export"]

#: a phase of the checks starting (the fleet's progress display), by name
PhaseHook = Callable[[str], None]


@dataclass(frozen=True)
class CompareSettings:
    """How ``dx.compare`` runs after the export (None: the table's tolerances)."""

    rtol: float | None = None
    atol: float | None = None
    generate: int = 0
    edges: bool = True


@dataclass(frozen=True)
class Checked:
    """The checks of one export: the weight proof from disk (or why it failed), the parity report
    (None when not asked, or ``parity_error`` when it could not run), the page written, and the
    seconds of each step."""

    weights: WeightCheck | None = None
    weight_error: WeightMismatchError | None = None
    report: ParityReport | None = None
    parity_error: DualExportError | None = None
    page: pathlib.Path | None = None
    seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def weights_ok(self) -> bool | None:
        return None if self.weights is None and self.weight_error is None else self.weight_error is None

    @property
    def parity_ok(self) -> bool | None:
        if self.parity_error is not None:
            return False
        return None if self.report is None else self.report.ok

    @property
    def ok(self) -> bool:
        return self.weights_ok is not False and self.parity_ok is not False


def check_export(
    res: ExportResult,
    *,
    compare: CompareSettings | None = CompareSettings(),
    page: bool = True,
    phase: PhaseHook | None = None,
    extra_seconds: Mapping[str, float] | None = None,
) -> Checked:
    """Verify ``res``'s weights from disk, compare (``compare=None``: skip), write
    ``<name>.parity.json`` and, with ``page``, ``<name>.report.html`` beside the artifacts."""
    from .. import api
    from .export_page import write_export_page

    seconds: dict[str, float] = {}

    def step(name: str, fn: Callable[[], Any]) -> Any:
        if phase is not None:
            phase(name)
        t = time.perf_counter()
        try:
            return fn()
        finally:
            seconds[name] = time.perf_counter() - t

    weights, weight_error = None, None
    report, parity_error = None, None
    if res.artifacts:
        try:
            weights = step("verify", res.verify_weights)
        except WeightMismatchError as exc:
            weight_error = exc
        if compare is not None:
            try:
                report = step(
                    "compare",
                    lambda: api.compare(
                        res,
                        rtol=compare.rtol,
                        atol=compare.atol,
                        generate=compare.generate,
                        edges=compare.edges,
                    ),
                )
            except DualExportError as exc:
                parity_error = exc
            if report is not None:
                atomic_write_text(res.out_dir / f"{res.name}.parity.json", report.to_json())
    written = None
    if page:
        shown = {**dict(extra_seconds or {}), **seconds}
        written = step(
            "report",
            lambda: write_export_page(res.out_dir / f"{res.name}.report.html", res, report, seconds=shown),
        )
    return Checked(weights, weight_error, report, parity_error, written, seconds)
