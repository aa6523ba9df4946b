"""Fuzz shapes, dtypes and dynamic-dim specs of a small model. Every outcome is a success whose
artifacts pass parity, or a DualExportError (raised, or recorded per target): never another
exception type leaking out of dx.export or dx.compare. A partial result is consistent: each
requested target is either published (its files on disk, in the manifest, proven at the edges of
its ranges) or refused (its error names it, and no file of it is on disk)."""

from __future__ import annotations

import itertools
import pathlib

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch.export import Dim

import dualexport as dx
from dualexport.errors import DualExportError, InternalError

FEATURES = 4
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64]
_counter = itertools.count()


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) * 2


def _dim_spec(kind: str, size: int, i: int) -> object:
    return {
        "static": None,
        "dim": Dim(f"d{i}", min=1, max=64),
        "dim-tight": Dim(f"t{i}", min=size + 1, max=size + 5),  # excludes the example: refused
        "auto": Dim.AUTO,
        "int": size,
        "wrong-int": size + 1,  # contradicts the example: refused
    }[kind]


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[int], torch.dtype, object]:
    rank = draw(st.integers(1, 3))
    lead = draw(st.lists(st.integers(1, 5), min_size=rank - 1, max_size=rank - 1))
    shape = [*lead, draw(st.sampled_from([FEATURES, FEATURES, 3]))]  # 3: a shape mismatch
    dtype = draw(st.sampled_from(DTYPES))
    form = draw(st.sampled_from(["tuple", "dict", "none", "tuple", "dict", "bad-index", "too-many"]))
    kinds = [
        draw(st.sampled_from(["dim", "auto", "static", "dim", "int", "dim-tight", "wrong-int"]))
        for _ in shape
    ]
    per_dim = {i: _dim_spec(k, shape[i], i) for i, k in enumerate(kinds) if k != "static"}
    spec: object = {
        "none": None,
        "tuple": (per_dim,),
        "dict": {"x": per_dim},
        "bad-index": ({len(shape) + 1: Dim("b")},),
        "too-many": (per_dim, None),
    }[form]
    return shape, dtype, spec


def _explore(tmp_path: pathlib.Path, examples: int) -> list[str]:
    outcomes: list[str] = []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(case=cases())
    # valid requests the generator reaches rarely: reduced precision with dynamic dims
    @example(case=([3, 4], torch.float16, ({0: Dim("batch", min=1, max=64)},)))
    @example(case=([2, 3, 4], torch.bfloat16, {"x": {1: Dim.AUTO}}))
    @example(case=([2, 4], torch.float64, ({0: Dim("batch")},)))
    def one(case: tuple[list[int], torch.dtype, object]) -> None:
        outcomes.append(_run(case, tmp_path / f"o{next(_counter)}"))

    one()
    return outcomes


def test_fuzz_export_outcomes(tmp_path: pathlib.Path) -> None:
    outcomes = _explore(tmp_path, 6)
    # not degenerate: the run met both exports that must succeed and requests that must fail
    assert "success" in outcomes and "error" in outcomes, outcomes


@pytest.mark.slow
def test_fuzz_export_outcomes_many(tmp_path: pathlib.Path) -> None:
    outcomes = _explore(tmp_path, 100)
    assert len(outcomes) >= 100
    assert "success" in outcomes and "error" in outcomes, outcomes


def _check_consistent(res: dx.ExportResult, out: pathlib.Path) -> None:
    """Published and refused targets partition the request; each is what it says on disk."""
    assert set(res.artifacts).isdisjoint(res.errors), (res.artifacts, res.errors)
    assert set(res.artifacts) | set(res.errors) == {"onnx", "xnnpack"}
    assert set(res.manifest.artifacts) == set(res.artifacts)
    suffix = {"onnx": ".onnx", "xnnpack": ".pte"}
    for target, art in res.artifacts.items():
        assert art.path.is_file() and art.path == out / f"f{suffix[target]}"
        assert all(f.is_file() for f in art.files)
        assert art.outcome is not None and art.outcome.proof.ranges
    for target, err in res.errors.items():
        assert isinstance(err, DualExportError), (target, type(err))
        # a refusal must be the input's or a library limit's, never dualexport's own bug
        assert not isinstance(err, InternalError), (target, str(err))
        assert err.target == target, (target, err)
        assert not (out / f"f{suffix[target]}").exists(), f"refused {target} left its file"


def _run(case: tuple[list[int], torch.dtype, object], out: pathlib.Path) -> str:
    shape, dtype, spec = case
    torch.manual_seed(0)
    model = Small()
    if dtype.is_floating_point:
        model = model.to(dtype)
    x = torch.randn(shape).to(dtype) if dtype.is_floating_point else torch.randint(0, 5, shape)
    try:
        res = dx.export(model, (x,), out_dir=out, name="f", dynamic_shapes=spec)
    except InternalError:
        raise  # a defect of dualexport, not an acceptable refusal
    except DualExportError:
        return "error"
    _check_consistent(res, res.out_dir)
    if not res.artifacts:
        return "error"
    report = dx.compare(res)
    assert report.ok, report.to_markdown()
    res.verify_weights()
    return "success" if not res.errors else "partial"
