"""The one place that links a decomposed program's state_dict back to the holder's dict.

Why: ``ExportedProgram.run_decompositions`` returns a program whose ``state_dict`` is a *copy* of
the dict (same tensors, new dict). A converter that kept the original now points at a different
dict than the program it lowered (pytorch issue "run_decompositions doesn't keep the same model
state_dict"). The fix proposed there: when the decomposition did not change the weights, link the
old dict back. ``state_dict`` has no public setter; the program keeps it in ``_state_dict`` (and
its constants in ``_constants``). ``tests/test_library_seams.py`` fails if a torch upgrade
changes that.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.export import ExportedProgram

from ..compat.torch import set_weight_dicts

__all__ = ["LinkReport", "link_state_dict"]


@dataclass(frozen=True)
class LinkReport:
    """What linking found. ``linked`` is True when the decomposed program now uses the holder's
    dicts; otherwise ``changes`` says, per entry, how the decomposition changed the weights."""

    linked: bool
    constants_linked: bool
    changes: tuple[tuple[str, str], ...] = ()


def _diff(holder: dict, other: dict) -> list[tuple[str, str]]:
    changes: list[tuple[str, str]] = []
    for key in holder:
        if key not in other:
            changes.append((key, "dropped by the decomposition"))
        elif other[key] is not holder[key]:
            changes.append((key, "replaced by a different tensor object (copied or rewritten)"))
    for key in other:
        if key not in holder:
            changes.append((key, "added by the decomposition (a lifted constant or new buffer)"))
    return changes


def link_state_dict(decomposed: ExportedProgram, holder: ExportedProgram) -> LinkReport:
    """Make ``decomposed.state_dict is holder.state_dict`` (and the same for constants) when the
    decomposition kept exactly the holder's tensor objects; otherwise leave it and say why."""
    sd_changes = _diff(holder.state_dict, decomposed.state_dict)
    const_changes = _diff(holder.constants, decomposed.constants)
    linked = not sd_changes
    if linked and decomposed.state_dict is not holder.state_dict:
        set_weight_dicts(decomposed, state_dict=holder.state_dict)
    constants_linked = not const_changes
    if constants_linked and decomposed.constants is not holder.constants:
        set_weight_dicts(decomposed, constants=holder.constants)
    return LinkReport(
        linked=linked,
        constants_linked=constants_linked,
        changes=tuple(sd_changes + [(k, f"constant {why}") for k, why in const_changes]),
    )
