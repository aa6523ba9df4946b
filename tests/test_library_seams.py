"""The library behaviours dualexport relies on or repairs. If a torch upgrade changes one of
them, these fail first and say which assumption broke."""

from __future__ import annotations

import torch

from models import MLP


def _ep() -> torch.export.ExportedProgram:
    return torch.export.export(MLP().eval(), (torch.randn(2, 16),))


def test_run_decompositions_copies_the_state_dict_dict() -> None:
    # The public bug behind the project: a new dict holding the same tensors.
    ep = _ep()
    dec = ep.run_decompositions()
    assert dec.state_dict is not ep.state_dict
    assert all(dec.state_dict[k] is v for k, v in ep.state_dict.items())


def test_state_dict_is_kept_in_private_slot_we_link() -> None:
    # links.py assigns _state_dict/_constants: the property must read them back.
    ep = _ep()
    dec = ep.run_decompositions()
    dec._state_dict = ep.state_dict
    dec._constants = ep.constants
    assert dec.state_dict is ep.state_dict and dec.constants is ep.constants


def test_torch_onnx_prepare_step_exists_and_copies() -> None:
    from torch.onnx._internal.exporter import _core, _registration

    ep = _ep()
    reg = _registration.ONNXRegistry.from_torchlib()
    dec = _core._prepare_exported_program_for_export(ep, registry=reg)
    assert dec is not ep and dec.state_dict is not ep.state_dict
    assert callable(_core._exported_program_to_onnx_program)


def test_the_cia_walk_still_sees_an_op_registered_after_it() -> None:
    """dualexport skips torch's per-namespace walk of the CompositeImplicitAutograd registrations
    while they are unchanged (shared_state/dispatch_walk.py); an op registered afterwards must
    still be collected as preservable, and the walk must be the one torch calls."""
    from torch._export import utils

    import dualexport.shared_state.program  # noqa: F401  (installs the skip)

    assert getattr(utils._materialize_cpp_cia_ops, "dualexport_walk_once", False)
    before = utils._collect_all_valid_cia_ops()
    lib = torch.library.Library("dxseam", "DEF")  # noqa: TOR901
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
    after = utils._collect_all_valid_cia_ops()
    assert torch.ops.dxseam.twice.default in after and torch.ops.dxseam.twice.default not in before
    assert before <= after
