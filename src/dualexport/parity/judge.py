"""One output of a runtime judged against the reference: the tolerance it gets and the verdict.

Why one place: ``dx.compare`` and the export's own proof of each file (pipeline/prove.py) must
apply the same criterion, or a file could be published as proven that compare then fails (or
the reverse).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .metrics import Metrics, compute_metrics
from .tolerances import Tolerance, quantized_tolerance, tolerance_for

__all__ = ["quantization_noise", "output_tolerance", "judge"]


def quantization_noise(quantized: Sequence[torch.Tensor], floats: Sequence[torch.Tensor]) -> dict[int, float]:
    """Per output, the SNR (dB) of the int8 reference against the float model it approximates."""
    out = {}
    for i, (q, f) in enumerate(zip(quantized, floats, strict=False)):
        if q.dtype.is_floating_point and q.shape == f.shape:
            out[i] = compute_metrics(q, f.to(q.dtype), rtol=0.0, atol=0.0).snr_db
    return out


def output_tolerance(
    runtime: str,
    index: int,
    dtype: torch.dtype,
    *,
    quant_steps: Mapping[int, float | None],
    noise: Mapping[int, float],
    rtol: float | None = None,
    atol: float | None = None,
    overrides: Mapping[int, tuple[float, float]] | None = None,
) -> Tolerance:
    """The tolerance of output ``index`` of ``runtime``: a user's per-output override, else the
    user's rtol/atol, else one quantization step / the reference's own noise for an output of an
    int8 program computed from quantized values (``quant_steps``, from
    ``shared_state.quantize.quantized_outputs``: its step, or None), else the table's
    (parity/tolerances.py)."""
    o_rtol, o_atol = (overrides or {}).get(index, (rtol, atol))
    if index in quant_steps and o_rtol is None and o_atol is None:
        return quantized_tolerance(quant_steps[index], noise.get(index))
    return tolerance_for(runtime, dtype, rtol=o_rtol, atol=o_atol)


def judge(tol: Tolerance, actual: torch.Tensor, reference: torch.Tensor) -> Metrics:
    """``actual`` against ``reference`` under ``tol`` (integer outputs compared in the
    reference's dtype: a runtime may widen int32 to int64)."""
    if actual.dtype != reference.dtype and not reference.dtype.is_floating_point:
        actual = actual.to(reference.dtype)
    return tol.judge(actual, reference)
