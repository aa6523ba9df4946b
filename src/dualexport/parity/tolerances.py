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
- int8-quantized programs: within one quantization step, or inside the quantization noise of
  the reference itself against the float model (``quantized_tolerance``); their intermediate
  values, in localization, by SNR (``quantized_node_tolerance``).
- a user's ``rtol``/``atol`` replaces the criterion with torch.testing's, exactly as given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .metrics import Metrics, compute_metrics

__all__ = [
    "Tolerance",
    "DEFAULT_TOLERANCES",
    "tolerance_for",
    "quantized_tolerance",
    "quantized_node_tolerance",
]


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
    #: False: no per-element check, the floors alone decide (int8 intermediate values)
    elementwise: bool = True
    #: an output that fails the rest passes when its SNR reaches this (int8: the reference's own
    #: quantization noise)
    or_snr_db: float | None = None

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
            elementwise=self.elementwise,
            or_snr_db=self.or_snr_db,
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


#: Bounds of the int8 SNR requirement (see quantized_tolerance).
INT8_SNR_FLOOR_DB, INT8_SNR_CAP_DB = 10.0, 30.0
#: Per-node SNR below which an int8 program's intermediate value is a divergence (localization).
INT8_NODE_SNR_DB = 20.0


def quantized_tolerance(output_scale: float | None, reference_snr_db: float | None = None) -> Tolerance:
    """An int8 program's output against quantized eager.

    It passes within one quantization step everywhere (an element off by one integer level
    differs by exactly ``scale``, which float32 rounds a hair above: the 1e-3 margin), or, as a
    whole, when the runtime stays inside the reference's own quantization noise: its SNR
    against quantized eager at least the SNR of quantized eager against the float model
    (``reference_snr_db``), bounded to [10, 30] dB. Why: a deep network rounds differently at
    every layer in every runtime (ONNX Runtime and XNNPACK requantize with their own rounding), so
    1-LSB differences compound into many steps at the output (MobileNetV2: up to 25 steps,
    cosine 0.98) while the runtime is exactly as close to the float model as the reference is; a
    wrong scale or zero point moves the output by far more than the quantization noise. Without a
    float model to measure against, the requirement is the cap.

    ``output_scale`` None: the output is computed in float after the last dequantize (an int8
    transformer's final LayerNorm, a dynamically quantized linear), so there is no step to count
    in and the noise requirement alone decides. Measured on the transformer families
    (docs/quantization.md): correct files sit 5-20 dB above the requirement; a doubled weight
    scale or a zero point moved by 20 levels in one layer drops 15-40 dB below it.
    """
    need = (
        INT8_SNR_CAP_DB
        if reference_snr_db is None
        else min(max(reference_snr_db, INT8_SNR_FLOOR_DB), INT8_SNR_CAP_DB)
    )
    if output_scale is None:
        return Tolerance(
            0.0,
            0.0,
            f"SNR >= {need:.1f} dB (the reference's own quantization noise; float after the last dequantize)",
            elementwise=False,
            min_snr_db=need,
        )
    return Tolerance(
        0.0,
        output_scale * 1.001,
        f"one quantization step (scale {output_scale:g}), or SNR >= {need:.1f} dB "
        "(the reference's own quantization noise)",
        or_snr_db=need,
    )


def quantized_node_tolerance() -> Tolerance:
    """An int8 program's intermediate value (localization): 1-LSB rounding differences measure
    40-90 dB; a wrong scale or zero point a few dB."""
    return Tolerance(
        0.0,
        0.0,
        f"int8 intermediate: SNR >= {INT8_NODE_SNR_DB:g} dB",
        elementwise=False,
        min_snr_db=INT8_NODE_SNR_DB,
    )
