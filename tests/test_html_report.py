"""The HTML report opens in headless Chromium and its screenshot shows the plots."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
import torch

import dualexport as dx
from chromium import CHROMIUM, count_color, screenshot
from models import ConvBN


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is absent from this machine (.ci/run installs it)")
def test_html_report_renders_plots(tmp_path: pathlib.Path) -> None:
    res = dx.export(ConvBN(), (torch.randn(1, 3, 8, 8),), out_dir=tmp_path / "out", name="cb")
    model = onnx.load(str(res.artifacts["onnx"].path), load_external_data=False)
    init = next(i for i in model.graph.initializer if i.name == "bn.weight")
    arr = np.frombuffer(init.raw_data, dtype=np.float32).copy()
    arr[1] += 0.3
    init.raw_data = arr.tobytes()
    onnx.save(model, str(res.artifacts["onnx"].path))
    report = dx.compare(res)
    assert not report.ok and report.first_divergence["onnx"] == "batch_norm"
    html = report.save_html(tmp_path / "out" / "report.html")
    text = html.read_text()
    assert text.count("<svg") >= 3 and "batch_norm" in text and "<script" not in text
    png = tmp_path / "shot.png"
    screenshot(html, png, tmp_path / "profile")
    assert png.stat().st_size > 10_000
    assert count_color(png, (0x1F, 0x77, 0xB4)) > 200  # ONNX histogram bars and error curve
    assert count_color(png, (0xD6, 0x27, 0x28)) > 200  # XNNPACK histogram bars
