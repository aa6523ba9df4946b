"""External weights for both targets, and runtimes that cannot take the exporter down.

Stages: export with the XNNPACK weights in ``<name>.ptd`` (ExecuTorch's program-data separation)
-> the files (a small .pte, the weights in the .ptd) -> every weight found bit for bit in the .ptd
from disk -> parity -> cache hit and weights-only patch on the .ptd set, byte-identical to a fresh
export -> ``compare DIR``; then the failure paths: a missing .ptd is a clear error, and a file
that crashes the runtime is the target's error while this process lives on.
"""

from __future__ import annotations

import hashlib
import os
import pathlib

import pytest
import torch
from torch import nn

import dualexport as dx
from dualexport.runtimes import open_runner

EXTERNAL = dx.ExportOptions(xnnpack_external_data=True)


def _mlp(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)).eval(), (torch.randn(2, 64),)


def _sha(res: dx.ExportResult) -> dict[str, str]:
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest() for a in res.artifacts.values() for f in a.files
    }


def test_xnnpack_weights_in_a_ptd_are_proven_from_disk(tmp_path: pathlib.Path) -> None:
    model, args = _mlp()
    res = dx.export(model, args, out_dir=tmp_path, name="m", cache=False, options=EXTERNAL)
    assert not res.errors
    pte, ptd = res.artifacts["xnnpack"].files
    assert (pte.name, ptd.name) == ("m.pte", "m.ptd")
    weight_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert ptd.stat().st_size >= weight_bytes and pte.stat().st_size < weight_bytes / 4
    check = res.verify_weights()
    assert check.exact["xnnpack"] == 4
    for e in res.manifest.entries:  # each one's key is the sha256 of the bytes in the .ptd
        assert e.locations["xnnpack"].where == f"named_data:{e.sha256}"
    assert hashlib.sha256(model[0].weight.detach().numpy().tobytes()).hexdigest().encode() in ptd.read_bytes()
    assert dx.compare(res).ok
    assert open_runner("xnnpack", pte).external is True


def test_cache_and_weights_only_patch_write_the_fresh_bytes(tmp_path: pathlib.Path) -> None:
    model, args = _mlp()
    out = tmp_path / "set"
    dx.export(model, args, out_dir=out, name="m", options=EXTERNAL)
    again = dx.export(model, args, out_dir=out, name="m", options=EXTERNAL)
    assert {type(a.outcome) for a in again.artifacts.values()} == {dx.Reused}
    with torch.no_grad():
        model[2].weight.mul_(1.5)
    patched = dx.export(model, args, out_dir=out, name="m", options=EXTERNAL)
    assert isinstance(patched.artifacts["xnnpack"].outcome, dx.Patched)
    fresh = dx.export(model, args, out_dir=tmp_path / "fresh", name="m", cache=False, options=EXTERNAL)
    assert _sha(patched) == _sha(fresh)  # the .ptd and the .pte (its keys) byte for byte
    patched.verify_weights()
    assert dx.compare(patched).ok
    from dualexport.parity.folder import compare_dir

    report, _, werr, _ = compare_dir(out)
    assert werr is None and report.ok


def test_the_default_goes_external_above_the_threshold(tmp_path: pathlib.Path) -> None:
    model, args = _mlp()
    small = dx.export(model, args, out_dir=tmp_path / "a", name="m", cache=False)
    assert [f.suffix for f in small.artifacts["xnnpack"].files] == [".pte"]
    big = dx.export(
        model,
        args,
        out_dir=tmp_path / "b",
        name="m",
        cache=False,
        options=dx.ExportOptions(external_weights_above=1024),
    )
    assert [f.suffix for f in big.artifacts["xnnpack"].files] == [".pte", ".ptd"]
    inline = dx.export(
        model,
        args,
        out_dir=tmp_path / "c",
        name="m",
        cache=False,
        options=dx.ExportOptions(onnx_external_data=False),
    )
    assert [f.name for f in inline.artifacts["onnx"].files] == ["m.onnx"]
    inline.verify_weights()


def test_a_missing_ptd_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    model, args = _mlp()
    res = dx.export(model, args, out_dir=tmp_path, name="m", cache=False, options=EXTERNAL)
    (tmp_path / "m.ptd").unlink()
    with pytest.raises(dx.RuntimeLoadError, match=r"keeps its weights in m\.ptd, which is missing"):
        open_runner("xnnpack", res.artifacts["xnnpack"].path, isolated=False)


def _crashing_pte(model: nn.Module, args: tuple, path: pathlib.Path) -> None:
    """What the plain library writes for a tagged program when its .ptd is not shipped: ExecuTorch
    1.4.1 dereferences the missing data map (SIGSEGV) when it loads the method."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(model, args)
    for n in ep.graph.nodes:
        if n.op == "placeholder" and n.name.startswith("p_"):
            n.meta.setdefault("custom", {})["delegate_constant_tag"] = "elsewhere"
    path.write_bytes(
        to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    )


def test_a_runtime_crash_is_an_error_not_a_dead_process(tmp_path: pathlib.Path) -> None:
    model, args = _mlp()
    _crashing_pte(model, args, tmp_path / "crash.pte")
    with pytest.raises(dx.RuntimeLoadError, match=r"crashed \(signal SIGSEGV\) loading crash\.pte"):
        open_runner("xnnpack", tmp_path / "crash.pte")
    assert os.getpid()  # still here


def test_a_crashing_smoke_run_refuses_the_target_and_the_export_goes_on(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dualexport.exporters.xnnpack import XnnpackExporter

    orig = XnnpackExporter.lower

    def lower(self, decomposed, staging, name, options):  # type: ignore[no-untyped-def]
        out = orig(self, decomposed, staging, name, options)
        _crashing_pte(*_mlp(), out.files[0])
        return out

    monkeypatch.setattr(XnnpackExporter, "lower", lower)
    model, args = _mlp()
    res = dx.export(
        model, args, out_dir=tmp_path, name="m", cache=False, options=dx.ExportOptions(parallel=False)
    )
    err = res.errors["xnnpack"]
    assert isinstance(err, dx.RuntimeLoadError) and "crashed" in str(err)
    assert not (tmp_path / "m.pte").exists()
    assert isinstance(res.artifacts["onnx"].outcome, dx.Lowered)
    assert dx.compare(res).ok
