"""The default parity criterion: no false alarm on fp32 accumulation differences, while every
divergence a broken export produces still fails.

Synthetic stages first (known answers), then a real deep network with realistic activations
(BatchNorm statistics from data, O(1) logits) exported and compared with the defaults.
"""

from __future__ import annotations

import pathlib

import pytest
import torch

import dualexport as dx
from dualexport.parity import compute_metrics, tolerance_for

TARGETS = ("onnx", "xnnpack")


def _logits(n: int = 1000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, n, generator=g) * 3.0  # O(1) to O(10) logits


def _accumulation_noise(r: torch.Tensor, amplitude: float, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return r + (torch.rand(r.shape, generator=g) * 2 - 1) * amplitude


@pytest.mark.parametrize("target", TARGETS)
def test_a_few_1e4_on_o1_logits_passes(target: str) -> None:
    """What ONNX Runtime does on a deep CNN: a few 1e-4 absolute on O(1) logits (SNR ~ 80 dB).
    torch.testing's elementwise 1e-4 + 1e-4 |r| fails it on the logits near zero; the default
    criterion does not."""
    r = _logits()
    a = _accumulation_noise(r, 3e-4)
    assert not compute_metrics(a, r, rtol=1e-4, atol=1e-4).ok  # the old criterion's false alarm
    m = tolerance_for(target, torch.float32).judge(a, r)
    assert m.ok, m
    assert m.snr_db > 70 and m.cosine > 0.99999


def _swap_op(r: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(r)  # relu -> sigmoid downstream of a layer


def _broken_constant(r: torch.Tensor) -> torch.Tensor:
    a = r.clone()
    a[:, 7] += 0.5  # one channel's bias off by 0.5
    return a


def _masked_row(r: torch.Tensor) -> torch.Tensor:
    a = r.clone()
    a[2] = r.mean(dim=0)  # a fully masked row averaged instead of zeroed
    return a


def _systematic(r: torch.Tensor) -> torch.Tensor:
    return r * (1 + 2e-3)  # a slightly wrong scale everywhere


def _one_element(r: torch.Tensor) -> torch.Tensor:
    a = r.clone()
    a[1, 3] += 0.05 * float(r.abs().max())  # one element 5% of the output's range away
    return a


PLANTED = {
    "swapped-op": _swap_op,
    "broken-constant": _broken_constant,
    "masked-row": _masked_row,
    "systematic-scale": _systematic,
    "one-element": _one_element,
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("plant", list(PLANTED))
def test_planted_divergences_still_fail(target: str, plant: str) -> None:
    r = _logits()
    m = tolerance_for(target, torch.float32).judge(PLANTED[plant](r), r)
    assert not m.ok, (plant, m)


def test_small_outputs_are_judged_elementwise_only() -> None:
    """Outputs near the absolute tolerance (random-weight heads give ~1e-4 logits): SNR and
    cosine mean nothing there, so only the elementwise check applies."""
    r = _logits() * 1e-5
    a = _accumulation_noise(r, 5e-6)
    m = tolerance_for("onnx", torch.float32).judge(a, r)
    assert m.ok and m.snr_db < 60


def test_a_user_tolerance_is_torch_testings_criterion() -> None:
    r = _logits()
    tol = tolerance_for("onnx", torch.float32, rtol=1e-4, atol=1e-4)
    assert tol.source == "user override" and tol.scale == 0 and tol.min_snr_db is None
    assert not tol.judge(_accumulation_noise(r, 3e-4), r).ok


class DeepCNN(torch.nn.Module):
    """Twelve conv/BN/ReLU blocks, a wide head: O(1) logits after BatchNorm from data."""

    def __init__(self) -> None:
        super().__init__()
        layers, c = [], 3
        for i, width in enumerate([32, 32, 64, 64, 64, 128, 128, 128, 256, 256, 256, 256]):
            layers += [
                torch.nn.Conv2d(c, width, 3, stride=2 if i in (2, 5, 8) else 1, padding=1),
                torch.nn.BatchNorm2d(width),
                torch.nn.ReLU(),
            ]
            c = width
        self.features = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(256, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


@pytest.mark.slow
def test_a_deep_cnn_with_realistic_activations_passes_by_default(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    model = DeepCNN()
    model.train()
    with torch.no_grad():  # BatchNorm statistics from data
        for _ in range(4):
            model(torch.randn(8, 3, 32, 32))
        model.head.weight.mul_(20)  # O(1)-O(10) logits, as a trained classifier has
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    logits = model(x)
    assert 1.0 < float(logits.abs().max()) < 100 and float(logits.std()) > 0.3  # not vacuous
    res = dx.export(model, (x,), out_dir=tmp_path, name="deep", cache=False)
    assert not res.errors
    report = dx.compare(res, generate=1)
    assert report.ok, report.to_markdown()
    for o in report.outputs:
        for rt, m in o.metrics.items():
            assert m.snr_db > 60, (o.label, rt, m)
