"""Parity for generation: do the files generate what the model generates?

Two checks per prompt, from the files on disk:

- **free-running**: greedy tokens of each runtime (and of the shared program run eagerly) against
  the reference, transformers' own ``generate`` when the model has one (else the shared
  program); for fp32 they must be identical, and the report names the first step that differs;
- **teacher-forced**: each runtime and the shared program are fed the reference's tokens, and
  the logits of every step are compared (max abs, cosine, top-1 agreement, top-5 overlap,
  KL(eager || runtime)): a divergence is measured where it starts, not after it compounds.
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


@dataclass(frozen=True)
class TeacherForced:
    steps: int
    max_abs: float
    min_cosine: float
    top1_agreement: float
    top5_overlap: float
    max_kl: float

    def within(self, tol: StepTolerance) -> bool:
        return (
            self.max_abs <= tol.max_abs
            and self.min_cosine >= tol.min_cosine
            and self.top1_agreement >= tol.min_top1
            and self.top5_overlap >= tol.min_top5
            and self.max_kl <= tol.max_kl
        )


def teacher_forced_metrics(actual: torch.Tensor, reference: torch.Tensor) -> TeacherForced:
    """Per-step logits ``[steps, vocab]`` of a runtime against the reference's, in float64."""
    if actual.shape != reference.shape or actual.dim() != 2:
        raise InputError(
            f"per-step logits of shape {tuple(actual.shape)} against {tuple(reference.shape)}",
            hint="both must be [steps, vocab]",
        )
    a, r = actual.double(), reference.double()
    steps = a.shape[0]
    if steps == 0:
        return TeacherForced(0, 0.0, 1.0, 1.0, 1.0, 0.0)
    cos = torch.nn.functional.cosine_similarity(a, r, dim=-1)
    top1 = (a.argmax(-1) == r.argmax(-1)).double().mean()
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


@dataclass(frozen=True)
class GenerationReport:
    reference: str  # "transformers.generate" or "eager"
    layout: LlmLayout
    prompts: tuple[PromptParity, ...]
    tolerance: StepTolerance = field(default_factory=StepTolerance)

    @property
    def runtimes(self) -> tuple[str, ...]:
        return tuple(self.prompts[0].tokens) if self.prompts else ()

    @property
    def ok(self) -> bool:
        for p in self.prompts:
            if self.tolerance.tokens_identical and any(d is not None for d in p.first_divergence.values()):
                return False
            if not all(m.within(self.tolerance) for m in p.teacher_forced.values()):
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
            "prompts": [
                {
                    "prompt": list(p.prompt),
                    "reference": list(p.reference),
                    "tokens": {k: list(v) for k, v in p.tokens.items()},
                    "first_divergence": dict(p.first_divergence),
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
            "| prompt | runtime | tokens | first divergence | max abs | min cosine | top-1 | top-5 | max KL |",
            "|---:|---|---|---:|---:|---:|---:|---:|---:|",
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
                lines.append(
                    f"| {i} (len {len(p.prompt)}) | {rt} | {same} | {'-' if d is None else d} | {tf} |"
                )
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
    files on disk. ``model``: the exported decoder; with a ``generate`` method (a transformers
    model) its greedy tokens are the reference, else the shared program's are."""
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
    use_hf = model is not None and callable(getattr(model, "generate", None))
    prompt_list = (
        [prompt_ids(p, layout.vocab) for p in prompts] if prompts else default_prompts(layout, max_new_tokens)
    )
    out = []
    for prompt in prompt_list:
        eager.check_room(len(prompt), max_new_tokens)
        free = {name: s.generate(prompt, max_new_tokens).new_tokens for name, s in sessions.items()}
        reference = _reference_tokens(model, prompt, max_new_tokens) if use_hf and model else free["eager"]
        forced = reference or free["eager"]
        teacher: dict[str, TeacherForced] = {}
        if forced:
            ref_logits = _forced_logits(eager, prompt, forced)
            for name, s in sessions.items():
                if name != "eager":
                    teacher[name] = teacher_forced_metrics(_forced_logits(s, prompt, forced), ref_logits)
        out.append(
            PromptParity(
                prompt=tuple(prompt),
                reference=tuple(reference),
                tokens={k: tuple(v) for k, v in free.items()},
                first_divergence={k: _first_divergence(v, reference) for k, v in free.items()},
                teacher_forced=teacher,
            )
        )
    return GenerationReport(
        "transformers.generate" if use_hf else "eager", layout, tuple(out), tolerance or StepTolerance()
    )
