"""DESIGN.md invariants 1, 2, 4 and 6 (docs/design.md), each as a test that can fail."""

from __future__ import annotations

import pathlib

import pytest
import torch

import dualexport as dx
from dualexport.shared_state import SharedProgram
from dualexport.shared_state.fingerprint import find_shape_env
from models import MLP, ConvBN, TiedEmbedding


def test_torch_export_runs_once_for_both_targets(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = torch.export.export

    def counting(*a, **k):
        calls.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(torch.export, "export", counting)
    model = MLP()
    res = dx.export(model, (torch.randn(2, 16),), out_dir=tmp_path, name="m")
    assert not res.errors and set(res.artifacts) == {"onnx", "xnnpack"}
    # ExecuTorch traces its own small pattern graphs (SDPA, upsample) while partitioning; the
    # user's model is traced exactly once.
    assert sum(1 for m in calls if m is model) == 1


@pytest.fixture(scope="module")
def convbn(tmp_path_factory: pytest.TempPathFactory) -> dx.ExportResult:
    return dx.export(ConvBN(), (torch.randn(1, 3, 8, 8),), out_dir=tmp_path_factory.mktemp("cb"), name="cb")


def test_the_result_says_where_the_time_and_memory_went(convbn: dx.ExportResult) -> None:
    """Issue 51: ``res.timings`` names each stage (capture, each target's decomposition,
    lowering and value proof, the weight manifest, the re-export cache) with its wall seconds and
    the process tree's peak PSS while it ran; the stages lie inside the export and each target's
    stages in the order they run."""
    names = [t.name for t in convbn.timings]
    for target in ("onnx", "xnnpack"):
        lower = next(n for n in names if n.startswith(f"{target}: lower"))
        assert (
            names.index(f"{target}: decompose") < names.index(lower) < names.index(f"{target}: value proof")
        )
    for name in ("capture", "reference outputs", "weight manifest", "re-export cache"):
        assert name in names, names
    total = convbn.seconds["total"]
    assert all(0 <= t.seconds and t.started + t.seconds <= total + 1.0 for t in convbn.timings)
    weights = sum(v.numel() * v.element_size() for v in convbn.program.state_dict.values()) / 2**20
    assert all(t.peak_mb > weights for t in convbn.timings)  # at least the weights: a real reading


def test_one_state_dict_and_no_copied_weights(convbn: dx.ExportResult) -> None:
    prog = convbn.program
    assert prog.state_dict is prog.exported_program.state_dict
    for target, dec in prog.decomposed.items():
        assert dec.state_dict is prog.state_dict, target
        assert dec.constants is prog.constants, target
        assert prog.links[target].linked and not prog.links[target].changes
    for target, art in convbn.artifacts.items():
        # every tensor the lowered program still keeps is the holder's own object
        assert isinstance(art.outcome, dx.Lowered) and art.outcome.kept_not_shared == (), target
    assert convbn.artifacts["onnx"].outcome.kept_tensors > 0
    assert convbn.artifacts["xnnpack"].outcome.kept_tensors >= 1  # num_batches_tracked stays


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic-batch"])
def test_lowering_leaves_the_program_unchanged(tmp_path: pathlib.Path, dynamic: bool) -> None:
    """Fingerprint (graph, weights, shape environment) before any lowering, from a capture of
    its own, and after both targets: equal."""
    torch.manual_seed(0)
    model, args = ConvBN().eval(), (torch.randn(2, 3, 8, 8),)
    dyn = ({0: torch.export.Dim("b", min=1, max=32)},) if dynamic else None
    before = SharedProgram.capture(model, args, dynamic_shapes=dyn).fingerprint()
    res = dx.export(model, args, out_dir=tmp_path, name="m", dynamic_shapes=dyn, cache=False)
    assert not res.errors and set(res.artifacts) == {"onnx", "xnnpack"}
    assert isinstance(res.artifacts["xnnpack"].outcome, dx.Lowered)
    after = res.program.fingerprint(rehash=True)
    assert before.diff(after) == ()
    assert before.graph == after.graph and before.shapes == after.shapes and before.weights == after.weights


def test_guard_refuses_a_target_that_changes_a_weight() -> None:
    shared = SharedProgram.capture(MLP(), (torch.randn(2, 16),))
    shared.weight_digests()
    with pytest.raises(dx.ProgramMutatedError, match=r"weight net\.0\.weight"):
        with shared.pinned("xnnpack"):
            with torch.no_grad():
                shared.state_dict["net.0.weight"].data[0, 0] += 1.0  # no version bump through .data


def test_guard_refuses_a_target_that_changes_the_graph() -> None:
    shared = SharedProgram.capture(MLP(), (torch.randn(2, 16),))
    shared.weight_digests()
    with pytest.raises(dx.ProgramMutatedError, match="graph"):
        with shared.pinned("onnx"):
            gm = shared.exported_program.graph_module
            relu = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.relu.default)
            relu.target = torch.ops.aten.sigmoid.default
            gm.recompile()


