"""Teacher-forced proof of a quantized program's file: every ``linear`` judged on the file's own input.

Why: a program with int4 weights and 8-bit per-token activations is chaotic on real weights.
Rounding one activation to the other integer level moves the next layer's input, which rounds
other activations differently, and 30 layers amplify it: on SmolLM2-135M-Instruct a 1e-6
relative change of the input embeddings moves the program's logits to 21 dB against themselves
(the float model stays at 104 dB). A file whose kernels only sum in another order lands there
too, so an end-to-end bound either refuses correct files or is loose enough to let a wrong block
through.

Teacher forcing removes the depth. The file's value of every ``linear`` of the shared program is
read from the file (ONNX Runtime: extra graph outputs; ExecuTorch: a tapped lowering, checked to
compute the file's outputs), and the shared program is run with each of those values substituted
for its own as it goes: each linear then computes, from the file's values before it, what the file
should have. What remains between the two is local and bounded:

- the summation order of one dot product: at most ``gamma_K = K u / (1 - K u)`` (u = 2^-24) of
  ``|a| @ |W|^T`` (the standard bound of a float sum of K products), plus the same budget again
  for the float operations between the taps (norms, attention, rotary embeddings) that produced
  its input: :data:`FLOAT_BUDGET`;
- activations the file rounded to the neighbouring int8 level (its kernel chooses the per-token
  scale with its own arithmetic, or its input differs by the float error above): each moves
  ``y[t, n]`` by ``lsb[t] * |W[n, k]|``; :data:`FLIPS` of them per token are allowed.

A wrong file breaks this bound by orders of magnitude at the layer it is wrong in: a doubled scale
or transposed codes of one block (32 weights) move an output by the block's share of the dot
product, about ``sqrt(32 / K)`` of it, against a bound of a few activation steps of one weight.
The first linear out of bound is named (module path, node, weights); the others are not
consulted, because their inputs came through it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram

from .localize import _program_args

__all__ = [
    "LinearVerdict",
    "ForcedResult",
    "linear_taps",
    "teacher_forced",
    "initial_state",
    "FLIPS",
    "FLOAT_BUDGET",
]

logger = logging.getLogger(__name__)
aten = torch.ops.aten

#: activations a file may round to the neighbouring int8 level, per token and linear
FLIPS = 2
#: float32 rounding budget for the operations between two taps, relative to ``|a| @ |W|^T``
FLOAT_BUDGET = 2.0**-14


@dataclass(frozen=True)
class LinearVerdict:
    """One linear of the file against the program's on the file's own input: ``ratio`` is the
    worst element's ``|file - program| / bound`` (<= 1 passes)."""

    node: str
    module: str
    weights: str
    ratio: float
    max_abs: float

    @property
    def ok(self) -> bool:
        return self.ratio <= 1.0

    def describe(self) -> str:
        where = self.module or self.node
        return (
            f"linear {where} (node {self.node}{', weights ' + self.weights if self.weights else ''}): "
            f"max |diff| {self.max_abs:.3g} on the file's own input, {self.ratio:.3g}x the bound"
        )


@dataclass(frozen=True)
class ForcedResult:
    """Every tapped linear's verdict, in graph order, and the outputs the forced program gives."""

    linears: tuple[LinearVerdict, ...]
    outputs: tuple[torch.Tensor, ...]

    @property
    def first_failure(self) -> LinearVerdict | None:
        return next((v for v in self.linears if not v.ok), None)

    @property
    def worst(self) -> float:
        return max((v.ratio for v in self.linears), default=0.0)


def linear_taps(program: ExportedProgram) -> list[str]:
    """The names of the program's ``linear`` nodes whose output is a tensor: what a file is tapped at."""
    return [
        n.name
        for n in program.graph.nodes
        if n.op == "call_function"
        and n.target is aten.linear.default
        and isinstance(n.meta.get("val"), torch.Tensor)
    ]


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    return path.removeprefix("L['self'].").removeprefix("L__self___")


def _weight_names(program: ExportedProgram, node: torch.fx.Node) -> str:
    sig = program.graph_signature
    names = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
    found: list[str] = []
    stack = [a for a in node.args[1:2] if isinstance(a, torch.fx.Node)]
    while stack:
        a = stack.pop()
        if a.op == "placeholder":
            if a.name in names:
                found.append(names[a.name])
        elif a.op == "call_function" and len(found) < 3:
            stack.extend(x for x in a.args[:1] if isinstance(x, torch.fx.Node))
    return ", ".join(found)


def _gamma(k: int) -> float:
    u = 2.0**-24
    return k * u / (1.0 - k * u)


def _is_dequantize(node: Any) -> bool:
    return (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and "dequantize_affine" in str(node.target)
    )


