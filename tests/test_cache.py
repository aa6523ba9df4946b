"""Re-exporting an unchanged model reuses the artifacts; the key comes from the traced program,
so a changed forward or a changed weight misses."""

from __future__ import annotations

import pathlib

import pytest
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
    return {t for t, a in res.artifacts.items() if isinstance(a.outcome, dx.Reused)}


def test_unchanged_model_is_reused_and_still_proven(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(2, 16)
    cold = dx.export(model, (x,), out_dir=tmp_path, name="m")
    assert not cold.errors and _cached(cold) == set()
    pt2 = (tmp_path / "m.pt2").stat().st_ino
    warm = dx.export(model, (x,), out_dir=tmp_path, name="m")
    assert _cached(warm) == {"onnx", "xnnpack"}
    assert (tmp_path / "m.pt2").stat().st_ino == pt2  # the program was linked, not saved again
    from dualexport.cli import EXIT_OK, main

    assert main(["compare", str(tmp_path)]) == EXIT_OK  # compare DIR loads it as the reference
    assert warm.artifacts["xnnpack"].delegation == cold.artifacts["xnnpack"].delegation
    # a hit defers the decompositions (nothing reads them to reuse files); a look computes them
    assert warm.program._decomposed == {}
    assert set(warm.program.decomposed) == {"onnx", "xnnpack"}
    for t, dec in warm.program.decomposed.items():
        assert dec.state_dict is warm.program.state_dict, t
    assert set(warm.program._decomposed) == {"onnx", "xnnpack"}
    assert all(r.linked for r in warm.program.links.values())
    warm.verify_weights()
    assert dx.compare(warm).ok
    assert warm.manifest.to_dict()["entries"] == cold.manifest.to_dict()["entries"]
    off = dx.export(model, (x,), out_dir=tmp_path, name="m", cache=False)
    assert _cached(off) == set()
    assert (tmp_path / "m.pt2").stat().st_ino != pt2  # lowered: the program saved anew


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


# ------------------------------------------------------------------ a stable, honest key
_MODEL_SRC = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 4)
        self.register_buffer("scale", torch.full((4,), 2.0))
{comment}
    def forward(self, x):
        return torch.relu(self.fc(x)) * self.scale
"""


def _load(path: pathlib.Path, comment: str = "") -> torch.nn.Module:
    import importlib.util

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_MODEL_SRC.format(comment=comment))
    spec = importlib.util.spec_from_file_location(f"net_{abs(hash(str(path)))}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Net().eval()


def _keys(model: torch.nn.Module, x: torch.Tensor, **kw: object) -> dict[str, str]:
    from dualexport.pipeline import cache_keys
    from dualexport.shared_state import SharedProgram

    shared = SharedProgram.capture(model, (x,), dynamic_shapes=kw.pop("dynamic_shapes", None))
    transforms = kw.pop("transforms", ())
    if transforms:
        shared.apply_transforms(transforms)  # type: ignore[arg-type]
    options = kw.pop("options", dx.ExportOptions())
    keys = cache_keys(shared, ("onnx", "xnnpack"), options, **kw)  # type: ignore[arg-type]
    return {t: k.cache for t, k in keys.items()}


def test_key_ignores_where_the_source_lives_and_its_comments(tmp_path: pathlib.Path) -> None:
    x = torch.randn(2, 8)
    a = _keys(_load(tmp_path / "a" / "net.py"), x)
    moved = _keys(_load(tmp_path / "elsewhere" / "deeper" / "net.py"), x)
    commented = _keys(_load(tmp_path / "c" / "net.py", comment="    # a comment\n    # and another\n"), x)
    assert a == moved == commented


def test_key_misses_on_everything_that_makes_the_file(tmp_path: pathlib.Path) -> None:
    from torch.export import Dim

    x = torch.randn(2, 8)
    model = _load(tmp_path / "net.py")
    base = _keys(model, x)
    buffer_changed = _load(tmp_path / "b" / "net.py")
    with torch.no_grad():
        buffer_changed.scale[0] = 3.0
    variants = {
        "buffer": _keys(buffer_changed, x),
        "ranges": _keys(model, x, dynamic_shapes=({0: Dim("b", min=1, max=8)},)),
        "ranges-other-max": _keys(model, x, dynamic_shapes=({0: Dim("b", min=1, max=16)},)),
        "options": _keys(model, x, options=dx.ExportOptions(external_data_threshold=4096)),
        "transforms": _keys(model, x, transforms=[lambda gm: None]),
        "quantize": _keys(model, x, quantize="int8"),
        "full-delegation": _keys(model, x, require_full_delegation=True),
    }
    for what, keys in variants.items():
        for t in ("onnx", "xnnpack"):
            assert keys[t] != base[t], f"{what} did not change the {t} key"
    assert len({k["onnx"] for k in variants.values()}) == len(variants)
    # how the files are made (never their bytes) is not in the key
    assert _keys(model, x, options=dx.ExportOptions(parallel=True, prune_backend_passes=False)) == base


def test_moving_the_project_folder_hits_the_cache(tmp_path: pathlib.Path) -> None:
    x = torch.randn(2, 8)
    out = tmp_path / "out"
    dx.export(_load(tmp_path / "checkout1" / "net.py"), (x,), out_dir=out, name="m")
    res = dx.export(_load(tmp_path / "moved" / "checkout" / "net.py"), (x,), out_dir=out, name="m")
    assert _cached(res) == {"onnx", "xnnpack"}


_KEY_CHILD = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import dualexport, net
from dualexport.pipeline import cache_keys
from dualexport.shared_state import SharedProgram
assert dualexport.__file__.startswith(sys.argv[1]), dualexport.__file__
shared = SharedProgram.capture(net.Net().eval(), (torch.ones(2, 8),))
print(cache_keys(shared, ("onnx", "xnnpack"), dualexport.ExportOptions())["xnnpack"].cache)
"""


