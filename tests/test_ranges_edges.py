"""Declared dynamic ranges proven at their edges, on models whose maxima cross the sizes where
ATen's CPU kernels change strategy (a convolution asks whether the batch is below 16; matmul and
attention switch kernels with the row count).

Stages per case: export both targets (one job each) -> the job's proof (ranges read back from
each file, runs at min, max-1 and max) -> parity against eager at the example and every edge ->
max+1 refused by both runners with an error naming the dim.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from torch import nn
from torch.export import Dim

import dualexport as dx
from dualexport.runtimes import open_runner
from dualexport.shared_state.contract import edge_sizes


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


class MatMul(nn.Module):
    """Rows through a linear layer and a batched matmul with a learned matrix."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(48, 32)
        self.mix = nn.Parameter(torch.randn(32, 32) / 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x))
        return torch.matmul(h.unsqueeze(0), self.mix).squeeze(0) + h


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.out = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, 2, 16).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, s, 32))


def _conv() -> tuple[nn.Module, tuple, tuple]:
    m = ConvNet().eval()
    with torch.no_grad():  # realistic BatchNorm statistics, from data
        m.train()
        for _ in range(3):
            m(torch.randn(8, 3, 16, 16))
        m.eval()
    return m, (torch.randn(2, 3, 16, 16),), ({0: Dim("b", min=1, max=64)},)


CASES = {
    "conv_batch_1_64": _conv,
    "matmul_rows_1_256": lambda: (MatMul().eval(), (torch.randn(4, 48),), ({0: Dim("n", min=1, max=256)},)),
    "attention_seq_2_128": lambda: (
        Attention().eval(),
        (torch.randn(1, 10, 32),),
        ({1: Dim("s", min=2, max=128)},),
    ),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dx.ExportResult]:
    out = {}
    for name, build in CASES.items():
        torch.manual_seed(0)
        model, args, dyn = build()
        out[name] = dx.export(
            model, args, out_dir=tmp_path_factory.mktemp(name), name=name, dynamic_shapes=dyn, cache=False
        )
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_each_file_is_proven_at_every_edge(exported: dict[str, dx.ExportResult], case: str) -> None:
    res = exported[case]
    assert not res.errors, res.errors
    for target, art in res.artifacts.items():
        assert isinstance(art.outcome, dx.Lowered), target
        assert art.outcome.proof.edges == ("min", "max-1", "max"), (target, art.outcome.proof)
        assert res.manifest.artifacts[target]["proof"]["edges"] == ["min", "max-1", "max"]


@pytest.mark.parametrize("case", list(CASES))
def test_parity_at_the_example_and_every_edge(exported: dict[str, dx.ExportResult], case: str) -> None:
    res = exported[case]
    report = dx.compare(res)
    assert {"example", "edge:min", "edge:max-1", "edge:max"} <= set(report.inputs), report.inputs
    assert report.ok, report.to_markdown()
    # not vacuous: the outputs at the maximum are not constant
    top = [o for o in report.outputs if o.label.startswith("edge:max/")]
    assert top and all(o.metrics["xnnpack"].snr_db > 40 for o in top)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("target", ["onnx", "xnnpack"])
def test_above_the_maximum_is_refused(exported: dict[str, dx.ExportResult], case: str, target: str) -> None:
    res = exported[case]
    program = res.program.exported_program
    top = next(e for e in edge_sizes(program) if e.label == "max")
    ((sym, hi),) = top.symbols.items()
    shapes = [list(s) for s in top.inputs]
    dim = next(d for d, size in enumerate(shapes[0]) if size == hi)
    shapes[0][dim] = hi + 1
    runner = open_runner(target, res.artifacts[target].path)
    with pytest.raises(dx.InputError, match=rf"dim {dim} is {hi + 1}, outside the exported range"):
        runner.run([torch.randn(*s) for s in shapes])


