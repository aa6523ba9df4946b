"""Issue 48: nothing raw escapes a public entry point, and a runtime failure names its cause.

A stage that raises something that is not a ``DualExportError`` becomes an ``InternalError``
naming the stage, with the original chained, and nothing is published; an ONNX Runtime load
failure for a missing kernel names the op and node (not "check the .onnx.data"); an ExecuTorch run
failure names its error code and the ops outside the delegate (not "check input shapes").
"""

from __future__ import annotations

import pathlib

import pytest
import torch

import dualexport as dx
from dualexport import errors as E
from dualexport.runtimes.executorch import _run_error, portable_operators
from dualexport.runtimes.ort import _load_error
from helpers_reliability import leftovers, tiny


def test_a_raw_exception_in_the_side_files_is_an_internal_error_and_nothing_is_published(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dualexport.pipeline.export as pipeline_export

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("serializer exploded")

    monkeypatch.setattr(pipeline_export, "_write_side_files", boom)
    m, a = tiny(3)
    out = tmp_path / "out"
    with pytest.raises(
        E.InternalError, match=r"writing the re-export cache.*RuntimeError: serializer exploded"
    ) as info:
        dx.export(m, a, out_dir=out, name="m", target="onnx")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert not list(out.glob("m.*")) and leftovers(out) == []


def test_a_raw_exception_in_compare_is_an_internal_error(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dualexport.parity.compare as parity_compare

    m, a = tiny(4)
    res = dx.export(m, a, out_dir=tmp_path, name="m", target="onnx")

    def boom(*_a: object, **_k: object) -> None:
        raise KeyError("lost output")

    monkeypatch.setattr(parity_compare, "run_parity", boom)
    with pytest.raises(E.InternalError, match=r"compare raised KeyError") as info:
        dx.compare(res)
    assert isinstance(info.value.__cause__, KeyError)


def test_ort_missing_kernel_names_the_op_and_node() -> None:
    exc = RuntimeError(
        "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Gemm(13) "
        "node with name 'node_linear'"
    )
    err = _load_error(pathlib.Path("m.onnx"), exc)
    assert isinstance(err, E.RuntimeLoadError)
    assert "no CPU kernel for Gemm (opset 13) at node 'node_linear' of m.onnx" in str(err)
    assert "float32" in err.hint and ".onnx.data" not in err.hint
    other = _load_error(pathlib.Path("m.onnx"), RuntimeError("INVALID_PROTOBUF : Load model failed"))
    assert ".onnx.data" in other.hint  # a damaged file is still told to look at its files


class _Cumsum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(torch.relu(x), dim=-1)  # cumsum stays outside the XNNPACK delegate


def test_executorch_run_error_names_its_code_and_the_ops_outside_the_delegate(tmp_path: pathlib.Path) -> None:
    res = dx.export(_Cumsum(), (torch.randn(2, 8),), out_dir=tmp_path, name="m", target="xnnpack")
    pte = res.artifacts["xnnpack"].path
    ops = portable_operators(pte)
    assert any("cumsum" in op for op in ops), ops
    err = _run_error(pte, RuntimeError("Failed to execute method forward, error: 0x12"))
    assert isinstance(err, E.RuntimeExecutionError)
    assert "(InvalidArgument)" in str(err) and "cumsum" in str(err)
    assert "no portable kernel" in err.hint