@pytest.mark.slow
def test_two_clones_at_different_paths_agree_and_an_edited_copy_does_not(tmp_path: pathlib.Path) -> None:
    """Copies of the package source at two paths give the same key; editing the package's code
    (a changed lowering would) changes it."""
    import os
    import shutil
    import subprocess
    import sys

    src = pathlib.Path(dx.__file__).parent

    def clone(where: pathlib.Path) -> pathlib.Path:
        shutil.copytree(src, where / "dualexport", ignore=shutil.ignore_patterns("__pycache__"))
        (where / "net.py").write_text(_MODEL_SRC.format(comment=""))
        return where

    def key(root: pathlib.Path) -> str:
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        out = subprocess.run(
            [sys.executable, "-c", _KEY_CHILD, str(root)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip().splitlines()[-1]

    a, b = clone(tmp_path / "one" / "src"), clone(tmp_path / "two" / "nested" / "src")
    edited = clone(tmp_path / "three" / "src")
    xnn = edited / "dualexport" / "exporters" / "xnnpack.py"
    xnn.write_text(xnn.read_text() + "\n_CHANGED_LOWERING = True\n")
    ka, kb, ke = key(a), key(b), key(edited)
    assert len(ka) == 64 and ka == kb
    assert ke != ka


@pytest.mark.slow  # two exports of a Llama
def test_same_program_gives_the_same_bytes_whatever_the_process_compiled_before(
    tmp_path: pathlib.Path,
) -> None:
    """A long-lived process (a reused Ray worker) must write what a fresh one writes: FX names
    its generated code ``<eval_with_key>.N`` with a process-wide count, and the ONNX node
    metadata quotes it; the count is dropped."""
    from dualexport.loading import hf_model

    cfg = dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=32,
    )
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    first = dx.export(
        hf_model("LlamaConfig", cfg, task="causal-lm"),
        (ids,),
        target="onnx",
        out_dir=tmp_path / "a",
        cache=False,
    )
    for _ in range(3):  # the process compiles other graph modules in between
        torch.fx.symbolic_trace(MLP())
    again = dx.export(
        hf_model("LlamaConfig", cfg, task="causal-lm"),
        (ids,),
        target="onnx",
        out_dir=tmp_path / "b",
        cache=False,
    )
    a, b = (r.artifacts["onnx"].path.read_bytes() for r in (first, again))
    assert b"<eval_with_key>" in a  # the traces are there, without the count
    assert a == b
