"""The weight proof of the runner .pte: every weight of the one state_dict found in the file on disk.

Why its own: the deploy folder's .pte is made from the shared program directly (no explicit-cache
.pte is made beside it, whose manifest entry would have covered XNNPACK), so it gets what every
published file gets: each weight of the shared program located in the file by its bytes (as-is,
or in XNNPACK's own encodings: 4-bit codes two per byte, bfloat16 group scales), read back from
disk with the same locator the manifest uses (``weights/locate.py``). A weight the file does not
hold, or holds with other bytes, refuses the file naming the weight.
"""

from __future__ import annotations

import collections
import pathlib
from collections.abc import Mapping
from typing import Any

from ...errors import WeightMismatchError
from .runner_proof import WRAPPED

__all__ = ["prove_runner_weights"]


def _unwrapped(names: Mapping[str, Any]) -> dict[str, Any]:
    """The runner program's names of the shared weights, as the shared program names them."""
    out: dict[str, Any] = {}
    for key, value in names.items():
        if isinstance(value, tuple):
            value = tuple(v.removeprefix(WRAPPED) for v in value)
        out[key.removeprefix(WRAPPED)] = value
    return out


def _not_read(decomposed: Any, shared: Any) -> dict[str, str]:
    """The shared program's weights the runner program does not read at all (a mask or rotary
    table the runtime's own attention op computes without), each with the reason."""
    sig = decomposed.graph_signature
    read = {
        name.removeprefix(WRAPPED)
        for names in (sig.inputs_to_parameters, sig.inputs_to_buffers, sig.inputs_to_lifted_tensor_constants)
        for name in names.values()
    }
    program = shared.exported_program
    reason = "the runner program does not read it: the graph lowered into this file computes without it"
    return {name: reason for name in [*program.state_dict, *program.constants] if name not in read}


def prove_runner_weights(path: pathlib.Path, shared: Any, lowered: Any, decomposed: Any) -> dict[str, int]:
    """Locate every weight of ``shared`` (the export's ``SharedProgram``) in the runner file
    ``path``; ``lowered``: its ``LoweredTarget`` (what the lowering says it did not store as-is),
    ``decomposed``: the runner program it was lowered from (a weight it does not read is not
    stored). Returns the copies found per status; raises ``WeightMismatchError`` naming the
    weights that are missing or other."""
    from ...weights.locate import build_entries, holder_tensors, locate_pte
    from ...weights.manifest import FAILING_STATUSES
    from ...weights.readers import read_pte

    program = shared.exported_program
    entries = build_entries(program, shared.weight_digests())
    copies = locate_pte(
        entries,
        holder_tensors(program),
        read_pte(path),
        {**_not_read(decomposed, shared), **_unwrapped(lowered.weight_notes)},
        _unwrapped(lowered.derived_copies),
    )
    problems = tuple(
        f"weight {name!r} is {loc.status}: {loc.reason}"
        for name, found in copies.items()
        for loc in found
        if loc.status in FAILING_STATUSES
    )
    if problems:
        raise WeightMismatchError(
            f"{path.name} does not carry the shared program's weights: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            problems=problems,
            target="xnnpack",
            hint="the file was not published; report the model",
        )
    return dict(collections.Counter(loc.status for found in copies.values() for loc in found))
