"""Parity for generation: do the files generate what the model generates?

Two checks per prompt, from the files on disk:

- **free-running**: greedy tokens of each runtime (and of the shared program run eagerly) against
  the reference, transformers' own ``generate`` when the model has one (else the shared
  program); for fp32 they must be identical, and the report names the first step that differs;
- **teacher-forced**: each runtime and the shared program are fed the reference's tokens, and
  the logits of every step are compared (max abs, cosine, top-1 agreement, top-5 overlap,
  KL(eager || runtime)): a divergence is measured where it starts, not after it compounds.

Quantized files (``export_llm(quantize=...)``) are held to the quantized program run eagerly, not
to the float model: the reference is the shared program's own greedy tokens, and a token that
differs counts only where the reference's top-2 margin at that step is larger than the stated
bound (:attr:`StepTolerance.margin_bound`: twice the logits tolerance, the most a runtime within
it can move a margin); the report keeps the step and the margin of every first divergence.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import InputError
from .layout import LlmLayout, read_layout
from .session import DecoderSession, prompt_ids

__all__ = [
    "StepTolerance",
    "TeacherForced",
    "PromptParity",
    "GenerationReport",
    "generation_parity",
    "teacher_forced_metrics",
    "top2_margin",
    "QUANTIZED_TOLERANCE",
    "KERNEL_QUANTIZED_TOLERANCE",
]


@dataclass(frozen=True)
class StepTolerance:
    """What fp32 files must meet against the eager program, per step: worst max abs, worst
    cosine, share of steps with the same top-1, mean top-5 overlap, worst KL."""

    max_abs: float = 1e-3
    min_cosine: float = 0.9999
    min_top1: float = 1.0
    min_top5: float = 0.95
    max_kl: float = 1e-5
    tokens_identical: bool = True
    #: None: every token difference counts. Else a difference (free-running: the first one;
    #: teacher-forced: each top-1 flip) counts only where the reference's top-1 minus top-2 logit
    #: is larger than this: below it, logits within ``max_abs`` of each other can rank either way.
    margin_bound: float | None = None


#: Quantized files against the quantized program run eagerly. Both compute the same int8/int4
#: graph, but each runtime computes its activation scales in its own float order (XNNPACK's qd8
#: kernels, ONNX Runtime's decomposition), so an activation code can land one step away. Measured
#: on the test decoders (logits of magnitude ~0.5): 1.2e-7 to 1.8e-7 for both files; ONNX
#: Runtime's default MatMulNBits accuracy level (4, activations requantized in the kernel) is off
#: by 7e-3 and fails this bound, which is the point. ``margin_bound`` is twice ``max_abs``.
QUANTIZED_TOLERANCE = StepTolerance(
    max_abs=5e-3, min_cosine=0.9999, min_top1=0.0, min_top5=0.9, max_kl=1e-4, margin_bound=1e-2
)

#: An int4 .onnx at ``MatMulNBits`` accuracy level 4 (export_llm's default for quantized decoders)
#: (``ExportOptions(onnx_int4_accuracy_level=4)``: ONNX Runtime quantizes each activation per block
#: of 32 with int8 arithmetic, where the program quantizes it per token): other numerics by
#: design, so held to a looser bound, recorded in the report. Measured on the test decoders: max_abs
#: 7e-3, cosine 0.99994, SNR 39 dB. ``margin_bound`` is twice ``max_abs``.
KERNEL_QUANTIZED_TOLERANCE = StepTolerance(
    max_abs=5e-2, min_cosine=0.999, min_top1=0.0, min_top5=0.8, max_kl=1e-3, margin_bound=1e-1
)


@dataclass(frozen=True)
class TeacherForced:
    steps: int
    max_abs: float
    min_cosine: float
    top1_agreement: float
    top5_overlap: float
    max_kl: float
    #: top-1 flips at steps where the reference's top-2 margin is larger than the bound the
    #: metrics were computed with (None: no bound given)
    unexplained_flips: int | None = None

    def within(self, tol: StepTolerance) -> bool:
        flips_ok = tol.margin_bound is None or self.unexplained_flips == 0
        return (
            self.max_abs <= tol.max_abs
            and self.min_cosine >= tol.min_cosine
            and self.top1_agreement >= tol.min_top1
            and flips_ok
            and self.top5_overlap >= tol.min_top5
            and self.max_kl <= tol.max_kl
        )


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 logit of each row (``[steps, vocab]`` -> ``[steps]``)."""
    if logits.shape[-1] < 2:
        return torch.full(logits.shape[:-1], math.inf)
    top = logits.double().topk(2, -1).values
    return top[..., 0] - top[..., 1]


