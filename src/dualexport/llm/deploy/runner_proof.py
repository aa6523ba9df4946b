"""The proof of a quantized program's runner .pte that attends with ExecuTorch's own ops: linear
by linear, call after call, on the walks of proof.py.

Why not end to end: a program with int4 weights and per-token int8 activations is chaotic on real
weights (parity/forced.py). Measured on SmolLM2-135M-Instruct int4, a correct fused runner file
sits 20-34 dB from the program on the walks' calls, and the program itself sits 5-36 dB from the
same program with float activations (5 dB at the first position, where one token carries the
model's massive activations): no end-to-end bar separates a correct file from one wrong block.
Nor can the proven explicit file stand in: another attention kernel sums in another order, and
the int8 levels amplify that the same way.

So the file is held to its own graph. The reference is the runner program (the shared program's
module with ``llama::update_cache`` + ``llama::custom_sdpa`` in place of its attention: the graph
lowered into the file), teacher-forced with the file's own linears (parity/forced.py) on every
call of the walks, its cache buffers carried from call to call as the file carries its own (each
row written from the forced keys and values). The file's linears come from a tapped lowering of
the same decomposed program, which counts only if it computes the file's logits
(``TAPPED_LOWERING_MIN_SNR_DB``: the same kernels, bit-identical). Each linear is judged by the
bound of parity/forced.py, the file's logits against the forced program's by the float criterion,
so what the explicit file's proof catches (a doubled scale, transposed codes of one block) is
caught here the same way, with the layer and the call named.
"""

from __future__ import annotations

import logging
import math
import pathlib
from typing import Any

import torch
from torch.export import ExportedProgram

from ...errors import ProofMismatchError
from ..layout import LlmLayout
from .proof import DeployProof, WalkCheck, walks

__all__ = ["prove_runner_by_linears", "AGAINST"]

logger = logging.getLogger(__name__)

#: What the proof names as the file's reference.
AGAINST = "the runner program teacher-forced with the file's own linears"

_HINT = "the file does not compute the program it was made from; it was not published"
#: the prefix of the shared program's weights in the runner program (CacheInBuffers.program)
WRAPPED = "program."


