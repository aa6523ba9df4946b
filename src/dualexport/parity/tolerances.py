"""Default tolerances by dtype and target, in one table users can read and override.

The float criterion, per element: ``|a - r| <= atol + scale * max|r| + rtol * |r|``; over the
output: SNR >= ``min_snr_db`` and cosine >= ``min_cosine`` when the output is large enough for
them to mean anything (its largest magnitude above ``100 * atol``).

Why the magnitude-scaled absolute term and the floors: on deep networks with realistic
activations (BatchNorm statistics from data) ONNX Runtime differs from eager by a few 1e-4 on
O(1) logits (cosine 1.0, SNR > 100 dB): fp32 accumulation in another order, not a bug, yet
torch.testing's elementwise ``1e-4 + 1e-4 * |r|`` fails it on every logit near zero. A
tolerance of one part in 10^4 of the output's own largest magnitude admits accumulation error
at any scale, and the floors keep a small but systematic error (a slightly wrong constant) from
hiding under it. What a real divergence does is far outside both: a swapped op, a broken
constant or a masked row computed differently moves elements by a large fraction of the
output's magnitude and drops the SNR to tens of dB (tests/test_parity_criterion.py plants each
one and measures).

Sources:
- float32, ONNX Runtime: rtol = atol = 1e-4, the tolerance torch.onnx's own tests use for fp32
  models (``assert_onnx_program`` callers) and Hugging Face optimum's default ``atol`` for ORT
  validation; scale 1e-4 (the same part per 10^4, of the output's magnitude); SNR >= 60 dB,
  cosine >= 0.99999 (correct exports measure above 100 dB; docs/benchmarks.md).
- float32, ExecuTorch XNNPACK: rtol = atol = 1e-3, the default of ExecuTorch's XNNPACK tester
  (``run_method_and_compare_outputs(atol=1e-03, rtol=1e-03)``): XNNPACK reorders reductions and
  fuses BatchNorm into convolution weights; scale 1e-3; SNR >= 60 dB, cosine >= 0.99999 (correct
  exports measure 115-125 dB on torchvision classifiers; a 0.2% systematic error is 54 dB).
- float16/bfloat16: rtol = atol = 1e-2 (torch.testing's bf16 rtol is 1.6e-2), scale 1e-2,
  SNR >= 20 dB.
- integer and bool outputs: exact.
- int8-quantized programs: judged against the quantization noise of the reference itself
  (``quantized_tolerance``).
- a user's ``rtol``/``atol`` replaces the criterion with torch.testing's, exactly as given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .metrics import Metrics, compute_metrics

__all__ = ["Tolerance", "DEFAULT_TOLERANCES", "tolerance_for", "quantized_tolerance"]


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    source: str
    #: absolute tolerance per unit of the reference's largest magnitude
    scale: float = 0.0
    #: floors over the whole output (None: not checked)
    min_snr_db: float | None = None
    min_cosine: float | None = None

    def judge(self, actual: torch.Tensor, reference: torch.Tensor) -> Metrics:
        """The metrics of ``actual`` against ``reference`` under this tolerance."""
        return compute_metrics(
            actual,
            reference,
            rtol=self.rtol,
            atol=self.atol,
            scale=self.scale,
            min_snr_db=self.min_snr_db,
            min_cosine=self.min_cosine,
        )


_FLOAT32 = {
    "onnx": Tolerance(
        1e-4,
        1e-4,
        "torch.onnx tests / optimum ORT validation (fp32), magnitude-scaled",
        scale=1e-4,
        min_snr_db=60.0,
        min_cosine=0.99999,
    ),
    "xnnpack": Tolerance(
        1e-3,
        1e-3,
        "ExecuTorch XNNPACK tester default, magnitude-scaled",
        scale=1e-3,
        min_snr_db=60.0,
        min_cosine=0.99999,
    ),
    "cross": Tolerance(
        1e-3,
        1e-3,
        "runtime vs runtime: the looser of the two targets",
        scale=1e-3,
        min_snr_db=60.0,
        min_cosine=0.99999,
    ),
}
_HALF = Tolerance(
    1e-2,
    1e-2,
    "half precision (torch.testing bf16 rtol 1.6e-2), magnitude-scaled",
    scale=1e-2,
    min_snr_db=20.0,
)
_EXACT = Tolerance(0.0, 0.0, "integer/bool outputs must match exactly")

DEFAULT_TOLERANCES: Mapping[tuple[str, str], Tolerance] = {
    **{(t, "float32"): tol for t, tol in _FLOAT32.items()},
    **{(t, "float64"): tol for t, tol in _FLOAT32.items()},
    **{(t, d): _HALF for t in _FLOAT32 for d in ("float16", "bfloat16")},
}


def tolerance_for(
    target: str, dtype: torch.dtype, *, rtol: float | None = None, atol: float | None = None
) -> Tolerance:
    """The tolerance for ``target`` and ``dtype``; a given ``rtol``/``atol`` replaces it with
    torch.testing's elementwise criterion (the other of the two kept from the table)."""
    name = str(dtype).replace("torch.", "")
    if not dtype.is_floating_point:
        base = _EXACT
    else:
        base = DEFAULT_TOLERANCES.get((target, name), _FLOAT32.get(target, _FLOAT32["cross"]))
    if rtol is None and atol is None:
        return base
    return Tolerance(
        base.rtol if rtol is None else rtol, base.atol if atol is None else atol, "user override"
    )


def quantized_tolerance(output_scale: float, steps: float = 1.0) -> Tolerance:
    """One quantization step of the output, as an absolute tolerance.

    An element off by one integer level differs by exactly ``scale``, which float32 arithmetic
    can round a hair above; the 1e-3 relative margin admits that and nothing near two steps.
    """
    return Tolerance(
        0.0, steps * output_scale * 1.001, f"{steps:g} quantization step(s) (scale {output_scale:g})"
    )
