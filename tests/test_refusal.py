"""A refused target publishes nothing: whatever refuses it (the pin around its job, a narrowed
range, ``require_full_delegation``, its smoke run from disk), no file of that target is in the
output folder afterwards, the manifest does not list it, and the previous generation's file of
that target is gone too (issue 5: a folder never mixes two exports). The other target is
published and proven."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.export import Dim

import dualexport as dx
from dualexport.exporters.xnnpack import XnnpackExporter
from dualexport.outputs.atomic import STAGING_PREFIX
from helpers_reliability import tiny


class Cumsum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(self.fc(x), 1)


def _narrow_inside_lowering(mp: pytest.MonkeyPatch) -> None:
    """A lowering that adds a size guard the size-oblivious setting does not stop."""
    from torch.fx.experimental.symbolic_shapes import guard_bool

    orig = XnnpackExporter.lower

    def lower(self: Any, decomposed: Any, staging: Any, name: str, options: Any) -> Any:
        x = next(n for n in decomposed.graph.nodes if n.op == "placeholder" and n.name == "x")
        guard_bool(x.meta["val"].shape[0] < 3)  # narrows the batch to [2, 2]
        return orig(self, decomposed, staging, name, options)

    mp.setattr(XnnpackExporter, "lower", lower)


def _change_a_weight_inside_lowering(mp: pytest.MonkeyPatch) -> None:
    orig = XnnpackExporter.lower

    def lower(self: Any, decomposed: Any, staging: Any, name: str, options: Any) -> Any:
        out = orig(self, decomposed, staging, name, options)
        with torch.no_grad():
            decomposed.state_dict["fc.weight"].data[0, 0] += 1.0  # the holder's own tensor
        return out

    mp.setattr(XnnpackExporter, "lower", lower)


def _unloadable_pte(mp: pytest.MonkeyPatch) -> None:
    orig = XnnpackExporter.lower

    def lower(self: Any, decomposed: Any, staging: Any, name: str, options: Any) -> Any:
        out = orig(self, decomposed, staging, name, options)
        p = out.files[0]
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 3])  # truncated: the runtime refuses it
        return out

    mp.setattr(XnnpackExporter, "lower", lower)


REFUSALS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None] | None, dict[str, Any], type]] = {
    "lowering-narrows-a-range": (
        _narrow_inside_lowering,
        {"dynamic_shapes": ({0: Dim("b", min=1, max=8)},)},
        dx.RangeNarrowedError,
    ),
    "lowering-changes-a-weight": (_change_a_weight_inside_lowering, {}, dx.ProgramMutatedError),
    "smoke-run-cannot-load": (_unloadable_pte, {}, dx.RuntimeLoadError),
    "require-full-delegation": (
        None,
        {"require_full_delegation": True, "model": Cumsum()},
        dx.DelegationError,
    ),
}


def _staging_left(out: pathlib.Path) -> list[str]:
    return [p.name for p in out.iterdir() if p.name.startswith(STAGING_PREFIX)]


# A forked worker that changes a weight changes its own copy of the holder: the parent's program
# and the file are intact, so there is nothing to refuse; that case runs in-process only.
_PARAMS = [
    pytest.param(
        case,
        forked,
        id=f"{case}-{'forked' if forked else 'in-process'}",
        # the forked path's own refusal is the range one; the others repeat in-process checks
        marks=[pytest.mark.slow] if forked and case != "lowering-narrows-a-range" else [],
    )
    for case in REFUSALS
    for forked in (False, True)
    if not (forked and case == "lowering-changes-a-weight")
]


@pytest.mark.parametrize(("case", "forked"), _PARAMS)
def test_refused_target_publishes_nothing(
    case: str, forked: bool, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inject, kwargs, error = REFUSALS[case]
    kwargs = dict(kwargs)
    model, args = tiny(3)
    model = kwargs.pop("model", model)
    out = tmp_path / "out"
    first = dx.export(
        model, args, out_dir=out, name="m", cache=False, **kwargs if "require" not in case else {}
    )
    assert (out / "m.pte").exists() and not first.errors  # the previous generation
    if inject is not None:
        inject(monkeypatch)
    res = dx.export(
        model, args, out_dir=out, name="m", cache=False, options=dx.ExportOptions(parallel=forked), **kwargs
    )
    err = res.errors.get("xnnpack")
    assert isinstance(err, error), res.errors
    assert "xnnpack" not in res.artifacts
    assert not (out / "m.pte").exists(), "a refused target's file (new or previous) was published"
    assert "xnnpack" not in res.manifest.artifacts
    assert not (out / "m.delegation.json").exists()
    assert _staging_left(out) == []
    # the other target is published and proven from disk
    assert isinstance(res.artifacts["onnx"].outcome, dx.Lowered)
    if case != "lowering-changes-a-weight":  # there the holder itself changed: nothing can match it
        res.verify_weights()
        assert dx.compare(res).ok


def test_strict_refusal_commits_nothing(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, args = tiny(4)
    out = tmp_path / "out"
    dx.export(model, args, out_dir=out, name="m", cache=False)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    _narrow_inside_lowering(monkeypatch)
    with pytest.raises(dx.RangeNarrowedError):
        dx.export(
            tiny(5)[0],
            args,
            out_dir=out,
            name="m",
            cache=False,
            strict=True,
            dynamic_shapes=({0: Dim("b", min=1, max=8)},),
            options=dx.ExportOptions(parallel=False),
        )
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after == before


def test_a_transform_that_narrows_a_range_is_refused(tmp_path: pathlib.Path) -> None:
    """A user transform that adds a guard (``batch < 3``) under a declared batch of 1..8 changes
    the shared program's contract: the export is refused before any lowering, naming the
    transform and the range, and nothing is written."""
    from torch.fx.experimental.symbolic_shapes import guard_bool

    def narrow(gm: torch.fx.GraphModule) -> None:
        x = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.name == "x")
        guard_bool(x.meta["val"].shape[0] < 3)

    model, args = tiny(6)
    out = tmp_path / "out"
    with pytest.raises(dx.TransformError, match=r"transform .*narrow.* narrowed the declared dynamic range"):
        dx.export(
            model,
            args,
            out_dir=out,
            name="m",
            cache=False,
            transforms=[narrow],
            dynamic_shapes=({0: Dim("b", min=1, max=8)},),
        )
    assert not [p for p in out.iterdir() if p.name.startswith("m.")]


def test_a_program_eager_pytorch_cannot_run_is_the_inputs_problem(tmp_path: pathlib.Path) -> None:
    """torch.export traced an int64 tensor into a float Linear (3-D input, one dim AUTO: the fake
    kernels did not check the dtype); eager PyTorch cannot run it. Found by the fuzz test: a raw
    RuntimeError escaped the job. It is an InputError naming the failure, and nothing is written."""
    from dualexport.errors import InputError

    model = nn.Sequential(nn.Linear(4, 3)).eval()
    x = torch.randint(0, 5, (2, 2, 4))
    spec = ({0: Dim("d0", min=1, max=64), 1: Dim("d1", min=1, max=64), 2: Dim.AUTO},)
    out = tmp_path / "out"
    with pytest.raises(InputError, match="does not run on the example inputs in eager PyTorch.*same dtype"):
        dx.export(model, (x,), out_dir=out, name="f", dynamic_shapes=spec)
    assert not [p for p in out.iterdir() if not p.name.startswith(".")]
