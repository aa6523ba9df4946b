"""Pruned XNNPACK backend passes: a skipped pass is one that could not have changed anything.

Stages per model: dx.export to XNNPACK (pruning on, the default) -> the same decomposed program
lowered again with ExecuTorch's full pass list -> the two .pte files are byte-identical, and the
pruned run skipped something. Across the models every prunable pass both runs somewhere and is
skipped somewhere, so each predicate is exercised on both sides.
"""

from __future__ import annotations

import collections
import hashlib
import pathlib

import pytest
import torch
from torch import nn

import dualexport as dx
from dualexport.exporters.backend_passes import PASS_NEEDS
from dualexport.exporters.base import ExportOptions
from dualexport.exporters.xnnpack import XnnpackExporter
from zoo.models import ZOO


class Triggers(nn.Module):
    """One op for each single-op pass: pad, conv1d, cat, mm, PReLU (on 4-D input: after a
    conv1d, ExecuTorch's ChannelsLastTaggedReshapePass fails on the plain path too)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3)
        self.prelu = nn.PReLU(4)
        self.bn = nn.BatchNorm2d(4)  # not after a conv: DecomposeBatchNorm, not FuseBatchNorm
        self.w = nn.Parameter(torch.randn(12, 12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(nn.functional.pad(x, (1, 1)))
        y = torch.cat([y, y * 2.0, y + 1.0], dim=1)[0, :, :12]
        p = self.prelu(self.bn(x.reshape(1, 4, 4, 4))).reshape(16, 4)[:12, :1]
        return y @ self.w + p


def _case(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], dict]:
    case = next(c for c in ZOO if c.name == name)
    torch.manual_seed(0)
    model = case.factory().eval()
    args, kwargs = case.inputs()
    extra = (
        {"quantize": "int8", "calibration": [case.inputs()[0] for _ in range(4)]}
        if case.int8_calibration
        else {}
    )
    return model, args, {"kwargs": kwargs or None, **extra}


def _sha(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


#: Passes whose trigger never reaches XNNPACK preprocess with ExecuTorch 1.4.1, so no model can
#: show them running: the partitioner keeps aten.prelu and aten.max_pool2d whole (the passes act
#: on _prelu_kernel and max_pool2d_with_indices), and ConvertToSDPAPass's patterns carry the
#: mask prologue MultiheadAttention's fast path never emits; ConstPropPass folds only nodes with no
#: traced argument, and a delegated subgraph gets its weights as lifted placeholders (traced) and
#: holds no input-free op. Each still has to be skipped somewhere.
UNREACHABLE = {
    "PReLUReshapePass": "aten._prelu_kernel.default",
    "ConstPropPass": "aten.full.default",
    "RemoveGetItemPass": "aten.max_pool2d_with_indices.default",
    "ConvertToSDPAPass": "aten._softmax.default",
}


MODELS = ["cnn_batchnorm", "pool_upsample", "sdpa_attention", "masked_attention", "int8_cnn", "triggers"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    out = {}
    for name in MODELS:
        if name == "triggers":
            torch.manual_seed(0)
            model, args, kw = Triggers().eval(), (torch.randn(1, 4, 16),), {}
        else:
            model, args, kw = _case(name)
        tmp = tmp_path_factory.mktemp(name)
        res = dx.export(model, args, target="xnnpack", out_dir=tmp / "pruned", name="m", cache=False, **kw)
        assert res.ok, res.errors
        pruned = res.artifacts["xnnpack"]
        full_dir = tmp / "full"
        full_dir.mkdir()
        full = XnnpackExporter().lower(
            res.program.decomposed["xnnpack"], full_dir, "m", ExportOptions(prune_backend_passes=False)
        )
        out[name] = (pruned.path, full.files[0], res.program.decomposed["xnnpack"])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_pruned_lowering_is_byte_identical(runs: dict, name: str) -> None:
    pruned, full, _ = runs[name]
    assert _sha(pruned) == _sha(full), f"{name}: pruning changed the .pte"


@pytest.mark.slow
def test_every_prunable_pass_runs_and_is_skipped_somewhere(runs: dict, tmp_path: pathlib.Path) -> None:
    ran: collections.Counter[str] = collections.Counter()
    skipped: collections.Counter[str] = collections.Counter()
    for name, (_, _, decomposed) in runs.items():
        off = XnnpackExporter().lower(decomposed, tmp_path, name, ExportOptions(prune_backend_passes=False))
        assert off.backend_passes.ran == (), "with pruning off ExecuTorch's manager runs"
        lowered = XnnpackExporter().lower(decomposed, tmp_path, name, ExportOptions())
        record = lowered.backend_passes
        assert record.skipped, f"{name}: nothing was skipped"
        ran.update(record.ran)
        skipped.update(record.skipped)
    never_ran = set(PASS_NEEDS) - set(ran) - set(UNREACHABLE)
    assert not never_ran, f"predicates never true on these models: {sorted(never_ran)}"
    assert set(PASS_NEEDS) <= set(skipped)


def test_pattern_needs_are_in_every_executorch_pattern() -> None:
    """A pattern pass is skipped when an op it 'needs' is missing: each such op must occur in
    every one of ExecuTorch's patterns for that pass, or a real match could be skipped."""
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa

    for pass_name, graphs in (
        ("ConvertToUpsampleBilinear2d", bilinear_2d.get_graphs()),
        ("ConvertToSDPAPass", sdpa.get_graphs()),
    ):
        assert graphs
        for g in graphs:
            assert PASS_NEEDS[pass_name](g.graph), f"{pass_name}: a pattern lacks a needed op"


def test_table_names_executorch_passes() -> None:
    """A stale entry (renamed pass) would silently stop pruning; an unknown pass always runs."""
    from executorch.backends.xnnpack._passes import XNNPACKPassManager

    defaults = {p.__name__ for p in XNNPACKPassManager(None).passes}  # type: ignore[arg-type]
    assert set(PASS_NEEDS) <= defaults
    assert defaults - set(PASS_NEEDS), "some passes must always run (ConstProp, FuseActivation...)"


def test_unreachable_predicates_fire_on_their_op() -> None:
    for pass_name, op in UNREACHABLE.items():
        needs = PASS_NEEDS[pass_name]
        x = torch.fx.Graph()
        assert not needs(x), pass_name
        inp = x.placeholder("x")
        x.call_function(_named(op), ())
        x.call_function(_named("aten.bmm.default"), (inp,))
        assert needs(x), pass_name


def _named(name: str) -> object:
    """A callable whose __name__ is an edge op's name, for a graph the predicates can read."""

    def fn(*args: object) -> None:
        return None

    fn.__name__ = name
    return fn