def teacher_forced_metrics(
    actual: torch.Tensor, reference: torch.Tensor, margin_bound: float | None = None
) -> TeacherForced:
    """Per-step logits ``[steps, vocab]`` of a runtime against the reference's, in float64;
    with ``margin_bound``, the top-1 flips where the reference's margin is above it are counted."""
    if actual.shape != reference.shape or actual.dim() != 2:
        raise InputError(
            f"per-step logits of shape {tuple(actual.shape)} against {tuple(reference.shape)}",
            hint="both must be [steps, vocab]",
        )
    a, r = actual.double(), reference.double()
    steps = a.shape[0]
    if steps == 0:
        return TeacherForced(0, 0.0, 1.0, 1.0, 1.0, 0.0, None if margin_bound is None else 0)
    cos = torch.nn.functional.cosine_similarity(a, r, dim=-1)
    same = a.argmax(-1) == r.argmax(-1)
    top1 = same.double().mean()
    flips = None if margin_bound is None else int(((~same) & (top2_margin(r) > margin_bound)).sum())
    k = min(5, a.shape[-1])
    ta, tr = a.topk(k, -1).indices, r.topk(k, -1).indices
    overlap = torch.tensor([len(set(x.tolist()) & set(y.tolist())) / k for x, y in zip(ta, tr, strict=True)])
    lp_r, lp_a = torch.log_softmax(r, -1), torch.log_softmax(a, -1)
    kl = (lp_r.exp() * (lp_r - lp_a)).sum(-1).clamp_min(0.0)
    return TeacherForced(
        steps=steps,
        max_abs=float((a - r).abs().max()),
        min_cosine=float(cos.min()),
        top1_agreement=float(top1),
        top5_overlap=float(overlap.mean()),
        max_kl=float(kl.max()),
        unexplained_flips=flips,
    )


@dataclass(frozen=True)
class PromptParity:
    """One prompt: the reference's new tokens, each runtime's (``"eager"`` is the shared program),
    the first step where each differs from the reference (None: identical), and the
    teacher-forced metrics of each runtime against the eager program."""

    prompt: tuple[int, ...]
    reference: tuple[int, ...]
    tokens: Mapping[str, tuple[int, ...]]
    first_divergence: Mapping[str, int | None]
    teacher_forced: Mapping[str, TeacherForced]
    #: the eager program's top-2 margin at each runtime's first divergence (None: none, or past
    #: the eager tokens)
    margins: Mapping[str, float | None] = field(default_factory=dict)
    #: why the reference is not the report's (empty: it is)
    note: str = ""

    def counted(self, runtime: str, tol: StepTolerance) -> bool:
        """Whether ``runtime``'s first divergence counts against ``tol``."""
        if self.first_divergence.get(runtime) is None:
            return False
        margin = self.margins.get(runtime)
        return tol.margin_bound is None or margin is None or margin > tol.margin_bound