class _Tapped:
    """The file and its tapped lowering, run side by side from fresh caches."""

    def __init__(self, path: pathlib.Path, decomposed: ExportedProgram) -> None:
        from ...parity.forced import linear_taps
        from ...parity.localize import TappedXnnpack

        self.path = path
        #: the decomposed program's linears (the tapped copy keeps their names)
        self.linears = set(linear_taps(decomposed))
        self.tapped = TappedXnnpack(decomposed, lambda n: n.name in self.linears, same_names=True)
        self.file: Any = None

    def reset(self) -> None:
        from ...runtimes import open_runner

        self.file = open_runner("xnnpack", self.path, isolated=False)  # a fresh load: empty caches
        self.tapped.reset()

    def run(self, inputs: list[torch.Tensor], where: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The file's logits and its linears' values (by the decomposed program's names)."""
        from ...parity.metrics import compute_metrics
        from ...pipeline.forced_proof import TAPPED_LOWERING_MIN_SNR_DB

        got = self.file.run(inputs)[0]
        values = self.tapped.values(inputs)
        sibling = values.get("output:0")
        snr = -math.inf
        if sibling is not None and tuple(sibling.shape) == tuple(got.shape):
            snr = compute_metrics(sibling.to(got.dtype), got, rtol=0.0, atol=0.0).snr_db
        if snr < TAPPED_LOWERING_MIN_SNR_DB:
            raise ProofMismatchError(
                f"{self.path.name}: a tapped lowering of its program, run to check it linear by linear, "
                f"computes the logits at {snr:.1f} dB from the file {where}, so it cannot stand for the file",
                target="xnnpack",
                hint="report the model: the runner file could not be proven; it was not published",
            )
        observed = {n: v for n, v in values.items() if n in self.linears}
        return got, observed


def prove_runner_by_linears(
    path: pathlib.Path, decomposed: ExportedProgram, layout: LlmLayout, shared: ExportedProgram
) -> DeployProof:
    """Walk the runner file at ``path`` over proof.py's walks beside ``decomposed`` (the runner
    program it was lowered from) teacher-forced with the file's linears (see the module
    docstring); raise :class:`ProofMismatchError` naming the walk, the call and the linear where
    the file departs, or the weight the runner program does not share with ``shared``."""
    from ...parity.forced import initial_state

    _reads_the_shared_weights(path.name, decomposed, shared)
    side = _Tapped(path, decomposed)
    checks = []
    for index, walk in enumerate(walks(layout)):
        tokens = walk.tokens(layout.vocab, seed=index)
        side.reset()
        state = initial_state(decomposed)
        calls = [tokens[: walk.prompt]] + [[t] for t in tokens[walk.prompt :]]
        worst_abs, worst_snr, start, ratio, linears = 0.0, math.inf, 0, 0.0, 0
        for call, ids in enumerate(calls):
            where = "at the prompt" if call == 0 else f"at decode step {call} (position {start})"
            where += f" of {walk.label}"
            inputs = [torch.tensor([ids], dtype=torch.long), torch.arange(start, start + len(ids))]
            start += len(ids)
            got, observed = side.run(inputs, where)
            m, forced = _forced_call(path.name, decomposed, inputs, observed, state, got, where)
            worst_abs, worst_snr = max(worst_abs, m.max_abs), min(worst_snr, m.snr_db)
            ratio, linears = max(ratio, forced.worst), max(linears, len(forced.linears))
        logger.info(
            "%s, %s: %d call(s), each of %d linears within its bound on the file's own input (worst %.2fx)",
            path.name,
            walk.label,
            len(calls),
            linears,
            ratio,
        )
        checks.append(WalkCheck(walk.label, len(calls), worst_abs, worst_snr, ratio))
    return DeployProof(path.name, AGAINST, tuple(checks))


def _reads_the_shared_weights(name: str, decomposed: ExportedProgram, shared: ExportedProgram) -> None:
    """Every weight the runner program reads is the shared program's own tensor (its wrapper's
    ``program.<name>``, the same storage): the reference the file is held to computes with the
    one state_dict, not a copy a decomposition handed back (invariant 2); the caches it writes
    are its own state."""
    own = {**shared.state_dict, **shared.constants}
    written = set(decomposed.graph_signature.buffers_to_mutate.values())
    for key, tensor in (*decomposed.state_dict.items(), *decomposed.constants.items()):
        if key in written or not isinstance(tensor, torch.Tensor):
            continue
        source = own.get(key.removeprefix(WRAPPED))
        if source is None or source.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr():
            raise ProofMismatchError(
                f"{name}: its program reads {key} from "
                + (
                    "a tensor the shared program does not hold"
                    if source is None
                    else "a copy of the shared program's"
                )
                + ", so a proof against it would not hold the file to the shared weights",
                target="xnnpack",
                hint="a decomposition handed back copies of the weights; " + _HINT,
            )


def _forced_call(
    name: str,
    decomposed: ExportedProgram,
    inputs: list[torch.Tensor],
    observed: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
    got: torch.Tensor,
    where: str,
) -> tuple[Any, Any]:
    """One call: every linear of the file within its bound, then its logits those the program
    computes from the file's linears; the metrics of the logits and the forced result."""
    from ...parity.forced import teacher_forced
    from ...parity.tolerances import tolerance_for

    if not observed:
        raise ProofMismatchError(
            f"{name} exposes none of its program's linears to check one by one {where}",
            target="xnnpack",
            hint=_HINT,
        )
    forced = teacher_forced(decomposed, inputs, observed, state)
    bad = forced.first_failure
    if bad is not None:
        raise ProofMismatchError(
            f"{name} computes the {bad.describe()} {where}",
            target="xnnpack",
            hint="the file does not compute the quantized program at this layer (a scale, a code "
            "block or a layout); it was not published",
        )
    want = forced.outputs[0]
    m = tolerance_for("xnnpack", want.dtype).judge(got, want.reshape(got.shape))
    if not m.ok:
        raise ProofMismatchError(
            f"{name} computes other logits {where} than the program run on the file's own linears: "
            f"max_abs {m.max_abs:.3g}, SNR {m.snr_db:.1f} dB",
            target="xnnpack",
            hint="the file departs from the program after its last linear; " + _HINT,
        )
    return m, forced
