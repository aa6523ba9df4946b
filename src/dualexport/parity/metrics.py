"""Error metrics between an output and its reference, computed in float64.

Why these five: max abs/rel are what torch.onnx's VerificationInfo reports; cosine and SNR (dB)
are what quantization tooling (ExecuTorch devtools, optimum) reports; the mismatch percentage is
the torch.testing criterion ``|a - r| <= atol + rtol * |r|`` counted per element, so one value says
how much of a tensor is out of tolerance, not just how far the worst element is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Metrics", "compute_metrics", "FloatAgreement", "float_agreement"]


@dataclass(frozen=True)
class Metrics:
    max_abs: float
    max_rel: float
    cosine: float
    snr_db: float
    mismatch_pct: float
    nonfinite_ok: bool
    shape_ok: bool
    ok: bool

    def to_dict(self) -> dict[str, float | bool | str]:
        def enc(v: float | bool) -> float | bool | str:
            if isinstance(v, float) and not math.isfinite(v):
                return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
            return v

        return {k: enc(v) for k, v in self.__dict__.items()}


def compute_metrics(
    actual: torch.Tensor,
    reference: torch.Tensor,
    *,
    rtol: float,
    atol: float,
    scale: float = 0.0,
    min_snr_db: float | None = None,
    min_cosine: float | None = None,
    elementwise: bool = True,
    or_snr_db: float | None = None,
) -> Metrics:
    """Metrics of ``actual`` against ``reference``; ``ok`` applies, per element,
    ``|a - r| <= atol + scale * max|r| + rtol * |r|`` (torch.testing's criterion with an absolute
    tolerance that grows with the output's magnitude), and over the whole output the SNR and
    cosine floors when the output is large enough for them to mean anything (its largest
    magnitude above ``100 * atol``); plus: shapes must match and NaN/Inf must appear exactly where
    the reference has them. With ``elementwise=False`` only the floors decide; with
    ``or_snr_db`` an output that fails the rest still passes when its SNR reaches that level."""
    if tuple(actual.shape) != tuple(reference.shape):
        nan = float("nan")
        return Metrics(nan, nan, nan, nan, 100.0, False, False, False)
    a = actual.detach().to(torch.float64).reshape(-1)
    r = reference.detach().to(torch.float64).reshape(-1)
    if a.numel() == 0:
        return Metrics(0.0, 0.0, 1.0, math.inf, 0.0, True, True, True)
    a_nan, r_nan = torch.isnan(a), torch.isnan(r)
    a_inf, r_inf = torch.isinf(a), torch.isinf(r)
    nonfinite_ok = bool(
        torch.equal(a_nan, r_nan) and torch.equal(a_inf, r_inf) and torch.equal(a[a_inf], r[r_inf])
    )
    finite = torch.isfinite(a) & torch.isfinite(r)
    af, rf = a[finite], r[finite]
    diff = (af - rf).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    denom = rf.abs()
    nz = denom > 0
    rel = diff[nz] / denom[nz]
    max_rel = float(rel.max()) if rel.numel() else (0.0 if max_abs == 0 else math.inf)
    # An element where the reference is exactly zero and the output is not counts as relative inf.
    if bool(((~nz) & (diff > 0)).any()):
        max_rel = math.inf
    na, nr = float(af.norm()), float(rf.norm())
    if na == 0 and nr == 0:
        cosine = 1.0
    elif na == 0 or nr == 0:
        cosine = 0.0
    else:
        cosine = float(torch.dot(af, rf) / (na * nr))
    noise = float((diff**2).sum())
    signal = float((rf**2).sum())
    if noise == 0:
        snr = math.inf
    elif signal == 0:
        snr = -math.inf
    else:
        snr = 10.0 * math.log10(signal / noise)
    magnitude = float(denom.max()) if denom.numel() else 0.0
    bad = ~(diff <= atol + scale * magnitude + rtol * denom)
    n_bad = int(bad.sum()) + int((~finite).sum() if not nonfinite_ok else 0)
    mismatch_pct = 100.0 * n_bad / a.numel()
    ok = nonfinite_ok and (n_bad == 0 or not elementwise)
    if ok and (magnitude > 100 * atol or not elementwise):
        ok = (min_snr_db is None or snr >= min_snr_db) and (min_cosine is None or cosine >= min_cosine)
    if not ok and or_snr_db is not None and nonfinite_ok:
        ok = snr >= or_snr_db
    return Metrics(max_abs, max_rel, cosine, snr, mismatch_pct, nonfinite_ok, True, ok)


@dataclass(frozen=True)
class FloatAgreement:
    """A quantized output against the float model it approximates: what a user asks first about an
    int8 file (how much did quantization cost?), apart from whether the file computes its own
    program. ``top1``: the share of rows (all but the last axis) whose arg-max matches, for an
    output whose last axis holds scores (a classifier's or an LM's logits); None otherwise."""

    cosine: float
    snr_db: float
    top1: float | None

    def to_dict(self) -> dict[str, float | str | None]:
        def enc(v: float | None) -> float | str | None:
            if isinstance(v, float) and not math.isfinite(v):
                return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
            return v

        return {"cosine": enc(self.cosine), "snr_db": enc(self.snr_db), "top1": enc(self.top1)}


def float_agreement(actual: torch.Tensor, float_reference: torch.Tensor) -> FloatAgreement | None:
    """``actual`` against the float model's output (None when they cannot be compared: another
    shape, or not floating point)."""
    if (
        tuple(actual.shape) != tuple(float_reference.shape)
        or not actual.dtype.is_floating_point
        or not float_reference.dtype.is_floating_point
    ):
        return None
    m = compute_metrics(actual, float_reference, rtol=0.0, atol=0.0)
    top1 = None
    if actual.dim() >= 2 and actual.shape[-1] >= 2 and actual.numel() > 0:
        a = actual.detach().reshape(-1, actual.shape[-1]).argmax(-1)
        r = float_reference.detach().reshape(-1, actual.shape[-1]).argmax(-1)
        top1 = float((a == r).double().mean())
    return FloatAgreement(m.cosine, m.snr_db, top1)
