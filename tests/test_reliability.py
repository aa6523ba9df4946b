"""Issue 5: a table of bad inputs and faults. Each row names the error class and a message check,
and every row also proves that nothing outside out_dir changed, that no partial file remains, and
(where a previous export sits in out_dir) that the previous artifacts are byte for byte intact."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from torch.export import Dim

import dualexport as dx
from dualexport import errors as E
from dualexport.exporters.onnx import OnnxExporter
from dualexport.exporters.xnnpack import XnnpackExporter
from dualexport.outputs.lock import export_lock
from dualexport.parity.folder import compare_dir
from helpers_reliability import Tiny, assert_complete_set, leftovers, snapshot, tiny, visible

NAME = "m"


@dataclass
class Ctx:
    tmp: pathlib.Path
    out: pathlib.Path
    mp: pytest.MonkeyPatch

    def export(self, model: Any = None, args: Any = None, **kw: Any) -> Any:
        m, a = tiny(7)
        kw.setdefault("target", "onnx")
        kw.setdefault("name", NAME)
        kw.setdefault("out_dir", self.out)
        return dx.export(m if model is None else model, a if args is None else args, **kw)


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _weights(value: float) -> Tiny:
    m = Tiny()
    with torch.no_grad():
        m.fc.weight[0, 0] = value
    return m


class _Fft(Tiny):
    def __init__(self) -> None:
        super().__init__(features=9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.fft.rfft(x).abs())  # complex in the middle: ExecuTorch has no complex dtype


class _IntOut(Tiny):
    def forward(self, x: torch.Tensor) -> Any:
        return torch.relu(self.fc(x)), 3  # a Python int among the outputs


class _Branchy(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent Python control flow: torch.export cannot trace it
            return x + 1
        return x - 1


def _boom(gm: torch.fx.GraphModule) -> None:
    raise RuntimeError("boom")


def _fail_lower(ctx: Ctx, cls: type, exc: Exception) -> None:
    def lower(self, decomposed, staging, name, options):  # writes half a file, then fails
        (staging / f"{name}{self.suffix}").write_bytes(b"partial")
        raise exc

    ctx.mp.setattr(cls, "lower", lower)
    # The seeds' models differ only in weights, which a re-export would patch into the previous
    # files; a failing patch falls back to lowering, where the fault is.
    _fail_patch(ctx)


def _fail_patch(ctx: Ctx) -> None:
    import dualexport.exporters.patch as patch

    def patch_files(*_a: Any, **_k: Any) -> Any:
        raise ValueError("fault injection: lower instead of patching")

    ctx.mp.setattr(patch, "patch_files", patch_files)


def _truncating_onnx(ctx: Ctx) -> None:
    orig = OnnxExporter.lower

    def lower(self, decomposed, staging, name, options):
        lowered = orig(self, decomposed, staging, name, options)
        p = lowered.files[0]
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
        return lowered

    ctx.mp.setattr(OnnxExporter, "lower", lower)
    _fail_patch(ctx)


def _enospc(*_a: Any, **_k: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


class _Cumsum(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(self.fc(x), 1)


# ---------------------------------------------------------------- corrupting an existing folder
def _truncate(ctx: Ctx, fname: str) -> None:
    p = ctx.out / fname
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _edit_manifest(ctx: Ctx, fn: Callable[[dict], Any]) -> None:
    p = ctx.out / f"{NAME}.weights.json"
    data = json.loads(p.read_text())
    p.write_text(json.dumps(fn(data)))


def _pickled_pt2(ctx: Ctx) -> None:
    from torch.export.pt2_archive.constants import CUSTOM_OBJ_FILENAME_PREFIX

    (ctx.out / f".{NAME}.set.json").unlink(missing_ok=True)  # a crafted folder carries no set record
    with zipfile.ZipFile(ctx.out / f"{NAME}.pt2", "a") as z:
        root = z.namelist()[0].split("/")[0]
        z.writestr(f"{root}/data/constants/{CUSTOM_OBJ_FILENAME_PREFIX}0", b"\x80\x04N.")


def _compare(ctx: Ctx, **kw: Any) -> Any:
    return compare_dir(ctx.out, **kw)


def _cli(ctx: Ctx, *argv: str) -> None:
    from dualexport.cli import EXIT_USAGE, main

    code = main(list(argv))
    assert code == EXIT_USAGE, code
    raise E.InputError(f"cli exited {code}", hint="(the CLI printed the hint)")  # for the row's checks


# ------------------------------------------------------------------------------------- the table
@dataclass
class Row:
    run: Callable[[Ctx], Any]
    error: type[E.DualExportError]
    match: str
    target: str | None = None  # the error is expected in res.errors[target] (partial success)
    prev: bool = True  # a previous export sits in out_dir and must stay intact
    setup: Callable[[Ctx], Any] | None = None  # done before the snapshots


def _row(id_: str, *a: Any, marks: Any = (), **kw: Any) -> Any:
    return pytest.param(Row(*a, **kw), id=id_, marks=marks)


ROWS = [
    # input checks before any work
    _row("model-not-module", lambda c: c.export(model=lambda x: x), E.InputError, r"torch\.nn\.Module"),
    _row("args-list", lambda c: c.export(args=[_x(2, 4)]), E.InputError, r"args must be a tuple"),
    _row("args-bare-tensor", lambda c: c.export(args=_x(2, 4)), E.InputError, r"wrap a single tensor"),
    _row("kwargs-not-dict", lambda c: c.export(kwargs=[1]), E.InputError, r"kwargs must be a dict"),
    _row(
        "input-meta-device",
        lambda c: c.export(args=(torch.empty(2, 4, device="meta"),)),
        E.InputError,
        r"args\[0\] is on device meta.*\n.*\.cpu\(\)",
    ),
    _row(
        "input-channels-last",
        lambda c: c.export(args=(torch.randn(1, 3, 4, 4).to(memory_format=torch.channels_last),)),
        E.InputError,
        r"channels_last.*\n.*contiguous\(\)",
    ),
    _row("input-non-contiguous", lambda c: c.export(args=(_x(4, 2).t(),)), E.InputError, r"non-contiguous"),
    _row(
        "input-nan",
        lambda c: c.export(args=(torch.tensor([[1.0, float("nan"), 0, 0]]),)),
        E.InputError,
        r"args\[0\] holds 1 NaN/Inf",
    ),
    _row("input-numpy", lambda c: c.export(args=(np.zeros((2, 4), np.float32),)), E.InputError, r"numpy"),
    _row("input-sparse", lambda c: c.export(args=(_x(2, 4).to_sparse(),)), E.InputError, r"layout"),
    _row(
        "weights-inf",
        lambda c: c.export(model=_weights(float("inf"))),
        E.InputError,
        r"weights hold NaN or Inf: parameter fc\.weight",
    ),
    _row(
        "weights-meta", lambda c: c.export(model=Tiny().to("meta")), E.InputError, r"on the CPU.*fc\.weight"
    ),
    _row(
        "input-empty-batch",
        lambda c: c.export(args=(_x(0, 4),)),
        E.InputError,
        r"args\[0\] is empty \(shape \(0, 4\): size 0 in dim 0\)",
    ),
    _row(
        "output-python-int",
        lambda c: c.export(model=_IntOut()),
        E.InputError,
        r"non-tensor value as output 1: int 3",
    ),
    _row(
        "model-bfloat16-onnx-refused",
        lambda c: c.export(
            model=Tiny().to(torch.bfloat16), args=(_x(2, 4).bfloat16(),), target=("onnx", "xnnpack")
        ),
        E.OnnxLoweringError,
        r"computes in bfloat16, first at op aten\.linear.*\n.*float32",
        target="onnx",
        prev=False,
    ),
    _row(
        "model-complex-xnnpack-refused",
        lambda c: c.export(model=_Fft(), args=(_x(2, 16),), target=("onnx", "xnnpack")),
        E.XnnpackLoweringError,
        r"computes in complex64, first at op aten\.fft_rfft.*\n.*target='onnx' alone",
        target="xnnpack",
        prev=False,
    ),
    _row("quantize-no-calibration", lambda c: c.export(quantize="int8"), E.InputError, r"needs calibration"),
    _row(
        "quantize-empty-calibration",
        lambda c: c.export(quantize="int8", calibration=[]),
        E.InputError,
        r"calibration is empty",
    ),
    _row(
        "quantize-calibration-not-tuples",
        lambda c: c.export(quantize="int8", calibration=[_x(2, 4)]),
        E.InputError,
        r"calibration\[0\] is a Tensor",
    ),
    _row("quantize-unknown", lambda c: c.export(quantize="int4"), E.InputError, r"not supported"),
    _row(
        "dynamic-bad-dim-index",
        lambda c: c.export(dynamic_shapes=({5: Dim("b")},)),
        E.InputError,
        r"names dim 5.*2 dims",
    ),
    _row(
        "dynamic-wrong-count",
        lambda c: c.export(dynamic_shapes=({0: Dim("b")}, None)),
        E.InputError,
        r"2 entries but forward takes 1 inputs",
    ),
    _row(
        "dynamic-range-excludes-example",
        lambda c: c.export(dynamic_shapes=({0: Dim("b", min=3, max=9)},)),
        E.InputError,
        r"example size 2 is outside",
    ),
    _row(
        "out-dir-is-file",
        lambda c: c.export(out_dir=c.tmp / "f"),
        E.InputError,
        r"not a directory",
        prev=False,
        setup=lambda c: (c.tmp / "f").write_text("x"),
    ),
    _row(
        "out-dir-under-file",
        lambda c: c.export(out_dir=c.tmp / "g" / "sub"),
        E.InputError,
        r"cannot create out_dir",
        prev=False,
        setup=lambda c: (c.tmp / "g").write_text("x"),
    ),
    _row("out-dir-not-path", lambda c: c.export(out_dir=3), E.InputError, r"out_dir must be a path"),
    _row("name-with-separator", lambda c: c.export(name="../escape"), E.InputError, r"not a plain file name"),
    _row("name-dotdot", lambda c: c.export(name=".."), E.InputError, r"not a plain file name"),
    _row("name-hidden", lambda c: c.export(name=".m"), E.InputError, r"leading dot"),
    # faults during the export
    _row(
        "locked-by-another-export",
        lambda c: _locked(c),
        E.ExportLockedError,
        r"another export is writing 'm'",
    ),
    _row("capture-fails", lambda c: c.export(model=_Branchy()), E.CaptureError, r"could not trace _Branchy"),
    _row(
        "transform-raises",
        lambda c: c.export(transforms=[_boom]),
        E.TransformError,
        r"transform _boom raised RuntimeError: boom",
    ),
    _row(
        "onnx-lowering-fails",
        lambda c: _fail_lower(c, OnnxExporter, ValueError("exporter bug")) or c.export(strict=True),
        E.OnnxLoweringError,
        r"\[onnx\] lowering failed: ValueError: exporter bug",
    ),
    _row(
        "onnx-artifact-unloadable",
        lambda c: _truncating_onnx(c) or c.export(strict=True),
        E.RuntimeLoadError,
        r"\[onnx\] ONNX Runtime could not load m\.onnx",
    ),
    _row(
        "disk-full-while-writing",
        lambda c: c.mp.setattr(os, "fsync", _enospc) or c.export(strict=True),
        E.DiskSpaceError,
        r"no space left.*\n.*previous artifacts were left",
    ),
    _row(
        "free-disk-below-need",
        lambda c: c.mp.setattr("dualexport.outputs.space.free_bytes", lambda p: 1000) or c.export(),
        E.DiskSpaceError,
        r"MiB free, the artifacts need about",
    ),
    _row(
        "xnnpack-fails-partial-success",
        lambda c: (
            _fail_lower(c, XnnpackExporter, RuntimeError("no kernel")) or c.export(target=("onnx", "xnnpack"))
        ),
        E.XnnpackLoweringError,
        r"\[xnnpack\].*no kernel",
        target="xnnpack",
        prev=False,
    ),
    _row(
        "xnnpack-fails-strict-keeps-previous",
        lambda c: (
            _fail_lower(c, XnnpackExporter, RuntimeError("no kernel"))
            or c.export(target=("onnx", "xnnpack"), strict=True)
        ),
        E.XnnpackLoweringError,
        r"no kernel",
    ),
    _row(
        "require-full-delegation",
        lambda c: c.export(model=_Cumsum(), target="xnnpack", strict=True, require_full_delegation=True),
        E.DelegationError,
        r"not delegated to XNNPACK: aten\.cumsum\.default x1.*node 'cumsum'",
    ),
    # loading a folder back (compare DIR): truncated, foreign, escaping, pickled
    _row(
        "compare-truncated-onnx",
        _compare,
        E.ArtifactFormatError,
        r"m\.onnx (is not a readable ONNX model|is \d+ bytes, but the export wrote)",
        setup=lambda c: _truncate(c, "m.onnx"),
    ),
    _row(
        "compare-foreign-pte",
        _compare,
        E.ArtifactFormatError,
        r"m\.pte (is not an ExecuTorch program|is \d+ bytes, but the export wrote)",
        setup=lambda c: (c.out / "m.pte").write_bytes(b"PK\x03\x04" * 64),
    ),
    _row(
        "compare-truncated-pt2",
        _compare,
        E.ArtifactFormatError,
        r"m\.pt2",
        setup=lambda c: _truncate(c, "m.pt2"),
    ),
    _row(
        "compare-garbage-manifest",
        _compare,
        E.ArtifactFormatError,
        r"not a readable dualexport manifest",
        setup=lambda c: (c.out / "m.weights.json").write_text("[1, 2"),
    ),
    _row(
        "compare-foreign-manifest",
        _compare,
        E.ArtifactFormatError,
        r"not a readable dualexport manifest",
        setup=lambda c: (c.out / "m.weights.json").write_text("[]"),
    ),
    _row(
        "compare-manifest-escapes",
        _compare,
        E.UnsafeArtifactError,
        r"'\.\./victim\.onnx'.*not a plain file name",
        setup=lambda c: _edit_manifest(
            c, lambda d: {**d, "artifacts": {"onnx": {"file": "../victim.onnx", "files": []}}}
        ),
    ),
    _row(
        "compare-pickled-pt2", _compare, E.UnsafeArtifactError, r"holds a pickled object", setup=_pickled_pt2
    ),
    _row("compare-name-escapes", lambda c: _compare(c, name="../m"), E.InputError, r"not a plain file name"),
    _row(
        "compare-empty-folder",
        lambda c: c.out.mkdir() or _compare(c),
        E.InputError,
        r"holds 0 exports",
        prev=False,
    ),
    _row(
        "cli-compare-bad-name-exit-2",
        lambda c: _cli(c, "compare", str(c.out), "--name", "a/b"),
        E.InputError,
        r"cli exited 2",
    ),
]


def _locked(ctx: Ctx) -> Any:
    with export_lock(ctx.out, NAME):
        return ctx.export()


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A complete earlier export (both targets) that every row starts from."""
    d = tmp_path_factory.mktemp("previous") / "out"
    m, a = tiny(1)
    dx.export(m, a, out_dir=d, name=NAME)
    return d