def test_pin_refuses_a_narrowed_range_and_puts_it_back() -> None:
    batch = torch.export.Dim("batch", min=2, max=64)
    shared = SharedProgram.capture(MLP(), (torch.randn(4, 16),), dynamic_shapes=({0: batch},))
    shared.weight_digests()
    env = find_shape_env(shared.exported_program)
    assert env is not None
    sym = next(iter(shared.exported_program.range_constraints))
    original = env.var_to_range[sym]
    with pytest.raises(dx.RangeNarrowedError, match=r"\[2, 64\] -> \[2, 8\]"):
        with shared.pinned("xnnpack"):
            from torch.utils._sympy.value_ranges import ValueRanges

            env.var_to_range[sym] = ValueRanges(2, 8)  # what a kernel's size guard does
    assert env.var_to_range[sym] == original  # the next target sees the declared range


def test_a_target_failing_before_lowering_leaves_its_pin_at_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target whose decomposition fails leaves the pin before the export returns (its shape
    environment put back for what follows), not when the interpreter collects a suspended
    generator at exit (which printed a traceback there)."""
    import contextlib

    from dualexport.exporters.xnnpack import XnnpackExporter

    left: list[str] = []
    real = SharedProgram.pinned

    @contextlib.contextmanager
    def pinned(self, target):
        with real(self, target) as pin:
            try:
                yield pin
            finally:
                left.append(target)

    def failing(self, *a, **k):
        raise RuntimeError("planted decomposition failure")

    monkeypatch.setattr(SharedProgram, "pinned", pinned)
    monkeypatch.setattr(XnnpackExporter, "decompose", failing)
    res = dx.export(MLP(), (torch.randn(2, 16),), out_dir=tmp_path, name="m", target="xnnpack", cache=False)
    assert set(res.errors) == {"xnnpack"}
    # while the result (whose error holds the failed job's frames) is alive
    assert left == ["xnnpack"], left


def test_tied_weights_are_listed_once(tmp_path: pathlib.Path) -> None:
    res = dx.export(TiedEmbedding(), (torch.randint(0, 50, (2, 5)),), out_dir=tmp_path, name="t")
    assert not res.errors
    names = [e.name for e in res.manifest.entries]
    tied = [e for e in res.manifest.entries if e.aliases]
    assert len(tied) == 1 and {tied[0].name, *tied[0].aliases} == {"emb.weight", "head.weight"}
    assert len(names) == len(set(names))
    res.verify_weights()
    assert dx.compare(res).ok


def test_output_folder_holds_only_complete_artifacts(convbn: dx.ExportResult) -> None:
    names = sorted(p.name for p in convbn.out_dir.iterdir())
    assert not [n for n in names if "staging" in n or n.endswith(".tmp")], names
    for suffix in (".onnx", ".pte", ".weights.json", ".pt2", ".delegation.json", ".inputs.npz"):
        assert f"cb{suffix}" in names


class _ConstantWeight(torch.nn.Module):
    """A plain tensor attribute (a lifted constant, not a parameter) used by a delegated linear."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.randn(8, 8)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(self.fc(x), self.w)


def test_lowering_leaves_the_holders_constants_alone(tmp_path: pathlib.Path) -> None:
    """ExecuTorch 1.4.1 removes the constants a delegate consumes from the lowered program's
    dict; the XNNPACK lowering works on dicts of its own, so the shared program keeps ``w``, the
    link stays (one dict), and the program is saved and proven."""
    torch.manual_seed(0)
    res = dx.export(_ConstantWeight().eval(), (torch.randn(2, 8),), out_dir=tmp_path, name="m", cache=False)
    assert not res.errors, {t: str(e) for t, e in res.errors.items()}
    assert "w" in res.program.constants
    dec = res.program.decomposed["xnnpack"]
    assert dec.state_dict is res.program.state_dict and dec.constants is res.program.constants
    assert (tmp_path / "m.pt2").is_file()
    res.verify_weights()
    assert dx.compare(res).ok
