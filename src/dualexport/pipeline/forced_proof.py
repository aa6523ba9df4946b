"""The proof of a quantized program's file when its outputs alone cannot decide: linear by linear.

Why a second stage and not a looser bound: an int4 program with per-token int8 activations is
chaotic on real weights (parity/forced.py), so a correct file can land 20-30 dB from the program
end to end, where a loosened bound would also pass a file with one wrong block. Only when a
quantized program's file misses the end-to-end criterion, the file is run again with the value of
every ``linear`` read out, and each linear is judged on the file's own input against a bound derived
from float rounding and two activation steps (parity/forced.py). The file is published when every
linear is within it, its outputs are what the program computes from the file's own linears, and it
stays within the floor of the int8 criterion end to end; otherwise the refusal names the linear.

The values come from the file on disk for ONNX Runtime (its graph with extra outputs, in memory,
the deployed session options). An ExecuTorch delegate has no taps, so a tapped lowering of the same
decomposed program stands in for the file, and counts only if it computes the file's outputs.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from ..errors import ProofMismatchError
from ..parity.forced import ForcedResult, linear_taps, teacher_forced
from ..parity.judge import judge
from ..parity.localize import TappedOnnx, TappedXnnpack, shared_name_of
from ..parity.metrics import compute_metrics
from ..parity.tolerances import INT8_SNR_FLOOR_DB, tolerance_for
from .outcome import ValueCheck
from .reference import ProofSet

__all__ = ["LinearByLinear", "TAPPED_LOWERING_MIN_SNR_DB", "forced_stage"]

logger = logging.getLogger(__name__)

#: the tapped lowering stands for the .pte only if its outputs are the file's to this SNR: the
#: same kernels on the same weights (measured: bit-identical); a different lowering is far below
TAPPED_LOWERING_MIN_SNR_DB = 80.0


class LinearByLinear:
    """The second stage of a quantized file's proof (see the module docstring), for one target."""

    def __init__(
        self,
        target: str,
        shared: ExportedProgram,
        decomposed: ExportedProgram | None,
        provenance: ExportedProgram | None = None,
    ) -> None:
        """``shared``: the program each linear is judged against; ``provenance``: the program
        ``decomposed`` was derived from, when ``shared`` is a copy of it with the same node names
        (a target's approximation, exporters/onnx_quant.py ``kernel_activations``)."""
        self.target = target
        self.shared = shared
        self.decomposed = decomposed
        self._graph_id = id((provenance if provenance is not None else shared).graph)
        self.taps = linear_taps(shared)
        #: the tapped file (ONNX) or lowering (ExecuTorch), made once, run on every refused set
        self._tapped: TappedOnnx | TappedXnnpack | None = None
        #: tapped node of the XNNPACK copy -> the shared linear it comes from
        self._by_node: dict[str, str] = {}

    def __call__(
        self, path: pathlib.Path, case: ProofSet, outs: Sequence[torch.Tensor], mismatch: ProofMismatchError
    ) -> ValueCheck:
        name = path.name
        observed, outs = self._observed(path, case, outs, mismatch)
        forced = teacher_forced(self.shared, list(case.inputs), observed)
        bad = forced.first_failure
        if bad is not None:
            raise ProofMismatchError(
                f"{name} computes the {bad.describe()} {case.where}; end to end: {mismatch.message}",
                target=self.target,
                hint="the file does not compute the quantized program at this layer (a scale, a code "
                "block or a layout); it was not published",
            ) from mismatch
        self._check_outputs(name, case, outs, forced, mismatch)
        ends = [
            compute_metrics(got, want, rtol=0.0, atol=0.0)
            for got, want in zip(outs, case.outputs, strict=True)
            if want.dtype.is_floating_point and got.shape == want.shape
        ]
        snr = min((m.snr_db for m in ends), default=float("inf"))
        if snr < INT8_SNR_FLOOR_DB:
            raise ProofMismatchError(
                f"{name} computes every linear within its bound {case.where} but its outputs are at "
                f"{snr:.1f} dB from the program, below the floor of {INT8_SNR_FLOOR_DB:.0f} dB",
                target=self.target,
                hint="the file does not compute the quantized program; it was not published",
            ) from mismatch
        logger.info(
            "%s: %d linear(s) each within its bound on the file's own input %s (worst %.2fx); end to "
            "end %.1f dB (the quantized program's own rounding, amplified by depth)",
            name,
            len(forced.linears),
            case.where,
            forced.worst,
            snr,
        )
        worst_abs = max((m.max_abs for m in ends), default=0.0)
        return ValueCheck(
            f"{case.label}, linear by linear ({len(forced.linears)})", len(outs), worst_abs, snr
        )

    # ------------------------------------------------------------------------------ the taps
    def _observed(
        self, path: pathlib.Path, case: ProofSet, outs: Sequence[torch.Tensor], mismatch: ProofMismatchError
    ) -> tuple[dict[str, torch.Tensor], Sequence[torch.Tensor]]:
        """The file's value of each tapped linear, and the file's outputs in the same run (ONNX
        Runtime: the deployed session, whose prepacked kernels may sum otherwise than the lean
        session of the first stage)."""
        wanted = set(self.taps)
        if self.target == "onnx":
            derived = self._derived_names(wanted)
            if self._tapped is None:
                self._tapped = TappedOnnx(path, list(derived), deployed=True)
            values = self._tapped.values(list(case.inputs))
            outs = [values.get(f"output:{i}", o) for i, o in enumerate(outs)]
            observed = {}
            for d, s in derived.items():  # graph order: the last derived node holds the value
                if d in values:
                    observed[s] = values[d]
        else:
            observed = self._pte_values(path, case, outs, mismatch, wanted)
        if not observed:
            raise ProofMismatchError(
                f"{path.name} exposes none of the program's {len(self.taps)} linears to check one by "
                f"one; end to end: {mismatch.message}",
                target=self.target,
                hint=mismatch.hint,
            ) from mismatch
        if len(observed) < len(self.taps):
            missing = [n for n in self.taps if n not in observed]
            logger.info(
                "%s: %d of %d linears read from the file (not: %s)",
                path.name,
                len(observed),
                len(self.taps),
                ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else ""),
            )
        return observed, outs

    def _derived_names(self, wanted: set[str]) -> dict[str, str]:
        """Nodes of the target's decomposed program that come from a tapped shared linear."""
        if self.decomposed is None:
            return {}
        out: dict[str, str] = {}
        for n in self.decomposed.graph.nodes:
            s = _source(n, wanted, self._graph_id)
            if s is not None:
                out[n.name] = s
        return out

    def _pte_values(
        self,
        path: pathlib.Path,
        case: ProofSet,
        outs: Sequence[torch.Tensor],
        mismatch: ProofMismatchError,
        wanted: set[str],
    ) -> dict[str, torch.Tensor]:
        if self.decomposed is None:
            raise ProofMismatchError(
                f"{path.name}: {mismatch.message} (its program is not at hand to check it linear by linear)",
                target=self.target,
                hint=mismatch.hint,
            ) from mismatch
        by_node = self._by_node

        def keep(n: torch.fx.Node) -> bool:
            s = _source(n, wanted, self._graph_id)
            if s is None:
                return False
            by_node[n.name] = s
            return True

        if self._tapped is None:
            self._tapped = TappedXnnpack(self.decomposed, keep)
        values = self._tapped.values(list(case.inputs))
        for i, got in enumerate(outs):
            sibling = values.get(f"output:{i}")
            if sibling is None or not got.dtype.is_floating_point:
                continue
            snr = compute_metrics(sibling.to(got.dtype), got, rtol=0.0, atol=0.0).snr_db
            if snr < TAPPED_LOWERING_MIN_SNR_DB:
                raise ProofMismatchError(
                    f"{path.name}: {mismatch.message}; a tapped lowering of its program, run to check it "
                    f"linear by linear, computes output {i} at {snr:.1f} dB from the file, so it cannot "
                    "stand for the file",
                    target=self.target,
                    hint=mismatch.hint,
                ) from mismatch
        observed: dict[str, torch.Tensor] = {}
        for node_name, value in values.items():  # graph order: the last derived node holds the value
            s = by_node.get(node_name)
            if s is not None:
                observed[s] = value
        return observed

    def _check_outputs(
        self,
        name: str,
        case: ProofSet,
        outs: Sequence[torch.Tensor],
        forced: ForcedResult,
        mismatch: ProofMismatchError,
    ) -> None:
        """The file's outputs against what the program computes from the file's own linears."""
        for k, (got, want) in enumerate(zip(outs, forced.outputs, strict=False)):
            if not want.dtype.is_floating_point or got.shape != want.shape:
                continue
            m = judge(tolerance_for(self.target, want.dtype), got, want)
            if not m.ok:
                raise ProofMismatchError(
                    f"{name} computes output {k} {case.where} differently from the program run on the "
                    f"file's own linears: max_abs {m.max_abs:.3g}, SNR {m.snr_db:.1f} dB; end to end: "
                    f"{mismatch.message}",
                    target=self.target,
                    hint="the file departs from the program after its last linear",
                ) from mismatch


#: ops that only rearrange a value: a tap on them would make a view an output (ExecuTorch's memory
#: planner refuses a static view of a dynamic base), and the op they view holds the same numbers
_VIEWS = (
    "view",
    "reshape",
    "_unsafe_view",
    "squeeze",
    "unsqueeze",
    "alias",
    "clone",
    "expand",
    "permute",
    "t",
)


def _source(node: torch.fx.Node, wanted: set[str], graph_id: int) -> str | None:
    """The tapped shared linear a derived compute node comes from, by provenance in the shared
    graph (a derived program renames its nodes, so a bare name may be another node's)."""
    if node.op != "call_function" or not isinstance(node.meta.get("val"), torch.Tensor):
        return None
    op = str(getattr(node.target, "__name__", node.target)).split(".")[0]
    if op in _VIEWS:
        return None
    return shared_name_of(node, wanted, graph_id)


def forced_stage(target: str, shared: Any, decomposed: Any, provenance: Any = None) -> LinearByLinear | None:
    """The second stage for a quantized shared program (or a target's approximation of it, a copy
    of ``provenance``), None for any other."""
    from ..exporters.onnx_quant import uses_torchao

    return LinearByLinear(target, shared, decomposed, provenance) if uses_torchao(shared) else None
