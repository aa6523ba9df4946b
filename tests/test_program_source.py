"""A program as the source (issue 20): ``dx.export(ep)`` and ``dx.export("model.pt2")``.

One ExportedProgram with a dynamic batch is lowered once to both targets (the module fixture);
the ``.pt2`` of the same program then goes through the same folder (a cache hit, then a
weights-only change that is patched), and every check (dict identity, no second trace, ranges at
the edges, weights from disk, parity) is asserted on each. The CLI side, lowering a ``.pt2`` from
scratch, is in tests/test_cli_sources.py. Programs that cannot serve are refused by name.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from torch.export import Dim

import dualexport as dx
from models import MLP

BATCH = Dim("batch", min=1, max=32)


def _program() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    return torch.export.export(MLP().eval(), (torch.randn(4, 16),), dynamic_shapes=({0: BATCH},))


def _shares_weights(obj: object, state_dict: dict[str, torch.Tensor]) -> bool:
    """Whether a module handed to torch.export holds any of the program's weight storages (a
    second trace of the program's ``module()`` would)."""
    if not isinstance(obj, torch.nn.Module):
        return False
    ptrs = {t.untyped_storage().data_ptr() for t in state_dict.values()}
    return any(p.untyped_storage().data_ptr() in ptrs for p in [*obj.parameters(), *obj.buffers()])


@pytest.fixture(scope="module")
def given(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dx.ExportResult, torch.export.ExportedProgram, dict, list]:
    program = _program()
    state_dict = program.state_dict
    traced: list[object] = []
    real = torch.export.export
    with pytest.MonkeyPatch.context() as mp:

        def counting(*a, **k):  # type: ignore[no-untyped-def]
            traced.append(a[0])
            return real(*a, **k)

        mp.setattr(torch.export, "export", counting)
        res = dx.export(program, out_dir=tmp_path_factory.mktemp("ep"), name="mlp")
    assert not res.errors, res.errors
    return res, program, state_dict, traced


def test_the_program_is_the_holders_program_with_its_own_dict(given) -> None:  # type: ignore[no-untyped-def]
    res, program, state_dict, traced = given
    shared = res.program
    assert shared.exported_program is program
    assert shared.state_dict is shared.exported_program.state_dict
    assert shared.state_dict is state_dict  # the given program's own dict object
    for target, dec in shared.decomposed.items():
        assert dec.state_dict is state_dict, target
    for target, art in res.artifacts.items():
        assert isinstance(art.outcome, dx.Lowered) and art.outcome.kept_not_shared == (), target
    # no second trace: nothing that torch.export traced holds the program's weights
    assert not [m for m in traced if _shares_weights(m, state_dict)]
    assert "taken from a given ExportedProgram (no trace)" in shared.notes


def test_example_inputs_and_ranges_come_from_the_program(given) -> None:  # type: ignore[no-untyped-def]
    res, program, _, _ = given
    assert res.program.example_args[0] is program.example_inputs[0][0]
    (rng,) = res.program.exported_program.range_constraints.values()
    assert (int(rng.lower), int(rng.upper)) == (1, 32)
    for art in res.artifacts.values():  # each file was proven from disk at the range's edges
        assert {e for e in art.outcome.proof.edges} >= {"min", "max-1", "max"}, art.outcome.proof


def test_weights_and_parity_at_every_edge(given) -> None:  # type: ignore[no-untyped-def]
    res, _, _, _ = given
    check = res.verify_weights()
    assert check.exact == {"onnx": 4, "xnnpack": 4}
    report = dx.compare(res)
    assert report.ok, report.to_markdown()
    assert set(report.inputs) == {"example", "edge:min", "edge:max-1", "edge:max"}
    shapes = {o.label.split("/")[0]: o.shape for o in report.outputs}
    assert shapes["edge:min"] == (1, 8) and shapes["edge:max"] == (32, 8)
    html = report._repr_html_()
    assert "<table" in html and "PASS" in html and "edge:max/out0" in html


def test_print_and_notebook_views_show_the_cli_summary(given) -> None:  # type: ignore[no-untyped-def]
    res, _, _, _ = given
    text = str(res)
    assert f"onnx: {res.artifacts['onnx'].path}" in text
    assert "XNNPACK delegation: 1 subgraph(s), 3 of 3 compute ops delegated (100%)" in text
    assert "Weight manifest (from the files on disk)" in text and "getitem" in text
    html = res._repr_html_()
    assert html.count("<table") == 3 and "3 of 3 compute ops delegated (100%)" in html
    assert "Lowered" in html and "<code>getitem</code>" in html