@pytest.mark.parametrize("row", ROWS)
def test_bad_input_or_fault(
    row: Row, tmp_path: pathlib.Path, previous: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    if row.prev:
        shutil.copytree(previous, out)
    ctx = Ctx(tmp_path, out, monkeypatch)
    if row.setup is not None:
        row.setup(ctx)
    before_out = visible(out)
    before_rest = snapshot(tmp_path, exclude=out)
    if row.target is None:
        with pytest.raises(row.error, match=row.match) as info:
            row.run(ctx)
        err = info.value
    else:
        res = row.run(ctx)
        err = res.errors[row.target]
        assert isinstance(err, row.error), repr(err)
        assert __import__("re").search(row.match, str(err)), str(err)
    monkeypatch.undo()
    assert isinstance(err, E.DualExportError) and err.hint, "every error says what to try"
    assert snapshot(tmp_path, exclude=out) == before_rest, "something outside out_dir changed"
    assert leftovers(out) == [], "a partial file remains"
    if row.target is None and row.prev:
        assert visible(out) == before_out, "the previous artifacts changed"
    elif row.target is not None:
        assert_complete_set(out, NAME, targets=tuple(t for t in ("onnx", "xnnpack") if t != row.target))


def test_table_is_big_enough() -> None:
    assert len(ROWS) >= 25


def test_internal_errors_say_so() -> None:
    err = E.InternalError("lost a node", target="onnx")
    assert err.internal and not E.InputError("x").internal
    assert "internal error (a bug in dualexport" in str(err) and "What to try: report it" in str(err)
    assert issubclass(E.DelegationError, E.XnnpackLoweringError)
    assert issubclass(E.ArtifactFormatError, E.ArtifactIOError) and issubclass(E.ArtifactIOError, E.UserError)


def test_failed_target_drops_its_stale_artifact(
    tmp_path: pathlib.Path, previous: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partial success replaces the whole set: the previous .pte must not sit beside a new .onnx
    and a manifest that no longer lists it."""
    out = tmp_path / "out"
    shutil.copytree(previous, out)
    _fail_lower(Ctx(tmp_path, out, monkeypatch), XnnpackExporter, RuntimeError("no kernel"))
    m, a = tiny(2)
    res = dx.export(m, a, out_dir=out, name=NAME)
    assert set(res.errors) == {"xnnpack"} and res.artifacts["onnx"].path == out / "m.onnx"
    assert not (out / "m.pte").exists()
    assert_complete_set(out, NAME, targets=("onnx",))


def test_cli_strict_exit_codes(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dualexport.cli import EXIT_OK, EXIT_TARGET_FAILED, main

    mod = tmp_path / "tinymod.py"
    mod.write_text(
        "import torch\nclass T(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 3)\n    def forward(self, x):\n        return self.fc(x)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    base = ["export", "tinymod:T", "--input", "2x4:float32", "--target", "onnx", "--out", str(tmp_path / "o")]
    assert main(base) == EXIT_OK
    _fail_lower(Ctx(tmp_path, tmp_path / "o", monkeypatch), OnnxExporter, RuntimeError("exporter bug"))
    assert main(base) == EXIT_TARGET_FAILED
    assert main(base + ["--strict"]) == EXIT_TARGET_FAILED
    assert main(["export", "tinymod:T", "--input", "2x4:nope"]) == 2


def test_big_weights_go_to_external_data(tmp_path: pathlib.Path) -> None:
    """The 2 GB protobuf limit never applies to weights: they are written as external data, so
    the .onnx stays small however big the model (checked at 3 MB; the mechanism is the same)."""
    m = torch.nn.Sequential(torch.nn.Linear(1000, 750), torch.nn.ReLU())
    res = dx.export(m, (torch.randn(2, 1000),), target="onnx", out_dir=tmp_path / "o", name="big")
    onnx_file, data_file = res.artifacts["onnx"].files
    assert data_file.name == "big.onnx.data" and data_file.stat().st_size >= 3_000_000
    assert onnx_file.stat().st_size < 100_000
    assert res.verify_weights().exact["onnx"] == 2


def test_free_space_estimate_counts_tied_weights_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dualexport.outputs.space import check_free_space, needed_bytes
    from dualexport.shared_state.request import weight_bytes

    emb = torch.nn.Embedding(100, 8)
    head = torch.nn.Linear(8, 100, bias=False)
    head.weight = emb.weight  # tied: stored once
    tied = torch.nn.ModuleDict({"emb": emb, "head": head})
    assert weight_bytes(tied) == 100 * 8 * 4
    need = needed_bytes(weight_bytes(tied), 2)
    assert need > 3 * 3200
    monkeypatch.setattr("dualexport.outputs.space.free_bytes", lambda p: need - 1)
    with pytest.raises(E.DiskSpaceError, match="MiB free") as info:
        check_free_space(tmp_path, need)
    assert info.value.need == need and info.value.free == need - 1
    monkeypatch.setattr("dualexport.outputs.space.free_bytes", lambda p: need)
    check_free_space(tmp_path, need)
