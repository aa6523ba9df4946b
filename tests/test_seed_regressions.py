"""The two public bugs dualexport exists for, each shown failing on the plain library path
(strict xfail: if the library is fixed, the xfail turns into an error and we learn of it) and
passing on ours."""

from __future__ import annotations

import pathlib

import onnx
import pytest
import torch

import dualexport as dx
from models import MLP, ConvBN, DoublePermute, remove_permute_pairs

PLAIN_DECOMP = pytest.param(
    "plain",
    marks=pytest.mark.xfail(
        strict=True,
        raises=AssertionError,
        reason="torch.export: run_decompositions returns a program with a copied "
        "state_dict dict (pytorch issue: run_decompositions doesn't keep the same state_dict)",
    ),
)


def _plain_decomposed(model: torch.nn.Module, args: tuple) -> tuple[dict, dict]:
    """What a converter that keeps the original program sees: torch.onnx's and ExecuTorch's
    own decompositions of one ExportedProgram."""
    from executorch.exir.tracer import _default_decomposition_table
    from torch.onnx._internal.exporter import _core, _registration

    ep = torch.export.export(model.eval(), args)
    onnx_dec = _core._prepare_exported_program_for_export(
        ep, registry=_registration.ONNXRegistry.from_torchlib()
    )
    xnn_dec = ep.run_decompositions(_default_decomposition_table())
    return ep.state_dict, {"onnx": onnx_dec, "xnnpack": xnn_dec}


@pytest.mark.parametrize("path", [PLAIN_DECOMP, "dualexport"])
def test_decomposed_programs_share_the_holders_state_dict(path: str, tmp_path: pathlib.Path) -> None:
    model, args = ConvBN(), (torch.randn(1, 3, 8, 8),)
    if path == "plain":
        holder, decomposed = _plain_decomposed(model, args)
    else:
        res = dx.export(model, args, out_dir=tmp_path, name="m")
        assert not res.errors
        holder, decomposed = res.program.state_dict, res.program.decomposed
    assert set(decomposed) == {"onnx", "xnnpack"}
    for target, dec in decomposed.items():
        assert dec.state_dict is holder, target
        assert all(dec.state_dict[k] is holder[k] for k in holder)


def _transposes_of_input(model: onnx.ModelProto) -> int:
    inputs = {i.name for i in model.graph.input}
    return sum(1 for n in model.graph.node if n.op_type == "Transpose" and set(n.input) & inputs)


def _llm_manager_delegation(model: torch.nn.Module, args: tuple, *, transform: bool) -> dict:
    """The regression exactly where users met it: ExecuTorch's LLM export manager keeps the
    exported program's graph module (``pre_autograd_graph_module``), the canonical pass that
    removes redundant permutes runs on it, then ``to_edge_transform_and_lower``. Before the fix
    (ExecuTorch PR "Fix pre-autograd transforms not getting persisted during xnnpack export") the
    lowering took the original ExportedProgram and the permutes came back."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.extension.llm.export.builder import DType, LLMEdgeManager

    from dualexport.exporters.delegation import DelegationReport

    manager = LLMEdgeManager(
        model=model.eval(),
        modelname="m",
        max_seq_len=8,
        dtype=DType.fp32,
        use_kv_cache=False,
        example_inputs=args,
        enable_dynamic_shape=False,
    )
    manager.export()
    if transform:
        manager.run_canonical_optimizations()  # RemoveRedundantTransposes on the kept graph module
    manager.to_edge_transform_and_lower([XnnpackPartitioner()])
    lowered = manager.edge_manager.exported_program().graph_module
    return dict(DelegationReport.from_graph_module(lowered).by_op)


def test_the_library_path_where_the_bug_lived_keeps_the_transform() -> None:
    """A canary that can flip both ways: without the transform the lowered program has the
    permutes; with it (applied to the separately kept graph module, the way the LLM manager's
    users do) they are gone. ExecuTorch 1.4.1 has the fix (the manager re-exports its kept graph
    module); if a release loses it again, the second assertion fails."""
    model, args = DoublePermute(), (torch.randn(2, 4, 8),)
    without = _llm_manager_delegation(model, args, transform=False)
    assert any("permute" in op for op in without), without
    with_transform = _llm_manager_delegation(model, args, transform=True)
    assert not any("permute" in op for op in with_transform), with_transform


def test_transform_reaches_both_artifacts(tmp_path: pathlib.Path) -> None:
    """Ours: the transform edits the shared program itself, so the ONNX graph and the XNNPACK
    delegation table both show it, and parity holds."""
    model, args = DoublePermute(), (torch.randn(2, 4, 8),)
    res = dx.export(model, args, out_dir=tmp_path, name="m", transforms=[remove_permute_pairs])
    assert not res.errors
    assert res.program.transforms[0].changed
    n_input_transposes = _transposes_of_input(onnx.load(str(res.artifacts["onnx"].path)))
    by_op = dict(res.artifacts["xnnpack"].delegation.by_op)
    # the shared program itself shows the transform
    assert not any(
        n.target == torch.ops.aten.permute.default for n in res.program.exported_program.graph.nodes
    )
    assert dx.compare(res).ok
    assert n_input_transposes == 0  # no Transpose of the input left in the ONNX graph
    assert not any("permute" in op for op in by_op), by_op


def test_program_transform_replaces_the_shared_program(tmp_path: pathlib.Path) -> None:
    """An ExportedProgram -> ExportedProgram transform: both targets are fed from its result and
    the holder keeps one dict."""
    seen = {}

    def decompose_all(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
        seen["in"] = ep
        return ep.run_decompositions()

    res = dx.export(MLP(), (torch.randn(2, 16),), out_dir=tmp_path, name="m", transforms=[decompose_all])
    assert not res.errors
    assert res.program.exported_program is not seen["in"]
    assert res.program.transforms[0].kind == "program"
    assert res.program.state_dict is seen["in"].state_dict  # the one dict survived
    assert dx.compare(res).ok
