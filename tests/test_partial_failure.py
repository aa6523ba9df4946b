"""One target failing leaves the other target's artifact written, and the error says which op,
where in the model, and what to try."""

from __future__ import annotations

import pathlib

import pytest
import torch

import dualexport as dx
from models import WithCdist


def test_onnx_failure_leaves_xnnpack_artifact(tmp_path: pathlib.Path) -> None:
    res = dx.export(WithCdist(), (torch.randn(5, 4),), out_dir=tmp_path, name="cd")
    assert set(res.errors) == {"onnx"} and set(res.artifacts) == {"xnnpack"}
    err = res.errors["onnx"]
    assert isinstance(err, dx.OnnxLoweringError) and err.target == "onnx"
    text = str(err)
    assert "aten._cdist_forward.default" in text  # which op
    assert "node '_cdist_forward'" in text  # which node
    assert "models.py" in text and "torch.cdist" in text  # the user's line
    assert "What to try" in text and "target='xnnpack'" in text
    assert not (tmp_path / "cd.onnx").exists()
    assert (tmp_path / "cd.pte").is_file()
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]
    # the surviving artifact is still proven: weights and numerics
    res.verify_weights()
    report = dx.compare(res)
    assert report.ok and report.runtimes == ("xnnpack",)


def test_strict_turns_a_target_failure_into_an_exception(tmp_path: pathlib.Path) -> None:
    with pytest.raises(dx.OnnxLoweringError, match="_cdist_forward"):
        dx.export(WithCdist(), (torch.randn(5, 4),), out_dir=tmp_path, name="cd", strict=True)
