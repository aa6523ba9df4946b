"""The XNNPACK lowering decomposes a program once: ExecuTorch's three re-decompositions of the
program the target already decomposed are handed a copy (exporters/xnnpack_fixes.py,
``decomposed_once``), and a program with something left to decompose is still decomposed."""

from __future__ import annotations

import pathlib

import pytest
import torch
from torch import nn
from torch.export import ExportedProgram

from dualexport.compat.executorch import default_decomposition_table
from dualexport.exporters import ExportOptions
from dualexport.exporters.xnnpack import XnnpackExporter
from dualexport.exporters.xnnpack_fixes import decomposed_once, nothing_to_decompose


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(x.shape[0], dtype=x.dtype).unsqueeze(-1)  # a size read: aten.sym_size
        return self.b(torch.relu(self.a(x + rows)))


def _decomposed() -> tuple[nn.Module, torch.Tensor, ExportedProgram]:
    torch.manual_seed(0)
    model, x = _Mlp().eval(), torch.randn(3, 16)
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    return model, x, XnnpackExporter().decompose(program, ExportOptions())


def test_the_lowering_retraces_nothing_and_the_file_computes_the_model(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from executorch.runtime import Runtime

    model, x, decomposed = _decomposed()
    # a size read is listed in the decomposition tables; it traces back to itself
    assert any(n.target is torch.ops.aten.sym_size.int for n in decomposed.graph.nodes)
    retraces: list[object] = []
    original = ExportedProgram.run_decompositions

    def counted(self: ExportedProgram, *args: object, **kwargs: object) -> ExportedProgram:
        retraces.append(args[0] if args else kwargs.get("decomp_table"))
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ExportedProgram, "run_decompositions", counted)
    lowered = XnnpackExporter().lower(decomposed, tmp_path, "m", ExportOptions())
    assert retraces == []  # ExecuTorch 1.4.1 re-decomposed it three times
    assert lowered.delegation is not None and lowered.delegation.subgraphs == 1
    method = Runtime.get().load_program(lowered.files[0]).load_method("forward")
    for rows in (1, 3, 64):
        xs = torch.randn(rows, 16)
        torch.testing.assert_close(method.execute([xs])[0], model(xs), rtol=1e-4, atol=1e-4)
    # the target's program is the holder's as before: its own graph, untouched
    assert not any(n.op == "call_function" and "executorch" in str(n.target) for n in decomposed.graph.nodes)


def test_an_op_left_in_the_table_is_still_decomposed() -> None:
    _, _, decomposed = _decomposed()
    linear = torch.ops.aten.linear.default
    assert any(n.target is linear for n in decomposed.graph.nodes)  # kept for the partitioner
    table = default_decomposition_table()
    assert linear in table and not nothing_to_decompose(decomposed, table)
    copy = decomposed_once(decomposed)
    assert copy is not decomposed and copy.state_dict is not decomposed.state_dict
    assert all(copy.state_dict[k] is v for k, v in decomposed.state_dict.items())  # the same tensors
    redone = copy.run_decompositions(table)
    assert not any(n.target is linear for n in redone.graph.nodes)
    kept = {k: v for k, v in table.items() if k is not linear}
    assert nothing_to_decompose(decomposed, kept)
    again = copy.run_decompositions(kept)
    assert again is not copy and [n.name for n in again.graph.nodes] == [
        n.name for n in decomposed.graph.nodes
    ]


def test_a_copy_keeps_a_name_that_shadows_a_builtin() -> None:
    """torch.export names the input of ``forward(self, input)`` ``input``; FX's graph copy would
    rename it ``input_1``, and ExecuTorch refuses a program whose node and spec names differ."""
    from dualexport.shared_state.passes.graph_edit import copy_program

    class Takes(nn.Module):
        def forward(self, input: torch.Tensor) -> torch.Tensor:
            return input * 2

    program = torch.export.export(Takes(), (torch.randn(2),))
    copy = copy_program(program)
    names = [n.name for n in copy.graph.nodes if n.op == "placeholder"]
    assert names == ["input"] == [s.arg.name for s in copy.graph_signature.input_specs]
    torch.testing.assert_close(copy.module()(torch.ones(2)), torch.full((2,), 2.0))
