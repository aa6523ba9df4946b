"""Re-exporting an unchanged model reuses the artifacts; the key comes from the traced program,
so a changed forward or a changed weight misses."""

from __future__ import annotations

import pathlib

import torch

import dualexport as dx
from models import MLP


class Scaled(MLP):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * self.factor


def _cached(res: dx.ExportResult) -> set[str]:
    return {t for t, a in res.artifacts.items() if a.details.get("cached")}


def test_unchanged_model_is_reused_and_still_proven(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(2, 16)
    cold = dx.export(model, (x,), out_dir=tmp_path, name="m")
    assert not cold.errors and _cached(cold) == set()
    warm = dx.export(model, (x,), out_dir=tmp_path, name="m")
    assert _cached(warm) == {"onnx", "xnnpack"}
    assert warm.artifacts["xnnpack"].delegation == cold.artifacts["xnnpack"].delegation
    # a hit defers the decompositions (nothing reads them to reuse files); a look computes them
    assert warm.program._decomposed == {}  # noqa: SLF001
    assert set(warm.program.decomposed) == {"onnx", "xnnpack"}
    for t, dec in warm.program.decomposed.items():
        assert dec.state_dict is warm.program.state_dict, t
    assert set(warm.program._decomposed) == {"onnx", "xnnpack"}  # noqa: SLF001
    assert all(r.linked for r in warm.program.links.values())
    warm.verify_weights()
    assert dx.compare(warm).ok
    assert warm.manifest.to_dict()["entries"] == cold.manifest.to_dict()["entries"]
    off = dx.export(model, (x,), out_dir=tmp_path, name="m", cache=False)
    assert _cached(off) == set()


def test_changed_weight_misses(tmp_path: pathlib.Path) -> None:
    model, x = MLP(), torch.randn(2, 16)
    dx.export(model, (x,), out_dir=tmp_path, name="m")
    with torch.no_grad():
        model.net[0].bias[0] += 1.0
    res = dx.export(model, (x,), out_dir=tmp_path, name="m")
    assert _cached(res) == set()
    res.verify_weights()
    assert dx.compare(res).ok


def test_changed_forward_misses(tmp_path: pathlib.Path) -> None:
    a = Scaled(2.0)
    b = Scaled(3.0)  # same class, same weights, different computation
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 16)
    dx.export(a, (x,), out_dir=tmp_path, name="m")
    res = dx.export(b, (x,), out_dir=tmp_path, name="m")
    assert _cached(res) == set()
    assert dx.compare(res).ok
    torch.testing.assert_close(res.program.run_eager(x), b.eval()(x))


def test_tampered_cached_artifact_is_lowered_again(tmp_path: pathlib.Path) -> None:
    model, x = MLP(), torch.randn(2, 16)
    cold = dx.export(model, (x,), out_dir=tmp_path, name="m")
    data = bytearray(cold.artifacts["xnnpack"].path.read_bytes())
    from dualexport.shared_state import tensor_bytes

    blob = bytes(tensor_bytes(cold.program.state_dict["net.2.weight"]))
    data[data.find(blob) + 3] ^= 1
    cold.artifacts["xnnpack"].path.write_bytes(bytes(data))
    warm = dx.export(model, (x,), out_dir=tmp_path, name="m")
    assert _cached(warm) == {"onnx"}
    warm.verify_weights()
