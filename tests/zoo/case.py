"""One zoo case: how to build the model, what to feed it, and what each target is expected to do.

A case is data, so the same catalogue drives the pytest run and ``scripts/gen_coverage.py``; the
stage logic that decides pass/fail lives in ``runner.py`` once, for both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Case", "InputSet", "TARGETS"]

TARGETS: tuple[str, ...] = ("onnx", "xnnpack")

#: ``(args, kwargs)`` for one call of the model.
InputSet = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class Case:
    """A small model and the expectations a run of it is checked against.

    ``inputs`` builds the example inputs used for tracing; ``extra_inputs`` builds more input sets
    for the parity check (for dynamic shapes: each declared dim at its min, a middle value and its
    max). ``xfail`` maps a target to the reason it is expected to fail; every reason names the
    library limit or the dualexport bug, and the test runs it ``strict`` so a fix is noticed.
    """

    name: str
    factory: Callable[[], torch.nn.Module]
    inputs: Callable[[], InputSet]
    description: str = ""
    dynamic_shapes: Callable[[], Any] | None = None
    extra_inputs: Callable[[], list[InputSet]] | None = None
    #: ``(rtol, atol)`` passed to ``dx.compare`` when the defaults are too tight for the case.
    tolerance: tuple[float, float] | None = None
    #: ``dx.compare(steps=...)``: stateful cases run more than one step from a fresh state.
    steps: int = 1
    #: XNNPACK structural expectation: exact number of delegated subgraphs.
    xnnpack_subgraphs: int | None = None
    #: XNNPACK structural expectation: ops that are allowed to stay outside the delegate
    #: (anything else left outside fails the case); ``None`` leaves the set unchecked (HF models,
    #: whose glue ops change between transformers releases).
    xnnpack_allowed_non_delegated: frozenset[str] | None = frozenset()
    #: XNNPACK structural expectation: ops that must be delegated wherever they occur.
    xnnpack_must_delegate: frozenset[str] = frozenset()
    #: ONNX structural expectation: op types that must appear in the ONNX graph.
    onnx_ops: frozenset[str] = frozenset()
    xfail: Mapping[str, str] = field(default_factory=dict)
    slow: bool = False
    group: str = "zoo"
    #: export with ``quantize="int8"``, calibrated on this many fresh draws of ``inputs``
    #: (the parity tolerance is then one quantization step of each output).
    int8_calibration: int = 0

    def expected(self, target: str) -> str:
        """``"pass"`` or ``"xfail"``: what the coverage table must show for ``target``."""
        return "xfail" if target in self.xfail else "pass"

    def all_input_sets(self) -> list[InputSet]:
        """The extra input sets handed to ``dx.compare`` (the example inputs are always used)."""
        return list(self.extra_inputs()) if self.extra_inputs else []
