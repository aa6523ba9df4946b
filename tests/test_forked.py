"""Concurrent lowering: XNNPACK in a forked worker while ONNX exports in the parent.

Stages: export serial -> export with the forked worker -> the same files byte for byte, the same
manifest, the worker really used -> parity of the forked set against eager. Then the failure
paths: a worker that raises, crashes or stalls hands the work back to the parent, whose result
(or error) is the in-process one.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import signal
import time

import pytest
import torch

import dualexport as dx
from dualexport.exporters import forked
from dualexport.exporters.base import ExportOptions
from dualexport.exporters.forked import ForkedCall, parallel_worthwhile
from models import ConvBN
from zoo.models import MaxPoolDefaultStride


def _digests(res: dx.ExportResult) -> dict[str, str]:
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest() for a in res.artifacts.values() for f in a.files
    }


def test_forked_export_writes_the_serial_bytes(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    model, args = ConvBN().eval(), (torch.randn(2, 3, 16, 16),)
    serial = dx.export(
        model,
        args,
        out_dir=tmp_path / "serial",
        name="m",
        cache=False,
        options=ExportOptions(parallel=False),
        strict=True,
    )
    par = dx.export(
        model,
        args,
        out_dir=tmp_path / "forked",
        name="m",
        cache=False,
        options=ExportOptions(parallel=True),
        strict=True,
    )
    assert isinstance(par.artifacts["xnnpack"].outcome, dx.Lowered)
    assert par.artifacts["xnnpack"].outcome.forked is True
    assert serial.artifacts["xnnpack"].outcome.forked is False
    assert _digests(par) == _digests(serial)
    assert par.manifest.to_json() == serial.manifest.to_json()
    # the worker's report crossed the process boundary intact
    assert par.artifacts["xnnpack"].delegation == serial.artifacts["xnnpack"].delegation
    assert par.artifacts["xnnpack"].outcome.kept_not_shared == ()
    # the parent still holds the decomposed program the worker lowered, linked to the one dict
    assert par.program.decomposed["xnnpack"].state_dict is par.program.state_dict
    assert dx.compare(par).ok
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(par.artifacts["xnnpack"].path)).load_method("forward")
    with torch.no_grad():
        eager = model(*args)
    torch.testing.assert_close(method.execute(list(args))[0], eager, rtol=1e-4, atol=1e-5)


def test_forked_lowering_failure_is_the_in_process_error(tmp_path: pathlib.Path) -> None:
    """max_pool2d with its default stride crashes ExecuTorch's XNNPACK partitioner
    (executorch#21488) when the canonicalization that writes the stride out is off
    (``optimize=False``): the worker fails, the parent lowers again and records the same
    diagnosed error a serial export records; ONNX is unaffected."""
    args = (torch.randn(1, 4, 8, 8),)
    errors = {}
    for mode in (False, True):
        res = dx.export(
            MaxPoolDefaultStride(),
            args,
            out_dir=tmp_path / str(mode),
            name="m",
            cache=False,
            optimize=False,
            options=ExportOptions(parallel=mode),
        )
        assert "xnnpack" in res.errors and "onnx" in res.artifacts
        errors[mode] = res.errors["xnnpack"]
    assert type(errors[True]) is type(errors[False])
    assert str(errors[True]) == str(errors[False])


def test_worker_exception_crash_and_stall_return_none(monkeypatch: pytest.MonkeyPatch) -> None:
    def raises() -> int:
        raise ValueError("boom")

    def crashes() -> int:
        os.kill(os.getpid(), signal.SIGKILL)
        return 1

    def stalls() -> int:
        time.sleep(60)  # no CPU time: looks like a deadlock
        return 1

    assert ForkedCall(lambda: {"x": (1, 2.0)}, "ok").result() == {"x": (1, 2.0)}
    assert ForkedCall(raises, "raises").result() is None
    assert ForkedCall(crashes, "crashes").result() is None
    monkeypatch.setattr(forked, "STALL_SECONDS", 2.0)
    start = time.monotonic()
    assert ForkedCall(stalls, "stalls").result() is None
    assert time.monotonic() - start < 30


def test_an_interrupted_worker_interrupts_the_parent() -> None:
    """Ctrl-C reaches the whole process group: the child's KeyboardInterrupt is not a failure to
    lower again in-process from, the parent stops too."""

    def interrupted() -> int:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        return 1

    with pytest.raises(KeyboardInterrupt):
        ForkedCall(interrupted, "interrupted").result()


def test_auto_mode_stays_serial_for_big_weights() -> None:
    assert not parallel_worthwhile(forked.PARALLEL_WEIGHT_LIMIT + 1)


def test_cancelled_worker_is_killed_and_reaped() -> None:
    call = ForkedCall(lambda: time.sleep(60), "cancelled")
    pid = call._pid
    call.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped: no zombie, no orphan
