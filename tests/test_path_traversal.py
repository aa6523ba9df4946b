"""Issue 5: loading artifacts back never reads outside their folder and never runs pickled code.

An ONNX file whose external data points at ``../x`` (or an absolute path, or a symlink out of the
folder) is refused before ONNX Runtime sees it; a .pt2 whose sample inputs carry a pickle payload
does not run it.
"""

from __future__ import annotations

import io
import os
import pathlib
import shutil
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dualexport as dx
from dualexport.cli import EXIT_USAGE, main
from dualexport.errors import ArtifactFormatError, UnsafeArtifactError
from dualexport.parity.folder import compare_dir, load_program
from dualexport.weights.readers import read_onnx
from helpers_reliability import snapshot, tiny

SECRET = np.arange(4, dtype=np.float32).tobytes()


def _onnx_with_external(folder: pathlib.Path, location: str) -> pathlib.Path:
    """Identity(W) where W's 16 bytes live in external data at ``location``."""
    w = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4])
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(len(SECRET)))):
        entry = w.external_data.add()
        entry.key, entry.value = k, v
    graph = helper.make_graph(
        [helper.make_node("Identity", ["W"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[w],
    )
    path = folder / "model.onnx"
    path.write_bytes(helper.make_model(graph).SerializeToString())
    return path


@pytest.fixture
def folder(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "x").write_bytes(SECRET)  # what a traversal would read
    d = tmp_path / "art"
    d.mkdir()
    return d


@pytest.mark.parametrize("location", ["../x", "sub/../../x", "/etc/passwd", "..\\x", "sub/x"])
def test_external_data_outside_the_folder_is_refused(folder: pathlib.Path, location: str) -> None:
    path = _onnx_with_external(folder, location)
    with pytest.raises(UnsafeArtifactError, match="not a plain file name in the artifact's folder"):
        read_onnx(path)


def test_symlink_out_of_the_folder_is_refused(folder: pathlib.Path) -> None:
    os.symlink(folder.parent / "x", folder / "w.bin")
    path = _onnx_with_external(folder, "w.bin")
    with pytest.raises(UnsafeArtifactError, match="symlink that leaves the artifact's folder"):
        read_onnx(path)


def test_plain_name_inside_the_folder_is_read(folder: pathlib.Path) -> None:
    """The control: the same file with its data inside the folder is accepted and hashed."""
    (folder / "w.bin").write_bytes(SECRET)
    tensors = read_onnx(_onnx_with_external(folder, "w.bin"))
    assert tensors.nbytes["W"] == len(SECRET) and tensors.where["W"] == "w.bin@0"


def test_truncated_external_data_is_reported(folder: pathlib.Path) -> None:
    (folder / "w.bin").write_bytes(SECRET[:5])
    with pytest.raises(ArtifactFormatError, match="truncated"):
        read_onnx(_onnx_with_external(folder, "w.bin"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("trav") / "out"
    m, a = tiny(5, features=300)  # 3.6 kB of weights: above the threshold, so external data
    dx.export(m, a, out_dir=d, name="t", target="onnx")
    assert (d / "t.onnx.data").exists()
    return d


def _point_external_data_at(path: pathlib.Path, location: str) -> None:
    model = onnx.load(str(path), load_external_data=False)
    for init in model.graph.initializer:
        for e in init.external_data:
            if e.key == "location":
                e.value = location
    path.write_bytes(model.SerializeToString())


def test_compare_dir_refuses_traversal_before_any_runtime(
    exported: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    shutil.copytree(exported, out)
    (out / ".t.set.json").unlink(missing_ok=True)  # a crafted folder carries no set record
    shutil.copy(out / "t.onnx.data", tmp_path / "x")
    _point_external_data_at(out / "t.onnx", "../x")
    before = snapshot(tmp_path)

    def no_runtime(*a: object, **k: object) -> None:
        raise AssertionError("a runtime opened an artifact that should have been refused")

    monkeypatch.setattr("dualexport.parity.compare.open_runner", no_runtime)
    with pytest.raises(UnsafeArtifactError, match=r"'\.\./x'"):
        compare_dir(out)
    assert main(["compare", str(out)]) == EXIT_USAGE
    assert snapshot(tmp_path) == before, "compare wrote or changed a file"


class _Payload:
    """Unpickling this creates a file: proof that pickled code ran."""

    def __init__(self, target: pathlib.Path) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (str(self.target), "w"))


def _with_member(src: pathlib.Path, dst: pathlib.Path, member_suffix: str, data: bytes) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            body = data if item.filename.endswith(member_suffix) else zin.read(item.filename)
            zout.writestr(item, body)


def test_reference_program_is_loaded_without_pickle(exported: pathlib.Path, tmp_path: pathlib.Path) -> None:
    import torch

    ran = tmp_path / "pwned"
    buf = io.BytesIO()
    torch.save(_Payload(ran), buf)
    evil = tmp_path / "evil.pt2"
    _with_member(exported / "t.pt2", evil, "sample_inputs/model.pt", buf.getvalue())

    # the control: torch's own loader falls back to full pickle and runs the payload
    try:
        torch.export.load(str(evil))
    except Exception:
        pass
    assert ran.exists(), "the payload is not live; the test would prove nothing"
    ran.unlink()

    with pytest.raises(ArtifactFormatError, match="cannot load the reference program evil.pt2"):
        load_program(evil)
    assert not ran.exists(), "load_program ran pickled code"
    assert os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD") is None
    assert load_program(exported / "t.pt2") is not None  # and a clean program still loads