def test_the_conv_guard_is_what_was_prevented(tmp_path: pathlib.Path) -> None:
    """Without the size-oblivious setting the convolution's backend question narrows the batch
    to below 16 (the failure this guards against): the job refuses instead of publishing."""
    import contextlib

    import dualexport.exporters.xnnpack as xnn

    model, args, dyn = _conv()
    real = xnn.size_oblivious
    xnn.size_oblivious = contextlib.nullcontext  # type: ignore[assignment]
    try:
        res = dx.export(
            model,
            args,
            out_dir=tmp_path,
            name="m",
            dynamic_shapes=dyn,
            cache=False,
            options=dx.ExportOptions(parallel=False),
        )
    finally:
        xnn.size_oblivious = real
    err = res.errors.get("xnnpack")
    assert isinstance(err, dx.RangeNarrowedError), res.errors
    assert "[1, 64]" in str(err) or "-> [" in str(err)
    assert not (tmp_path / "m.pte").exists() and "xnnpack" not in res.manifest.artifacts
    assert isinstance(res.artifacts["onnx"].outcome, dx.Lowered)


class _SliceThenSqueeze(nn.Module):
    """MobileBERT's trigram embedding in small: ``x[:, 1:]`` has ``seq - 1`` rows, and a
    ``squeeze`` on it takes another path at one row (torch.export's guard ``seq - 1 != 1``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 1:].squeeze(1) * 2


def test_a_range_the_model_cannot_take_is_refused_with_the_range_it_can(tmp_path: pathlib.Path) -> None:
    """The capture error names the guard, the sizes that fail it and the range that satisfies it
    (evaluated over the declared range), nothing is written, and that range exports: the squeeze
    of rows now never 1 is a no-op (SqueezeOnlyUnitDims; ONNX's Squeeze would refuse them), both
    files proven at the example and the range's edges."""
    x = torch.randn(2, 8, 4)
    with pytest.raises(dx.CaptureError) as info:
        dx.export(
            _SliceThenSqueeze(),
            (x,),
            out_dir=tmp_path / "a",
            dynamic_shapes=({1: Dim("seq", min=2, max=16)},),
        )
    text = str(info.value)
    assert "false at seq = 2" in text and "Dim('seq', min=3, max=16)" in text, text
    assert "dynamic_shapes" in info.value.hint
    assert not [f for f in (tmp_path / "a").glob("*") if not f.name.startswith(".")]  # no file written
    seq = Dim("seq", min=3, max=16)
    res = dx.export(
        _SliceThenSqueeze(), (x,), out_dir=tmp_path / "b", dynamic_shapes=({1: seq},), cache=False
    )
    assert res.ok, res.errors
    assert res.artifacts["onnx"].outcome.proof.edges and res.artifacts["xnnpack"].outcome.proof.edges


def test_range_guards_keep_divisibility_to_torch() -> None:
    """A guard that holds on no single range (every even size) is left to torch.export's own
    suggested fix; one that fails only at an end is narrowed, on a long range too."""
    from dualexport.shared_state.range_guards import range_guards

    def message(guard: str, hi: int = 40) -> str:
        return (
            "Constraints violated (seq)!\n  - Not all values of seq = L['x'].size()[1] in the specified "
            f"range seq <= {hi} satisfy the generated guard {guard}."
        )

    assert range_guards(message("Eq(Mod(L['x'].size()[1], 2), 0)"), None) == []
    assert range_guards(message("(L['x'].size()[1] // 4) != 1"), None) == []  # 2..3 and 8..40
    (g,) = range_guards(message("(L['x'].size()[1] // 8) != 0"), None)
    assert (g.declared, g.widest, g.excluded) == ((2, 40), (8, 40), (2, 3, 4, 5, 6, 7))
    # a long range: both ends searched, the bound between them found by bisection
    (g,) = range_guards(message("L['x'].size()[1] <= 1000", hi=1 << 20), None)
    assert (g.declared, g.widest, g.excluded[:2]) == ((2, 1 << 20), (2, 1000), (1001, 1002))
