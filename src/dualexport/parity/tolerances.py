"""Default tolerances by dtype and target, in one table users can read and override.

Sources:
- float32 vs eager, ONNX Runtime: rtol = atol = 1e-4. ORT fuses Conv+BatchNorm at load and uses its
  own GEMM kernels; 1e-4 is the tolerance torch.onnx's own tests use for fp32 models
  (``assert_onnx_program`` callers) and Hugging Face optimum's default ``atol`` for ORT validation.
- float32 vs eager, ExecuTorch XNNPACK: rtol = atol = 1e-3, the default of ExecuTorch's XNNPACK
  tester (``run_method_and_compare_outputs(atol=1e-03, rtol=1e-03)``): XNNPACK reorders
  reductions and fuses BatchNorm into convolution weights.
- float16/bfloat16: rtol = atol = 1e-2 (torch.testing's bf16 rtol is 1.6e-2).
- integer and bool outputs: exact.
- int8-quantized programs: judged in quantization steps of the output (one step allowed), see
  ``quantized_tolerance``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

__all__ = ["Tolerance", "DEFAULT_TOLERANCES", "tolerance_for", "quantized_tolerance"]


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    source: str


_FLOAT32 = {
    "onnx": Tolerance(1e-4, 1e-4, "torch.onnx tests / optimum ORT validation (fp32)"),
    "xnnpack": Tolerance(1e-3, 1e-3, "ExecuTorch XNNPACK tester default"),
    "cross": Tolerance(1e-3, 1e-3, "runtime vs runtime: the looser of the two targets"),
}
_HALF = Tolerance(1e-2, 1e-2, "half precision (torch.testing bf16 rtol 1.6e-2)")
_EXACT = Tolerance(0.0, 0.0, "integer/bool outputs must match exactly")

DEFAULT_TOLERANCES: Mapping[tuple[str, str], Tolerance] = {
    **{(t, "float32"): tol for t, tol in _FLOAT32.items()},
    **{(t, "float64"): tol for t, tol in _FLOAT32.items()},
    **{(t, d): _HALF for t in _FLOAT32 for d in ("float16", "bfloat16")},
}


def tolerance_for(
    target: str, dtype: torch.dtype, *, rtol: float | None = None, atol: float | None = None
) -> Tolerance:
    """The tolerance for ``target`` and ``dtype``; a given ``rtol``/``atol`` overrides it."""
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
