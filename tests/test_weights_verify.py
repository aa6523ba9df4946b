"""verify_weights re-reads the artifacts from disk: it passes on good files and names the entry
when a weight of an artifact is changed on disk, or when the holder changes after export."""

from __future__ import annotations

import pathlib
import shutil

import onnx
import pytest
import torch

import dualexport as dx
from dualexport.shared_state import tensor_bytes
from models import MLP


@pytest.fixture
def res(tmp_path: pathlib.Path) -> dx.ExportResult:
    r = dx.export(MLP(), (torch.randn(2, 16),), out_dir=tmp_path, name="mlp")
    assert not r.errors
    return r


def _flip_byte_at(path: pathlib.Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_good_artifacts_pass(res: dx.ExportResult) -> None:
    check = res.verify_weights()
    assert check.entries == 4
    assert check.exact == {"onnx": 4, "xnnpack": 4}


def test_onnx_external_data_weight_changed_on_disk(res: dx.ExportResult) -> None:
    loc = res.manifest.entry("net.0.weight").locations["onnx"]
    assert ".onnx.data@" in loc.where  # 2 KiB: above the external-data threshold
    data_file, offset = loc.where.split(":", 1)[1].split("@", 1)[1].split("@")
    _flip_byte_at(res.out_dir / data_file, int(offset) + 7)
    with pytest.raises(dx.WeightMismatchError, match=r"onnx: weight 'net\.0\.weight' differs on disk") as ei:
        res.verify_weights()
    assert len(ei.value.problems) == 1


def test_onnx_inline_weight_changed_on_disk(res: dx.ExportResult) -> None:
    path = res.artifacts["onnx"].path
    model = onnx.load(str(path), load_external_data=False)
    init = next(i for i in model.graph.initializer if i.name == "net.2.bias")
    raw = bytearray(init.raw_data)
    raw[0] ^= 0x01
    init.raw_data = bytes(raw)
    onnx.save(model, str(path))
    with pytest.raises(dx.WeightMismatchError, match=r"net\.2\.bias") as ei:
        res.verify_weights()
    assert ei.value.problems and all("net.2.bias" in p for p in ei.value.problems)


def test_pte_weight_changed_on_disk(res: dx.ExportResult) -> None:
    path = res.artifacts["xnnpack"].path
    w = res.program.state_dict["net.2.weight"]
    blob = bytes(tensor_bytes(w))
    data = path.read_bytes()
    offset = data.find(blob)
    assert offset > 0 and data.count(blob) == 1
    _flip_byte_at(path, offset + 5)
    with pytest.raises(dx.WeightMismatchError, match=r"xnnpack: weight 'net\.2\.weight' differs on disk"):
        res.verify_weights()


def test_holder_changed_after_export_is_stale(res: dx.ExportResult) -> None:
    with torch.no_grad():
        res.program.state_dict["net.0.bias"].add_(1.0)
    with pytest.raises(dx.WeightMismatchError, match=r"'net\.0\.bias' is stale"):
        res.verify_weights()


def test_missing_data_file_is_a_clear_error(res: dx.ExportResult) -> None:
    (res.out_dir / "mlp.onnx.data").unlink()
    with pytest.raises(dx.ArtifactIOError, match="mlp.onnx.data"):
        res.verify_weights()


def test_compare_dir_rechecks_from_disk(res: dx.ExportResult, tmp_path: pathlib.Path) -> None:
    from dualexport.parity.folder import compare_dir

    copy = tmp_path / "copy"
    shutil.copytree(res.out_dir, copy)
    report, check, werr, name = compare_dir(copy)
    assert name == "mlp" and werr is None and check is not None and report.ok


def test_an_empty_constant_is_not_a_missing_weight(tmp_path: pathlib.Path) -> None:
    """XLM's attention starts a transformers cache layer as ``torch.tensor([])`` and concatenates
    the keys to it: torch.export lifts a constant of 0 elements, which a file need not (and the
    ONNX pipeline does not) store. Nothing to carry is not a missing weight; the real weights are
    still proven."""
    from torch import nn

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            keys = torch.tensor([])  # DynamicLayer's empty start
            return self.fc(torch.cat([keys, x], dim=-1))

    res = dx.export(M().eval(), (torch.randn(2, 4),), out_dir=tmp_path, name="m", cache=False)
    assert not res.errors, dict(res.errors)
    empties = [e for e in res.manifest.entries if e.nbytes == 0]
    assert empties, "the trace lifted no empty constant: the test no longer tests it"
    check = res.verify_weights()
    assert all(e.locations[t].status in ("not_stored", "exact") for e in empties for t in e.locations)
    assert res.manifest.entry("fc.weight").locations["onnx"].status in ("exact", "transformed")
    assert check.entries == len(res.manifest.entries)
