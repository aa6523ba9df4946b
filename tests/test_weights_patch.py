"""Weights-only re-export: the previous files patched, never re-lowered, and never different.

Each test: export -> change weights in place (same graph) -> export into the same folder (the
patch, or a fallback to lowering) -> export the changed model with cache=False into a fresh
folder -> every file byte-identical, the manifests equal, the patched set matches eager.
"""

from __future__ import annotations

import hashlib
import pathlib

import pytest
import torch
from torch import nn

import dualexport as dx
from models import ConvBN


def _sha(res: dx.ExportResult) -> dict[str, str]:
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest() for a in res.artifacts.values() for f in a.files
    }


def _patched(res: dx.ExportResult) -> dict[str, int]:
    return {t: a.outcome.patched for t, a in res.artifacts.items() if isinstance(a.outcome, dx.Patched)}


def _without_strategy(manifest: dx.WeightManifest) -> dict:
    """The manifest without how each file was made (patched here, lowered there)."""
    data = manifest.to_dict()
    for info in data["artifacts"].values():
        info.pop("strategy", None)
        info.pop("lowered_because", None)
    return data


def _again_and_fresh(
    model: nn.Module, args: tuple, tmp: pathlib.Path
) -> tuple[dx.ExportResult, dx.ExportResult]:
    again = dx.export(model, args, out_dir=tmp / "set", name="m", strict=True)
    fresh = dx.export(model, args, out_dir=tmp / "fresh", name="m", strict=True, cache=False)
    assert _sha(again) == _sha(fresh)
    assert _without_strategy(again.manifest) == _without_strategy(fresh.manifest)
    assert dx.compare(again).ok
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(again.artifacts["xnnpack"].path)).load_method("forward")
    with torch.no_grad():
        torch.testing.assert_close(method.execute(list(args))[0], model(*args), rtol=1e-3, atol=1e-3)
    return again, fresh


class MLPNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.net(x))


def test_linear_weights_are_patched_in_both_files(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    model, args = MLPNorm().eval(), (torch.randn(4, 32),)
    dx.export(model, args, out_dir=tmp_path / "set", name="m", strict=True)
    with torch.no_grad():
        model.net[0].weight.mul_(1.5)
        model.net[2].bias.add_(0.25)
    again, _ = _again_and_fresh(model, args, tmp_path)
    assert _patched(again) == {"onnx": 2, "xnnpack": 2}
    # patched targets defer their decompositions, which still link to the one dict when read
    assert again.program._decomposed == {}
    assert all(d.state_dict is again.program.state_dict for d in again.program.decomposed.values())


@pytest.mark.slow  # test_shared_weights[hand] patches a transposed copy in the default run
def test_transposed_onnx_weights_are_patched(tmp_path: pathlib.Path) -> None:
    """A Linear on a 3-D input becomes a MatMul whose weight the ONNX pipeline stores transposed
    (the manifest says ``transformed`` with the permutation): a weights-only change writes the
    new value, transposed, in its place instead of lowering ONNX again (as every decoder's
    projections need)."""
    torch.manual_seed(0)
    model, args = MLPNorm().eval(), (torch.randn(2, 5, 32),)
    first = dx.export(model, args, out_dir=tmp_path / "set", name="m", strict=True)
    loc = next(e for e in first.manifest.entries if e.name == "net.0.weight").locations["onnx"]
    assert loc.status == "transformed" and loc.permutation == (1, 0)
    with torch.no_grad():
        model.net[0].weight.mul_(1.5)
        model.net[2].weight.add_(0.25)
    again, _ = _again_and_fresh(model, args, tmp_path)
    assert _patched(again) == {"onnx": 2, "xnnpack": 2}
    again.verify_weights()


def test_folded_weight_change_relowers_xnnpack_only(tmp_path: pathlib.Path) -> None:
    """BatchNorm statistics are folded into the conv by XNNPACK (not stored as-is): that target
    lowers again; ONNX keeps BatchNorm's initializers exactly and is patched."""
    torch.manual_seed(0)
    model, args = ConvBN().eval(), (torch.randn(2, 3, 16, 16),)
    dx.export(model, args, out_dir=tmp_path / "set", name="m", strict=True)
    bn = next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    with torch.no_grad():
        bn.running_var.mul_(2.0)
    again, _ = _again_and_fresh(model, args, tmp_path)
    assert _patched(again) == {"onnx": 1}


@pytest.mark.slow  # fallback cases beyond the default run's budget
def test_shared_bytes_are_not_patched(tmp_path: pathlib.Path) -> None:
    """Two zero biases are one XNNPACK named-data entry (keyed by content): changing one cannot
    be a byte patch, so XNNPACK lowers again."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).eval()
    with torch.no_grad():
        model[0].bias.zero_()
        model[2].bias.zero_()
    args = (torch.randn(2, 8),)
    dx.export(model, args, out_dir=tmp_path / "set", name="m", strict=True)
    with torch.no_grad():
        model[2].bias.fill_(0.5)
    again, _ = _again_and_fresh(model, args, tmp_path)
    assert "xnnpack" not in _patched(again)


@pytest.mark.slow  # test_shared_weights: a previous file that computes something else (default run)
def test_tampered_previous_file_is_lowered_again(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    model, args = MLPNorm().eval(), (torch.randn(4, 32),)
    first = dx.export(model, args, out_dir=tmp_path / "set", name="m", strict=True)
    data = first.out_dir / "m.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF  # the first weight's first byte: the patcher's check must notice
    data.write_bytes(bytes(raw))
    with torch.no_grad():
        model.net[0].weight.mul_(1.5)
    again, _ = _again_and_fresh(model, args, tmp_path)
    assert "onnx" not in _patched(again)


def test_changed_graph_is_not_patched(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    model, args = MLPNorm().eval(), (torch.randn(4, 32),)
    dx.export(model, args, out_dir=tmp_path / "set", name="m", strict=True)
    model.norm = nn.Identity()
    again = dx.export(model, args, out_dir=tmp_path / "set", name="m", strict=True)
    assert _patched(again) == {}
    assert not any(isinstance(a.outcome, dx.Reused) for a in again.artifacts.values())


@pytest.mark.slow  # fallback cases beyond the default run's budget
def test_new_value_equal_to_another_weight_is_not_patched(tmp_path: pathlib.Path) -> None:
    """A changed bias becomes byte-equal to an unchanged one: a fresh lowering stores the two as
    one named-data entry (XNNPACK keys by content) and one initializer (the ONNX pipeline
    deduplicates equal ones), which rewriting one place cannot produce: both lower again."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).eval()
    args = (torch.randn(2, 8),)
    dx.export(model, args, out_dir=tmp_path / "set", name="m", strict=True)
    with torch.no_grad():
        model[2].bias.copy_(model[0].bias)
    again, _ = _again_and_fresh(model, args, tmp_path)
    assert _patched(again) == {}
