"""Error metrics between an output and its reference, computed in float64.

Why these five: max abs/rel are what torch.onnx's VerificationInfo reports; cosine and SNR (dB)
are what quantization tooling (ExecuTorch devtools, optimum) reports; the mismatch percentage is
the torch.testing criterion ``|a - r| <= atol + rtol * |r|`` counted per element, so one value says
how much of a tensor is out of tolerance, not just how far the worst element is.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
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


#: elements judged at a time: float64 temporaries of 32 MB each, where a whole output in float64
#: (a 1B decoder's logits over a 511-token prompt: 65.5 M elements) would take gigabytes per copy
CHUNK = 1 << 22


@dataclass
class _Sums:
    """The running reductions of ``compute_metrics`` over chunks."""

    nonfinite_ok: bool = True
    nonfinite: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    zero_ref_differs: bool = False
    dot: float = 0.0
    sq_a: float = 0.0
    sq_r: float = 0.0
    noise: float = 0.0
    bad: int = 0
    magnitude: float = 0.0


def _chunks(actual: torch.Tensor, reference: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    a, r = actual.detach().reshape(-1), reference.detach().reshape(-1)
    for start in range(0, a.numel(), CHUNK):
        yield (
            a[start : start + CHUNK].to(torch.float64),
            r[start : start + CHUNK].to(torch.float64),
        )


def _magnitude(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest finite reference magnitude where the output is finite too."""
    top = 0.0
    for a, r in _chunks(actual, reference):
        finite = torch.isfinite(a) & torch.isfinite(r)
        if bool(finite.any()):
            top = max(top, float(r[finite].abs().max()))
    return top


def _accumulate(acc: _Sums, a: torch.Tensor, r: torch.Tensor, bound: float, rtol: float) -> None:
    a_nan, r_nan = torch.isnan(a), torch.isnan(r)
    a_inf, r_inf = torch.isinf(a), torch.isinf(r)
    acc.nonfinite_ok = acc.nonfinite_ok and bool(
        torch.equal(a_nan, r_nan) and torch.equal(a_inf, r_inf) and torch.equal(a[a_inf], r[r_inf])
    )
    finite = torch.isfinite(a) & torch.isfinite(r)
    acc.nonfinite += int((~finite).sum())
    af, rf = a[finite], r[finite]
    diff = (af - rf).abs()
    if not diff.numel():
        return
    acc.max_abs = max(acc.max_abs, float(diff.max()))
    denom = rf.abs()
    acc.magnitude = max(acc.magnitude, float(denom.max()))
    nz = denom > 0
    rel = diff[nz] / denom[nz]
    if rel.numel():
        acc.max_rel = max(acc.max_rel, float(rel.max()))
    acc.zero_ref_differs = acc.zero_ref_differs or bool(((~nz) & (diff > 0)).any())
    acc.dot += float(torch.dot(af, rf))
    acc.sq_a += float((af * af).sum())
    acc.sq_r += float((rf * rf).sum())
    acc.noise += float((diff * diff).sum())
    acc.bad += int((~(diff <= bound + rtol * denom)).sum())


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
    ``or_snr_db`` an output that fails the rest still passes when its SNR reaches that level.
    Computed in float64 chunk by chunk (``CHUNK``), so judging costs a few of its
    temporaries, not several float64 copies of the output."""
    if tuple(actual.shape) != tuple(reference.shape):
        nan = float("nan")
        return Metrics(nan, nan, nan, nan, 100.0, False, False, False)
    if actual.numel() == 0:
        return Metrics(0.0, 0.0, 1.0, math.inf, 0.0, True, True, True)
    # the per-element bound needs the largest magnitude first only when it scales with it
    magnitude = _magnitude(actual, reference) if scale else 0.0
    acc = _Sums()
    for a, r in _chunks(actual, reference):
        _accumulate(acc, a, r, atol + scale * magnitude, rtol)
    magnitude = acc.magnitude
    # an element where the reference is exactly zero and the output is not counts as relative inf
    max_rel = math.inf if acc.zero_ref_differs else acc.max_rel
    na, nr = math.sqrt(acc.sq_a), math.sqrt(acc.sq_r)
    if na == 0 and nr == 0:
        cosine = 1.0
    elif na == 0 or nr == 0:
        cosine = 0.0
    else:
        cosine = acc.dot / (na * nr)
    if acc.noise == 0:
        snr = math.inf
    elif acc.sq_r == 0:
        snr = -math.inf
    else:
        snr = 10.0 * math.log10(acc.sq_r / acc.noise)
    n_bad = acc.bad + (acc.nonfinite if not acc.nonfinite_ok else 0)
    mismatch_pct = 100.0 * n_bad / actual.numel()
    ok = acc.nonfinite_ok and (n_bad == 0 or not elementwise)
    if ok and (magnitude > 100 * atol or not elementwise):
        ok = (min_snr_db is None or snr >= min_snr_db) and (min_cosine is None or cosine >= min_cosine)
    if not ok and or_snr_db is not None and acc.nonfinite_ok:
        ok = snr >= or_snr_db
    return Metrics(acc.max_abs, max_rel, cosine, snr, mismatch_pct, acc.nonfinite_ok, True, ok)


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
