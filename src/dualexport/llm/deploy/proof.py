"""Prove a deploy file by generation walks, from disk, before it is published.

Why walks and not the proof sets of ``dx.export``: a runner's .pte keeps its cache inside, so
it cannot be handed a cache; it is run as its runner runs it, a prompt then one token at a time,
and so is the genai .onnx (the past of exactly the tokens seen). Three walks cover the edges of
what the runners feed: a one-token prompt then decode steps (the smallest call, the first
positions), a prompt of about half the window, and the longest prompt (``T - 1`` tokens) then the
last position. The tokens are fixed in advance (teacher-forced), so both sides see the same
inputs whatever they compute.

Against what:

* a float program: the shared program itself, driven the same way through its explicit cache,
  by the target's float criterion (``parity/tolerances.py``), each call's logits;
* a quantized program (torchao ops): its arithmetic is chaotic (a 1e-7 change of an activation
  moves a token to the next int8 level, and real int4 programs sit 19-36 dB from themselves
  under such noise: docs/quantization.md), so an end-to-end comparison proves nothing tight.
  The genai .onnx is the proven .onnx with other I/O (the same graph, the same kernels), so it
  is held to that file driven with exactly the tokens seen at :data:`SAME_FILE_MIN_SNR_DB`: the
  same numbers, up to a kernel's choice of summation order. The proven file was held to the
  program linear by linear (pipeline/forced_proof.py). A quantized .pte is held to its own graph
  linear by linear on the same walks (runner_proof.py).
* a quantized program whose .onnx runs ONNX Runtime's own int8 kernel (``MatMulNBits`` at
  accuracy level 4: the activations quantized per block inside the kernel): the file computes
  the program with float activations plus its kernel's rounding, and its explicit file was
  proven so (pipeline/reference.py ``approximated``). The deploy file is held to the same
  criterion on each call of the walks: its SNR against the program with float activations at
  least the quantized program's own SNR against it (``quantized_tolerance``), so a runner file
  with another attention kernel (GroupQueryAttention) is judged by what it computes, not by
  bit-equality with a file whose kernel it does not share.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import DualExportError, ProofMismatchError, RuntimeExecutionError
from ..layout import LlmLayout

__all__ = ["Walk", "walks", "WalkCheck", "DeployProof", "prove_deploy_file", "SAME_FILE_MIN_SNR_DB"]

#: A deploy file against the proven file it was made from (same graph and kernels): the bar of
#: the tapped lowering that stands for a .pte (pipeline/forced_proof.py), the same numbers.
SAME_FILE_MIN_SNR_DB = 80.0
#: Decode steps after each prompt.
DECODE_STEPS = 4


@dataclass(frozen=True)
class Walk:
    """A prompt of ``prompt`` tokens, then ``decode`` one-token calls (teacher-forced ids)."""

    label: str
    prompt: int
    decode: int

    def tokens(self, vocab: int, seed: int) -> list[int]:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, vocab, (self.prompt + self.decode,), generator=g).tolist()


def walks(layout: LlmLayout) -> tuple[Walk, ...]:
    """The walks a deploy file is proven on (see the module docstring)."""
    t = layout.max_seq_len
    longest = t - 1
    half = max(2, min(t // 2, longest - DECODE_STEPS))
    out = [Walk("a 1-token prompt", 1, min(DECODE_STEPS, longest - 1))]
    if 1 < half < longest:
        out.append(Walk(f"a {half}-token prompt", half, min(DECODE_STEPS, t - half)))
    out.append(Walk(f"the longest prompt ({longest} tokens) and the last position", longest, 1))
    return tuple(out)


@dataclass(frozen=True)
class WalkCheck:
    """One walk's worst agreement; ``worst_linear``: the worst linear's ratio to its bound when
    the file was proven linear by linear (runner_proof.py), else None."""

    walk: str
    calls: int
    max_abs: float
    snr_db: float
    worst_linear: float | None = None


@dataclass(frozen=True)
class DeployProof:
    """What a deploy file was proven against, and the worst agreement of each walk."""

    file: str
    against: str
    walks: tuple[WalkCheck, ...]

    @property
    def worst_snr_db(self) -> float:
        return min((w.snr_db for w in self.walks), default=float("inf"))

    @property
    def worst_linear(self) -> float | None:
        ratios = [w.worst_linear for w in self.walks if w.worst_linear is not None]
        return max(ratios) if ratios else None

    def describe(self) -> str:
        """The worst agreement, as the proof judged it."""
        if self.worst_linear is not None:
            return f"every linear within its bound, worst at {self.worst_linear:.2f}x"
        return f"worst SNR {self.worst_snr_db:.1f} dB"


def drive(session: Any, tokens: Sequence[int], prompt: int) -> list[torch.Tensor]:
    """The logits of each call of a walk: the prompt's ``[prompt, V]``, then each step's ``[1, V]``."""
    session.reset()
    out = [session.step(list(tokens[:prompt]))]
    for token in tokens[prompt:]:
        out.append(session.step([token]))
    return out


class ProgramRunner:
    """The shared program run eagerly on flat inputs (the reference of a float deploy file)."""

    name = "eager"

    def __init__(self, program: Any) -> None:
        from ...shared_state.program import reference_module

        self.module = reference_module(program)

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        with torch.no_grad():
            return [o.detach() for o in self.module(*inputs)]


def prove_deploy_file(
    path: pathlib.Path,
    target: str,
    reference: Callable[[], Any],
    against: str,
    layout: LlmLayout,
    quantized: bool,
    noise: Callable[[], Any] | None = None,
) -> DeployProof:
    """Walk ``path`` (opened as a :class:`~dualexport.llm.session.DecoderSession`) and the
    ``reference`` session (made by the callable) over :func:`walks`; raise
    :class:`ProofMismatchError` naming the walk and the call where a file departs. ``noise``:
    the quantized program's session when ``reference`` is its float-activation approximation
    (the kernel criterion of the module docstring)."""
    from ..session import DecoderSession

    try:
        session = DecoderSession.open(path)
    except DualExportError as exc:
        raise RuntimeExecutionError(
            f"{path.name} does not load: {exc.message}", target=target, hint=exc.hint
        ) from exc
    ref = reference()
    own = noise() if noise is not None else None
    checks = []
    for index, walk in enumerate(walks(layout)):
        tokens = walk.tokens(layout.vocab, seed=index)
        try:
            got = drive(session, tokens, walk.prompt)
        except DualExportError as exc:
            raise RuntimeExecutionError(
                f"{path.name} does not run {walk.label}: {exc.message}", target=target, hint=exc.hint
            ) from exc
        want = drive(ref, tokens, walk.prompt)
        programs: list[torch.Tensor | None] = [None] * len(want)
        if own is not None:
            programs = list(drive(own, tokens, walk.prompt))
        if session.layout.last_logits:  # the file returns each call's last row: compare that one
            want = [w[-1:] for w in want]
            programs = [p if p is None else p[-1:] for p in programs]
        worst_abs, worst_snr = 0.0, float("inf")
        for call, (g, w, p) in enumerate(zip(got, want, programs, strict=True)):
            where = "the prompt" if call == 0 else f"decode step {call} (position {walk.prompt + call - 1})"
            if tuple(g.shape) != tuple(w.shape):
                raise ProofMismatchError(
                    f"{path.name} returns logits of shape {tuple(g.shape)} at {where} of {walk.label}; "
                    f"{against} gives {tuple(w.shape)}",
                    target=target,
                    hint="the file does not compute the program it was made from; it was not published",
                )
            m, ok, bar = _judge_call(target, g, w, p, quantized)
            if not ok:
                raise ProofMismatchError(
                    f"{path.name} computes other logits than {against} at {where} of {walk.label}: "
                    f"max_abs {m.max_abs:.3g}, SNR {m.snr_db:.1f} dB ({bar})",
                    target=target,
                    hint="the file does not compute the program it was made from; it was not published",
                )
            worst_abs, worst_snr = max(worst_abs, m.max_abs), min(worst_snr, m.snr_db)
        checks.append(WalkCheck(walk.label, len(got), worst_abs, worst_snr))
    return DeployProof(path.name, against, tuple(checks))


def _judge_call(
    target: str, got: torch.Tensor, want: torch.Tensor, program: torch.Tensor | None, quantized: bool
) -> tuple[Any, bool, str]:
    """One call's logits against the reference's, by the criterion of the module docstring:
    the kernel criterion when the quantized ``program``'s logits are given, else the same file
    (quantized) or the target's float tolerance."""
    from ...parity.metrics import compute_metrics
    from ...parity.tolerances import quantized_tolerance, tolerance_for

    if program is not None:
        own = compute_metrics(program.float(), want.float(), rtol=0.0, atol=0.0).snr_db
        tol = quantized_tolerance(None, own)
        m = tol.judge(got.float(), want.float())
        return m, m.ok, f"{tol.source}: the quantized program is at {own:.1f} dB"
    if quantized:
        m = compute_metrics(got.float(), want.float(), rtol=0.0, atol=0.0)
        return m, m.snr_db >= SAME_FILE_MIN_SNR_DB, f"SNR >= {SAME_FILE_MIN_SNR_DB:.0f} dB"
    tol = tolerance_for(target, want.dtype)
    m = tol.judge(got, want)
    return m, m.ok, tol.source