def _bound(
    a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, step: torch.Tensor | None
) -> torch.Tensor:
    k = a.shape[-1]
    magnitude = torch.nn.functional.linear(a.abs(), w.abs())
    if bias is not None:
        magnitude = magnitude + bias.abs()
    bound = (_gamma(k) + FLOAT_BUDGET) * magnitude
    if step is not None:
        per_channel = w.abs().amax(dim=1)
        tokens = a.shape[:-1]
        if step.numel() == tokens.numel():  # one step per token (torchao keeps or drops the unit dim)
            step = step.reshape(*tokens, 1)
        elif step.numel() % max(tokens.numel(), 1) == 0:  # one per block of the token: the largest
            step = step.reshape(*tokens, -1).abs().amax(dim=-1, keepdim=True)
        bound = bound + FLIPS * step.abs() * per_channel
    return bound + torch.finfo(torch.float32).tiny


def teacher_forced(
    program: ExportedProgram,
    flat_inputs: Sequence[torch.Tensor],
    observed: Mapping[str, torch.Tensor],
    state: MutableMapping[str, torch.Tensor] | None = None,
) -> ForcedResult:
    """Run ``program`` with each node in ``observed`` (a file's values of the program's linears,
    by node name) replaced by the file's value once the program's own value on the file's
    earlier values is judged against it. ``state``: the program's mutable buffers by name (a
    cache inside the program), read as its buffers and updated with what the call writes, so
    that a walk of calls carries the forced cache as the file carries its own."""
    verdicts: list[LinearVerdict] = []
    #: per dequantize node, the step it dequantizes with (read before the interpreter frees it)
    steps: dict[torch.fx.Node, torch.Tensor] = {}

    class _Forced(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            if _is_dequantize(n) and len(n.args) > 2 and isinstance(n.args[2], torch.fx.Node):
                scale = self.env.get(n.args[2])
                if isinstance(scale, torch.Tensor) and any(
                    u.target is aten.linear.default and u.args[0] is n for u in n.users
                ):
                    steps[n] = scale
            result = super().run_node(n)
            seen = observed.get(n.name)
            if n.op != "call_function" or seen is None or not isinstance(result, torch.Tensor):
                return result
            if seen.numel() != result.numel():  # a tap of another node's value: not this linear's
                logger.debug(
                    "%s: the file's value has shape %s, the program's %s",
                    n.name,
                    tuple(seen.shape),
                    tuple(result.shape),
                )
                return result
            seen = seen.reshape(result.shape).to(result.dtype)
            if n.target is aten.linear.default:
                args, _ = self.fetch_args_kwargs_from_env(n)
                a, w = args[0], args[1]
                bias = args[2] if len(args) > 2 and isinstance(args[2], torch.Tensor) else None
                # get, not pop: one dequantized activation may feed several linears (q, k, v)
                step = steps.get(n.args[0]) if isinstance(n.args[0], torch.fx.Node) else None
                diff = (seen - result).abs()
                ratio = diff / _bound(a.float(), w.float(), bias, step)
                worst = float(ratio.max()) if ratio.numel() else 0.0
                verdicts.append(
                    LinearVerdict(
                        n.name,
                        _module_path(n),
                        _weight_names(program, n),
                        worst if math.isfinite(worst) else math.inf,
                        float(diff.max()) if diff.numel() else 0.0,
                    )
                )
            return seen

    with torch.no_grad():
        outs = _Forced(program.graph_module).run(*_program_args(program, flat_inputs, state))
    flat_outs = outs if isinstance(outs, (list, tuple)) else (outs,)
    if state is not None:
        _carry(program, flat_outs, state)
    user = _user_outputs(program, flat_outs)
    return ForcedResult(tuple(verdicts), user)


def _carry(program: ExportedProgram, outs: Sequence[Any], state: MutableMapping[str, torch.Tensor]) -> None:
    """The buffers a call wrote, into ``state`` (a functional program returns them first)."""
    from torch.export.graph_signature import OutputKind

    for out, spec in zip(outs, program.graph_signature.output_specs, strict=False):
        if spec.kind == OutputKind.BUFFER_MUTATION and isinstance(out, torch.Tensor) and spec.target:
            state[spec.target] = out.detach()


def initial_state(program: ExportedProgram) -> dict[str, torch.Tensor]:
    """Fresh copies of the buffers ``program`` writes (a cache before the first call)."""
    written = set(program.graph_signature.buffers_to_mutate.values())
    return {name: program.state_dict.get(name, program.constants.get(name)).clone() for name in written}


def _user_outputs(program: ExportedProgram, outs: Sequence[Any]) -> tuple[torch.Tensor, ...]:
    from torch.export.graph_signature import OutputKind

    kinds = [s.kind for s in program.graph_signature.output_specs]
    return tuple(
        o.detach()
        for o, kind in zip(outs, kinds, strict=False)
        if kind == OutputKind.USER_OUTPUT and isinstance(o, torch.Tensor)
    )