def test_a_pt2_file_reuses_then_patches_the_same_folder(given, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    """The .pt2 of the same program is the same cache key (a hit); the same .pt2 with one weight
    changed is patched: cache and patch work as for a module."""
    res, program, _, _ = given
    path = tmp_path / "mlp.pt2"
    torch.export.save(program, path)
    hit = dx.export(path, out_dir=res.out_dir, name="mlp")
    assert not hit.errors and all(isinstance(a.outcome, dx.Reused) for a in hit.artifacts.values())
    assert hit.program.state_dict is hit.program.exported_program.state_dict
    hit.verify_weights()

    changed = torch.export.load(path)
    with torch.no_grad():
        changed.state_dict["net.2.weight"].mul_(1.5)
    torch.export.save(changed, path)
    loaded = torch.export.load(path)
    own = loaded.state_dict
    patched = dx.export(loaded, out_dir=res.out_dir, name="mlp")
    assert not patched.errors
    assert all(isinstance(a.outcome, dx.Patched) for a in patched.artifacts.values()), patched.artifacts
    assert patched.program.state_dict is own
    assert patched.verify_weights().exact == {"onnx": 4, "xnnpack": 4}
    report = dx.compare(patched)
    assert report.ok, report.to_markdown()


def test_a_loaded_programs_ranges_survive_int8_requantization(tmp_path: pathlib.Path) -> None:
    """int8 re-exports the program's ``module()`` with its own ranges (shared and derived dims),
    and the pin refuses any range that came back narrower; a loaded program's shape environment
    is aligned with a trace's first, so nothing reads as narrowed that was not."""
    from dualexport.shared_state import SharedProgram
    from dualexport.shared_state.quantize import quantize_shared

    class TwoInputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            n = x.shape[0]
            return self.fc(x) + y[:n] + y[n:]

    d = Dim("d", min=2, max=8)
    program = torch.export.export(
        TwoInputs().eval(), (torch.randn(4, 8), torch.randn(8, 8)), dynamic_shapes=({0: d}, {0: 2 * d})
    )
    torch.export.save(program, tmp_path / "two.pt2")
    shared = SharedProgram.from_program(torch.export.load(tmp_path / "two.pt2"))
    declared = {
        str(k): (int(v.lower), int(v.upper)) for k, v in shared.exported_program.range_constraints.items()
    }
    assert sorted(declared.values()) == [(2, 8), (4, 16)]
    quantize_shared(
        shared, "int8", [(torch.randn(3, 8), torch.randn(6, 8)), (torch.randn(8, 8), torch.randn(16, 8))]
    )
    after = {
        str(k): (int(v.lower), int(v.upper)) for k, v in shared.exported_program.range_constraints.items()
    }
    assert after == declared
    assert shared.float_program is not None and shared.exported_program is not shared.float_program


# ------------------------------------------------------------------------------ refusals
def test_a_program_exported_in_training_mode_is_refused(tmp_path: pathlib.Path) -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.bn, self.drop = (
                torch.nn.Linear(4, 4),
                torch.nn.BatchNorm1d(4),
                torch.nn.Dropout(0.5),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(self.bn(self.fc(x)))

    program = torch.export.export(Net().train(), (torch.randn(3, 4),))
    with pytest.raises(dx.InputError, match="(?s)training mode.*batch_norm.*model.eval") as info:
        dx.export(program, out_dir=tmp_path / "o")
    assert "2 node(s)" in str(info.value)
    assert not (tmp_path / "o" / "model.onnx").exists()


def test_a_program_without_example_inputs_needs_args(tmp_path: pathlib.Path) -> None:
    program = _program()
    program.example_inputs = None
    with pytest.raises(dx.InputError, match="no example inputs.*no args"):
        dx.export(program, out_dir=tmp_path)


def test_args_that_do_not_fit_the_program_are_refused(tmp_path: pathlib.Path) -> None:
    program = _program()
    with pytest.raises(dx.InputError, match=r"dim 0 is 64, outside the exported range \[1, 32\]"):
        dx.export(program, (torch.randn(64, 16),), out_dir=tmp_path)
    with pytest.raises(dx.InputError, match="structure the program takes"):
        dx.export(program, (torch.randn(4, 16), torch.randn(4, 16)), out_dir=tmp_path)
    with pytest.raises(dx.InputError, match="dynamic ranges are the ones it was exported with"):
        dx.export(program, dynamic_shapes=({0: BATCH},), out_dir=tmp_path)


def test_files_that_are_not_programs_are_refused(tmp_path: pathlib.Path) -> None:
    not_pt2 = tmp_path / "model.onnx"
    not_pt2.write_bytes(b"onnx")
    with pytest.raises(dx.InputError, match=r"is not a \.pt2 file.*torch.export.save"):
        dx.export(str(not_pt2), out_dir=tmp_path / "o")
    fake = tmp_path / "fake.pt2"
    fake.write_text("not a zip")
    with pytest.raises(dx.InputError, match="not a torch.export archive"):
        dx.export(fake, out_dir=tmp_path / "o")
    saved_module = tmp_path / "module.pt2"
    torch.save(MLP(), saved_module)  # a zip, but a pickled module, not a program
    with pytest.raises(dx.InputError, match="torch.export.load could not read"):
        dx.export(saved_module, out_dir=tmp_path / "o")
    with pytest.raises(dx.InputError, match="no such file"):
        dx.export(tmp_path / "missing.pt2", out_dir=tmp_path / "o")
    with pytest.raises(dx.InputError, match="args are required"):
        dx.export(MLP(), out_dir=tmp_path / "o")
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_an_edge_program_is_refused(tmp_path: pathlib.Path) -> None:
    from executorch.exir import to_edge

    edge = to_edge(_program()).exported_program()
    with pytest.raises(dx.InputError, match="(?s)EDGE dialect.*before to_edge"):
        dx.export(edge, out_dir=tmp_path)