@dataclass(frozen=True)
class GenerationReport:
    reference: str  # "transformers.generate" or "eager" (always for a quantized program)
    layout: LlmLayout
    prompts: tuple[PromptParity, ...]
    tolerance: StepTolerance = field(default_factory=StepTolerance)
    #: a runtime held to another bound than ``tolerance`` (an int4 .onnx at accuracy level 4)
    tolerances: Mapping[str, StepTolerance] = field(default_factory=dict)

    def tolerance_of(self, runtime: str) -> StepTolerance:
        return self.tolerances.get(runtime, self.tolerance)

    @property
    def runtimes(self) -> tuple[str, ...]:
        return tuple(self.prompts[0].tokens) if self.prompts else ()

    @property
    def ok(self) -> bool:
        for p in self.prompts:
            for rt in p.first_divergence:
                if self.tolerance_of(rt).tokens_identical and p.counted(rt, self.tolerance_of(rt)):
                    return False
            if not all(m.within(self.tolerance_of(rt)) for rt, m in p.teacher_forced.items()):
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        def enc(v: Any) -> Any:
            return v if not isinstance(v, float) or math.isfinite(v) else str(v)

        return {
            "ok": self.ok,
            "reference": self.reference,
            "layout": asdict(self.layout),
            "tolerance": asdict(self.tolerance),
            "tolerances": {k: asdict(v) for k, v in self.tolerances.items()},
            "prompts": [
                {
                    "prompt": list(p.prompt),
                    "reference": list(p.reference),
                    "tokens": {k: list(v) for k, v in p.tokens.items()},
                    "first_divergence": dict(p.first_divergence),
                    "note": p.note,
                    "margin_at_divergence": {k: enc(v) for k, v in p.margins.items()},
                    "teacher_forced": {
                        k: {f: enc(x) for f, x in asdict(m).items()} for k, m in p.teacher_forced.items()
                    },
                }
                for p in self.prompts
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        lines = [
            f"Generation parity ({'ok' if self.ok else 'FAILED'}), reference: {self.reference}",
            "",
            "| prompt | runtime | tokens | first divergence | eager margin there | max abs | min cosine "
            "| top-1 | top-5 | max KL |",
            "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for i, p in enumerate(self.prompts):
            for rt, toks in p.tokens.items():
                m = p.teacher_forced.get(rt)
                d = p.first_divergence.get(rt)
                tf = (
                    f"{m.max_abs:.2e} | {m.min_cosine:.6f} | {m.top1_agreement:.2f} | {m.top5_overlap:.2f} | "
                    f"{m.max_kl:.1e}"
                    if m is not None
                    else "- | - | - | - | -"
                )
                same = "identical" if d is None else f"differ ({len(toks)} tokens)"
                if d is not None and not p.counted(rt, self.tolerance_of(rt)):
                    same += ", within the margin bound"
                margin = p.margins.get(rt)
                mtext = "-" if margin is None else f"{margin:.3g}"
                lines.append(
                    f"| {i} (len {len(p.prompt)}) | {rt} | {same} | {'-' if d is None else d} | {mtext} | {tf} |"
                )
        notes = [f"Prompt {i}: {p.note}." for i, p in enumerate(self.prompts) if p.note]
        if notes:
            lines += ["", *notes]
        if self.tolerance.margin_bound is not None:
            lines += [
                "",
                f"A token difference counts only where eager's top-2 margin is > {self.tolerance.margin_bound}.",
            ]
        for rt, tol in self.tolerances.items():
            lines += [
                "",
                f"{rt}: ONNX Runtime's int8 MatMulNBits kernel (accuracy level 4): held to max abs "
                f"{tol.max_abs:g}, cosine >= {tol.min_cosine:g}, margin bound {tol.margin_bound}.",
            ]
        return "\n".join(lines) + "\n"


def _first_divergence(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    for i in range(max(len(tokens), len(reference))):
        if i >= len(tokens) or i >= len(reference) or tokens[i] != reference[i]:
            return i
    return None


def _forced_logits(session: DecoderSession, prompt: list[int], forced: Sequence[int]) -> torch.Tensor:
    """The logits that predict each of ``forced``: the prefill's last row, then one decode step
    per forced token (the last forced token is not fed)."""
    session.reset()
    rows = [session.step(prompt)[-1]]
    for token in forced[:-1]:
        rows.append(session.step([token])[-1])
    return torch.stack(rows)


def _reference_tokens(model: nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(  # type: ignore[operator]
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, num_beams=1
        )
    return [int(t) for t in out[0, len(prompt) :]]


def _uncached_tokens(
    model: nn.Module, prompt: list[int], max_new_tokens: int, eos: Sequence[int] = ()
) -> list[int]:
    """Greedy tokens from the model's forward over the whole sequence at every step, no cache:
    what the model computes, whatever any cache implementation does. Stops after an
    end-of-sequence id, as ``generate`` and the sessions do."""
    seq = torch.tensor([prompt])
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(input_ids=seq, use_cache=False).logits[0, -1]
            out.append(int(logits.argmax()))
            if out[-1] in eos:
                break
            seq = torch.cat([seq, torch.tensor([[out[-1]]])], dim=1)
    return out


def _hf_reference(
    model: nn.Module, prompt: list[int], max_new_tokens: int, eager: list[int], eos: Sequence[int] = ()
) -> tuple[list[int], str]:
    """transformers.generate's tokens, unless they differ from the shared program's and the
    model's own uncached forward sides with the program: then generate's cache is what departs
    from the model (Gemma2's sliding layers in transformers 5), and the uncached tokens are the
    reference, with a note naming the step where generate left them."""
    hf = _reference_tokens(model, prompt, max_new_tokens)
    if hf == eager:
        return hf, ""
    try:
        uncached = _uncached_tokens(model, prompt, max_new_tokens, eos)
    except (TypeError, ValueError, AttributeError):  # a forward without use_cache or .logits
        return hf, ""
    if uncached == hf:
        return hf, ""
    step = _first_divergence(hf, uncached)
    return uncached, (
        f"transformers.generate left the model's own uncached forward at step {step} "
        f"({hf} vs {uncached}): the reference is the uncached forward"
    )


def default_prompts(layout: LlmLayout, max_new_tokens: int) -> list[list[int]]:
    """Two prompts (a short one and one as long as the window allows with ``max_new_tokens``
    left), seeded: prefill of a few tokens and of many."""
    g = torch.Generator().manual_seed(19)
    longest = max(1, min(layout.max_prompt, layout.max_seq_len - max_new_tokens))
    lengths = sorted({min(3, longest), longest})
    return [torch.randint(0, layout.vocab, (n,), generator=g).tolist() for n in lengths]


def generation_parity(
    res: Any,
    model: nn.Module | None = None,
    *,
    prompts: Sequence[Any] | None = None,
    max_new_tokens: int = 8,
    tolerance: StepTolerance | None = None,
) -> GenerationReport:
    """Free-running and teacher-forced parity of an ``export_llm`` result (``res``), from its
    files on disk (the explicit-cache files and, for a deploy folder, the runner files:
    ``xnnpack:runner`` and ``onnx:genai``, driven by the same loop). ``model``: the exported decoder; with a ``generate`` method (a transformers
    model) its greedy tokens are the reference, else the shared program's are. A quantized
    program is its own reference (the float model computes something else), held to
    :data:`QUANTIZED_TOLERANCE` unless ``tolerance`` is given."""
    from ..exporters.onnx_quant import uses_torchao
    from ..runtimes.eager import EagerRunner

    paths = {t: a.path for t, a in res.artifacts.items()}
    if not paths:
        raise InputError("no artifact to check: every target failed", hint="look at res.errors")
    layout = read_layout(next(iter(paths.values())))
    shared = res.program
    eager = DecoderSession(
        EagerRunner(shared.exported_program, shared.example_args, shared.example_kwargs), layout, "eager"
    )
    sessions = {"eager": eager, **{t: DecoderSession.open(p) for t, p in paths.items()}}
    deploy = getattr(res, "deploy", None)
    if deploy is not None:  # the runner files of the deploy folder, in the same loop
        for key, path in (("xnnpack:runner", deploy.pte), ("onnx:genai", deploy.onnx)):
            if path is not None:
                sessions[key] = DecoderSession.open(path)
    quantized = uses_torchao(shared.exported_program)
    tol = tolerance or (QUANTIZED_TOLERANCE if quantized else StepTolerance())
    tols = {
        name: KERNEL_QUANTIZED_TOLERANCE
        for name, s in sessions.items()
        if tolerance is None and quantized and _kernel_quantized(s)
    }
    use_hf = not quantized and model is not None and callable(getattr(model, "generate", None))
    prompt_list = (
        [prompt_ids(p, layout.vocab) for p in prompts] if prompts else default_prompts(layout, max_new_tokens)
    )
    out = []
    for prompt in prompt_list:
        eager.check_room(len(prompt), max_new_tokens)
        runs = {name: s.generate(prompt, max_new_tokens) for name, s in sessions.items()}
        free = {name: g.new_tokens for name, g in runs.items()}
        eager_margins = top2_margin(runs["eager"].logits).tolist()
        reference, note = (
            _hf_reference(model, prompt, max_new_tokens, free["eager"], layout.eos_token_ids)
            if use_hf and model
            else (free["eager"], "")
        )
        forced = reference or free["eager"]
        teacher: dict[str, TeacherForced] = {}
        if forced:
            ref_logits = _forced_logits(eager, prompt, forced)
            for name, s in sessions.items():
                if name != "eager":
                    teacher[name] = teacher_forced_metrics(
                        _forced_logits(s, prompt, forced), ref_logits, tols.get(name, tol).margin_bound
                    )
        divergence = {k: _first_divergence(v, reference) for k, v in free.items()}
        out.append(
            PromptParity(
                prompt=tuple(prompt),
                reference=tuple(reference),
                tokens={k: tuple(v) for k, v in free.items()},
                first_divergence=divergence,
                teacher_forced=teacher,
                margins={
                    k: (float(eager_margins[d]) if d is not None and d < len(eager_margins) else None)
                    for k, d in divergence.items()
                },
                note=note,
            )
        )
    return GenerationReport("transformers.generate" if use_hf else "eager", layout, tuple(out), tol, tols)


def _kernel_quantized(session: DecoderSession) -> bool:
    """Whether ``session`` runs an .onnx recorded at ``MatMulNBits`` accuracy level 4."""
    from ..exporters.onnx_quant import ACCURACY_LEVEL_ENTRY

    config = getattr(session.runner, "session_config", {})
    return str(config.get(ACCURACY_LEVEL_ENTRY, "0")) == "4"
