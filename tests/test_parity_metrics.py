"""Metrics on synthetic tensors with known answers, and tolerance behaviour."""

from __future__ import annotations

import math

import pytest
import torch

from dualexport.parity import compute_metrics, tolerance_for


def test_identical_tensors() -> None:
    r = torch.tensor([1.0, -2.0, 3.0])
    m = compute_metrics(r.clone(), r, rtol=0.0, atol=0.0)
    assert m.ok and m.max_abs == 0 and m.max_rel == 0 and m.cosine == pytest.approx(1.0)
    assert math.isinf(m.snr_db) and m.mismatch_pct == 0


def test_known_answers() -> None:
    r = torch.tensor([1.0, 2.0, 4.0, 8.0])
    a = torch.tensor([1.0, 2.5, 4.0, 6.0])
    m = compute_metrics(a, r, rtol=0.0, atol=0.6)
    assert m.max_abs == pytest.approx(2.0)
    assert m.max_rel == pytest.approx(0.25)  # 0.5/2 and 2/8
    cos = float(torch.dot(a, r) / (a.norm() * r.norm()))
    assert m.cosine == pytest.approx(cos)
    assert m.snr_db == pytest.approx(10 * math.log10(85.0 / 4.25))  # 1+4+16+64 over 0.25+4
    assert m.mismatch_pct == pytest.approx(25.0)  # only |8-6| > 0.6
    assert not m.ok


def test_tolerance_zero_fails_on_any_difference() -> None:
    r = torch.randn(100, dtype=torch.float32)
    a = r.clone()
    a[17] = torch.nextafter(a[17], torch.tensor(float("inf")))  # one ulp away
    assert not compute_metrics(a, r, rtol=0.0, atol=0.0).ok
    assert compute_metrics(a, r, rtol=1e-6, atol=1e-6).ok


def test_nan_where_reference_is_finite_fails_whatever_the_tolerance() -> None:
    r = torch.zeros(4)
    a = torch.tensor([0.0, float("nan"), 0.0, 0.0])
    m = compute_metrics(a, r, rtol=1e9, atol=1e9)
    assert not m.nonfinite_ok and not m.ok
    both = compute_metrics(
        torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]), rtol=0, atol=0
    )
    assert both.ok  # the same NaN pattern is agreement


def test_value_where_reference_is_zero_has_infinite_relative_error() -> None:
    m = compute_metrics(torch.tensor([0.0, 1e-3]), torch.tensor([0.0, 0.0]), rtol=0.1, atol=0.0)
    assert math.isinf(m.max_rel) and not m.ok and m.cosine == 0.0


def test_shape_mismatch_fails() -> None:
    m = compute_metrics(torch.zeros(2, 3), torch.zeros(3, 2), rtol=1, atol=1)
    assert not m.shape_ok and not m.ok


def test_default_tolerances_by_dtype_and_target() -> None:
    assert tolerance_for("onnx", torch.float32).atol == 1e-4
    assert tolerance_for("xnnpack", torch.float32).atol == 1e-3
    assert tolerance_for("xnnpack", torch.int64).atol == 0.0
    assert tolerance_for("onnx", torch.bfloat16).rtol == 1e-2
    over = tolerance_for("onnx", torch.float32, atol=0.5)
    assert over.atol == 0.5 and over.rtol == 1e-4 and over.source == "user override"
